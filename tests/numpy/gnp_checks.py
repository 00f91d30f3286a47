"""Shared by the glue.numpy and glue.nn tests: array strategies, and `check`, which runs a
function eagerly and under `glue.jit(backend="reference")` and compares both with NumPy."""
from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch

BF16 = np.dtype(ml_dtypes.bfloat16)


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 1, max_side: int = 4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arrays(shape, dtype: Any = np.float32, lo: float = -10, hi: float = 10):
    """Arrays of `dtype` (bfloat16 included) with elements in [lo, hi]."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        elements = st.booleans() if dtype.kind == "b" else st.integers(int(lo), int(hi))
        return hnp.arrays(dtype, shape, elements=elements)
    base = np.float16 if dtype == np.float16 else np.float32
    inside = lambda v, toward: float(np.nextafter(base(v), base(toward)) if base(v) != v else base(v))  # noqa: E731
    elements = st.floats(inside(lo, hi), inside(hi, lo), width=16 if base == np.float16 else 32)
    return hnp.arrays(base, shape, elements=elements).map(lambda a: a.astype(dtype))


def wide(x: Any) -> Any:
    """Float arrays in float64, the precision NumPy computes the expected values in."""
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" or x.dtype == BF16 else x


def assert_matches(got: Any, expected: Any, dtype: Any = None, scale: float = 1.0) -> None:
    """`got` equals `expected` within the tolerance of got's dtype; its dtype is `dtype` if given."""
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_matches(g, e, dtype, scale)
        return
    assert isinstance(got, glue.Array), f"expected a glue.Array, got {type(got).__name__}"
    got = np.asarray(got)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), f"dtype {got.dtype} != {np.dtype(dtype)}"
    problem = mismatch(got, np.asarray(expected), dt.from_numpy(got.dtype), scale)
    assert problem is None, problem


def check(fn: Callable[..., Any], reference: Callable[..., Any], *args: Any, dtype: Any = None,
          scale: float = 1.0) -> None:
    """fn(*args), run eagerly and jitted on the reference backend, matches reference(*args)
    computed by NumPy in float64."""
    expected = reference(*(wide(a) for a in args))
    assert_matches(fn(*args), expected, dtype, scale)
    assert_matches(glue.jit(fn, backend="reference")(*args), expected, dtype, scale)


def check_grad(fn: Callable[..., Any], *args: Any, eps: float = 1e-6, jit: bool = True) -> None:
    """glue.grad of sum(fn(*args) * w), for a fixed random w, against central finite differences
    in float64 (x64 on, so float64 stays float64), eagerly and (with `jit`) under glue.jit on the
    reference backend."""
    with glue.config.override(enable_x64=True):
        _check_grad(fn, args, eps, jit)


def _check_grad(fn: Callable[..., Any], args: Any, eps: float, jit: bool) -> None:
    args = [np.asarray(a, np.float64) for a in args]
    out = np.asarray(fn(*args))
    weights = np.random.default_rng(7).uniform(0.5, 1.5, out.shape)
    loss = lambda *xs: glue.numpy.sum(glue.numpy.multiply(fn(*xs), weights))  # noqa: E731
    grad = glue.grad(loss, argnums=tuple(range(len(args))))
    for got in [grad(*args)] + ([glue.jit(grad, backend="reference")(*args)] if jit else []):
        for i, (g, a) in enumerate(zip(got, args)):
            expected = np.zeros_like(a)
            for index in np.ndindex(a.shape):
                up, down = [x.copy() for x in args], [x.copy() for x in args]
                up[i][index] += eps
                down[i][index] -= eps
                expected[index] = (float(loss(*up)) - float(loss(*down))) / (2 * eps)
            np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5, atol=1e-6,
                                       err_msg=f"gradient of argument {i}")
