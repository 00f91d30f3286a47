"""Every primitive's JVP and VJP rule against central finite differences, in float64, eagerly
(each rule's equations evaluated by the NumPy reference)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from primitive_cases import CASES

import glue
from glue.frontend.transforms.autodiff import JVP, VJP
from glue.ir import PRIMITIVES

# The cases compute in float64, as finite differences need.
pytestmark = pytest.mark.usefixtures("x64")


def test_every_primitive_has_rules_and_a_case():
    assert set(JVP) == set(VJP) == set(PRIMITIVES) == set(CASES)


def _split(case):
    """The case's function of its float arguments only (the others are held fixed)."""
    floats = [i for i, a in enumerate(case.args) if a.dtype.kind == "f"]

    def f(*xs):
        args = list(case.args)
        for i, x in zip(floats, xs):
            args[i] = x
        return case.fn(*args)

    return f, [case.args[i] for i in floats]


def _check_jvp(f, xs, vs, expected):
    out, tangent = glue.jvp(f, xs, vs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(*xs)), rtol=1e-12)
    assert np.asarray(tangent).dtype == np.float64
    np.testing.assert_allclose(np.asarray(tangent), expected, rtol=1e-5, atol=1e-6)


def _finite_difference(f, xs, vs, eps):
    plus = np.asarray(f(*[x + eps * v for x, v in zip(xs, vs)]))
    minus = np.asarray(f(*[x - eps * v for x, v in zip(xs, vs)]))
    return (plus - minus) / (2 * eps)


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
@given(data=st.data())
def test_jvp_and_vjp_match_finite_differences(name, data):
    case = data.draw(CASES[name](smooth=True))
    f, xs = _split(case)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    vs = [rng.normal(size=x.shape) for x in xs]
    expected = _finite_difference(f, xs, vs, case.eps)

    if not case.forward:  # a custom_vjp function: forward mode is refused
        with pytest.raises(glue.GlueError, match="forward mode"):
            glue.jvp(f, xs, vs)
    else:
        _check_jvp(f, xs, vs, expected)
    if not case.reverse:  # a while_loop: reverse mode is refused
        with pytest.raises(glue.GlueError, match="reverse mode"):
            glue.vjp(f, *xs)[1](np.zeros(np.shape(expected)))
        return

    # <ct, J v> computed both ways pins down the whole VJP, one random direction at a time.
    ct = rng.normal(size=np.shape(expected))
    _, pullback = glue.vjp(f, *xs)
    cts = pullback(ct)
    assert [np.shape(c) for c in cts] == [x.shape for x in xs]
    pulled = sum(float(np.sum(np.asarray(c) * v)) for c, v in zip(cts, vs))
    assert pulled == pytest.approx(float(np.sum(ct * expected)), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("x_shape, axis, batch_dims, idx", [
    ((1, 1), 0, 0, [1]),  # hypothesis' failing case: one (clamped) index, an axis after it
    ((3, 2), 0, 0, [-1]),
    ((2, 3, 4), 1, 1, [[2], [-1]]),  # batched, one index per row, a trailing axis
    ((2, 3), 1, 1, [[1], [5]]),  # batched take_along_axis on the last axis
    ((2, 3, 2), 2, 1, [[0], [1]]),  # axis after the batch axes: the scatter_add path
])
def test_gather_vjp_with_one_index(x_shape, axis, batch_dims, idx):
    """gather's transpose against a loop over the output, for one index per batch point (the
    one-hot select form) with operand axes before and after `axis`."""
    from glue.frontend.tracing import bind

    rng = np.random.default_rng(0)
    x, idx = rng.normal(size=x_shape), np.asarray(idx, np.int32)
    out_shape = x_shape[:axis] + idx.shape[batch_dims:] + x_shape[axis + 1:]
    ct = rng.normal(size=out_shape)
    expected = np.zeros(x_shape)
    n_idx = idx.ndim - batch_dims
    for pos in np.ndindex(*out_shape):  # out[pos] = x[..., clip(idx[b, i]), ...]
        k = int(np.clip(idx[pos[:batch_dims] + pos[axis:axis + n_idx]], 0, x_shape[axis] - 1))
        expected[pos[:axis] + (k,) + pos[axis + n_idx:]] += ct[pos]

    out, pullback = glue.vjp(lambda x: bind("gather", x, idx, axis=axis, batch_dims=batch_dims), x)
    assert np.shape(out) == out_shape
    (got,) = pullback(ct)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)
