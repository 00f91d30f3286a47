"""Every primitive's batching rule against a Python loop over the batch, with random in_axes
(including unmapped arguments) and out_axes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from primitive_cases import CASES

import glue
from glue.frontend.transforms.batching import BATCH
from glue.ir import PRIMITIVES

# The cases compute in float64, as finite differences need.
pytestmark = pytest.mark.usefixtures("x64")


def test_every_primitive_has_a_batching_rule():
    assert set(BATCH) == set(PRIMITIVES)


def _examples(arg, size, rng):
    """`size` variants of `arg` with values from the same domain (permuted, floats rescaled)."""
    out = []
    for b in range(size):
        flat = rng.permutation(arg.reshape(-1)).reshape(arg.shape)
        out.append(flat * (1 + 0.1 * b) if arg.dtype.kind == "f" else flat)
    return out


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
@given(data=st.data())
def test_vmap_matches_a_loop(name, data):
    case = data.draw(CASES[name](smooth=False))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    size = data.draw(st.integers(2, 3))
    in_axes = [data.draw(st.none() | st.integers(-a.ndim - 1, a.ndim)) for a in case.args]
    if all(a is None for a in in_axes):
        in_axes[0] = 0
    per_example = [_examples(a, size, rng) if ax is not None else None for a, ax in zip(case.args, in_axes)]
    batched = [np.stack(ex, axis=ax) if ax is not None else a
               for a, ex, ax in zip(case.args, per_example, in_axes)]

    def example(b):
        return np.asarray(case.fn(*[a if ex is None else ex[b] for a, ex in zip(case.args, per_example)]))

    outs = [example(b) for b in range(size)]
    out_axis = data.draw(st.integers(-outs[0].ndim - 1, outs[0].ndim))
    expected = np.stack(outs, axis=out_axis)
    got = np.asarray(glue.vmap(case.fn, in_axes=tuple(in_axes), out_axes=out_axis)(*batched))
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
