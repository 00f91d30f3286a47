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
