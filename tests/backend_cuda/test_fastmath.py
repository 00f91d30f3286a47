"""The GPU's float32 exp, tanh and logistic (codegen/fastmath.py) on a GPU (marked `cuda`): a
sweep of a million points and the special values, each result within a few ulp of the float64
result rounded to float32. A result below the smallest normal float32 may be flushed to zero."""
from __future__ import annotations

import numpy as np
import pytest

import glue
import glue.nn
import glue.numpy as gnp
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch
from tests.codegen.test_mathlib import REFERENCES

pytestmark = pytest.mark.cuda
TINY = np.finfo(np.float32).tiny


# function -> (glue function, float64 reference, ulps allowed)
FUNCTIONS = {
    "exp": (gnp.exp, REFERENCES["exp"], 3),
    "tanh": (gnp.tanh, REFERENCES["tanh"], 3),
    "logistic": (glue.nn.sigmoid, REFERENCES["logistic"], 4),
}


def _sweep() -> np.ndarray:
    dense = np.linspace(-30, 30, 600_001)
    wide = np.concatenate([np.geomspace(1e-30, 120, 200_000), -np.geomspace(1e-30, 120, 200_000)])
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.55, -0.55, 88.7, -87.3, -103.9, 1e-45]
    return np.concatenate([dense, wide, special]).astype(np.float32)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_float32_functions_are_within_a_few_ulp(name):
    fn, reference, ulps = FUNCTIONS[name]
    x = _sweep()
    with np.errstate(over="ignore"):
        want = reference(x.astype(np.float64)).astype(np.float32)
    got = np.asarray(glue.jit(fn, backend="cuda")(x))
    assert np.array_equal(np.isnan(got), np.isnan(want)), x[np.isnan(got) != np.isnan(want)][:5]
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True)
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    error = np.abs(g - w) / np.spacing(np.abs(want[finite]))
    error[np.abs(w) < TINY] = np.abs(g - w)[np.abs(w) < TINY] / TINY  # flushed subnormals are fine
    worst = int(np.argmax(error))
    assert error[worst] <= ulps, f"{name}({x[finite][worst]!r}) = {g[worst]!r}, want {w[worst]!r}: {error[worst]:.2f} ulp"


@pytest.mark.parametrize("dtype", [dt.float32, dt.bfloat16])
def test_gelu_matches_the_tanh_formula(dtype):
    """float32 computes gelu's tanh form as written, 16-bit floats as x * sigmoid(2u)."""
    x = np.linspace(-12, 12, 100_001).astype(dtype.numpy)
    got = np.asarray(glue.jit(glue.nn.gelu, backend="cuda")(x)).astype(np.float64)
    z = x.astype(np.float64)
    want = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    assert mismatch(got, want, dtype) is None
