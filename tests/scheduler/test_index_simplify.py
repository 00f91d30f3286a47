"""Index simplification in kernel IR (glue/scheduler/kernel_ir.py): floor division and modulus of
affine indices, a masked read's index simplified for the dims' ranges under its mask, and bounds
tested over fewer dims. Each rule is checked against the unsimplified index evaluated at every
point of small random domains."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import glue
import glue.numpy as gnp
from glue.scheduler.kernel_ir import (Clamp, Dim, Div, Index, Mod, dim_ranges, floordiv, mod, narrowed,
                                      simplified, simplified_bound)
from glue.testing import check

COEFFS = st.sampled_from([1, 1, 1, 2, 3, 4, 8, 16, 64, -1, -2, 5, 7])
DIVISORS = st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64])


def evaluate(index: Index, extents: tuple[int, ...]) -> np.ndarray:
    """The index at every point of the domain, as the definition says (floor division, floored
    modulus), broadcast over the dims."""
    def dim(k: int) -> np.ndarray:
        shape = [1] * len(extents)
        shape[k] = extents[k]
        return np.arange(extents[k], dtype=np.int64).reshape(shape)

    def atom(a) -> np.ndarray:
        if isinstance(a, Dim):
            return dim(a.k)
        if isinstance(a, Div):
            return evaluate(a.index, extents) // a.divisor
        if isinstance(a, Mod):
            return evaluate(a.index, extents) % a.divisor
        assert isinstance(a, Clamp)
        return np.clip(evaluate(a.index, extents), 0, a.size - 1)

    total = np.full((1,) * len(extents), index.const, dtype=np.int64)
    for a, c in index.terms:
        total = total + atom(a) * c
    return np.broadcast_to(total, extents)


@st.composite
def domains(draw) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))


@st.composite
def indices(draw, extents: tuple[int, ...], depth: int = 2) -> Index:
    """An affine index over the domain's dims, its atoms dims or (to `depth`) floor divisions,
    moduli and clamps of such indices, as reshapes, slices, pads and gathers make them."""
    out = Index((), draw(st.integers(-40, 40)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["dim", "dim", "div", "mod", "clamp"] if depth else ["dim"]))
        if kind == "dim":
            atom = Index.dim(draw(st.integers(0, len(extents) - 1)))
        else:
            inner = draw(indices(extents, depth - 1))
            if kind == "clamp":
                atom = Index.of(Clamp(inner, draw(st.integers(1, 20))))
            else:
                atom = (floordiv if kind == "div" else mod)(inner, draw(DIVISORS), extents)
        out = out + atom * draw(COEFFS)
    return out


@st.composite
def bounds(draw, extents: tuple[int, ...]) -> tuple[Index, int, int]:
    index = draw(indices(extents, depth=1))
    lo = draw(st.integers(-20, 60))
    return index, lo, lo + draw(st.integers(1, 70))


def holds(bound: tuple[Index, int, int], extents: tuple[int, ...]) -> np.ndarray:
    index, lo, hi = bound
    value = evaluate(index, extents)
    return (lo <= value) & (value < hi)


@given(st.data())
def test_floordiv_and_mod_are_exact(data):
    extents = data.draw(domains())
    index = data.draw(indices(extents))
    d = data.draw(DIVISORS)
    expected = evaluate(index, extents)
    np.testing.assert_array_equal(evaluate(floordiv(index, d, extents), extents), expected // d)
    np.testing.assert_array_equal(evaluate(mod(index, d, extents), extents), expected % d)


@given(st.data())
def test_masked_index_is_equal_where_the_mask_holds(data):
    extents = data.draw(domains())
    index = data.draw(indices(extents))
    mask = tuple(data.draw(st.lists(bounds(extents), min_size=1, max_size=2)))
    ok = np.logical_and.reduce([holds(b, extents) for b in mask])
    ranges = narrowed(dim_ranges(extents), mask)
    if ranges is None:
        assert not ok.any()
        return
    points = np.argwhere(ok)
    for k, (lo, hi) in enumerate(ranges):  # every point where the mask holds is within the ranges
        assert ((lo <= points[:, k]) & (points[:, k] <= hi)).all()
    np.testing.assert_array_equal(evaluate(simplified(index, extents, ranges), extents)[ok],
                                  evaluate(index, extents)[ok])


@given(st.data())
def test_simplified_bound_holds_at_the_same_points(data):
    extents = data.draw(domains())
    bound = data.draw(bounds(extents))
    simpler = simplified_bound(bound, dim_ranges(extents))
    expected = holds(bound, extents)
    if simpler is None:
        assert expected.all()
    else:
        np.testing.assert_array_equal(holds(simpler, extents), expected)


def test_examples_of_each_rule():
    i0, i1, i2, i3 = (Index.dim(k) for k in range(4))
    extents = (2, 8, 4, 64)
    # divisible terms leave a division; a division of a division is one division
    assert floordiv(i1 * 256 + i3, 16, extents) == i1 * 16 + Index.of(Div(i3, 16))
    assert floordiv(floordiv(i1 * 3 + i3, 4, extents), 16, extents) == Index.of(Div(i1 * 3 + i3, 64))
    # what is left within one multiple of the divisor: a constant, or that multiple subtracted
    assert floordiv(i1 * 64 + i3 + 128, 64, extents) == i1 + 2
    assert mod(i1 * 64 + i3 + 128, 64, extents) == i3
    assert mod(mod(i1 * 50 + i3, 128, extents), 64, extents) == Index.of(Mod(i1 * 50 + i3, 64))
    # a concatenation's second piece read through a reshape: under its mask the dims of the
    # piece's own layout come back, and i0 is held to 1
    piece = i0 * 64 + i3 + -64
    mask = ((piece, 0, 64),)
    ranges = narrowed(dim_ranges(extents), mask)
    assert ranges[0] == (1, 1)
    assert simplified(mod(floordiv(i1 * 256 + i2 * 64 + piece, 256, extents), 8, extents), extents, ranges) == i1
    assert simplified(mod(i1 * 4 + i2 + i0 + -1, 4, extents), extents, ranges) == i2
    # ... and its test is one of i0 alone; a bound on a division one on what is divided
    assert simplified_bound(mask[0], dim_ranges(extents)) == (i0 + -1, 0, 1)
    assert simplified_bound((floordiv(i3, 16, extents) + -2, 0, 1), dim_ranges(extents)) == (i3, 32, 48)
    assert simplified_bound((i3, 0, 64), dim_ranges(extents)) is None


def _halves(a, b):
    # two halves of the sequence concatenated, then split into heads: the layout the attention
    # tiles' outputs are joined in
    return (gnp.concatenate([a, b], axis=1).reshape(4, 2, 64) + 1.0) * 2.0


def test_concatenated_pieces_read_without_divisions_or_guards():
    a = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    b = -np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    text = glue.jit(_halves, backend="cpu").lower(a, b).as_text("kernels")
    loads = [line for line in text.splitlines() if "load" in line]
    assert loads and not any("//" in line or "%" in line or " if " in line for line in loads), text
    check(_halves, a, b)


@pytest.mark.parametrize("n", [3, 5])
def test_uneven_pieces_keep_their_guards(n):
    # pieces that do not line up with the reshape keep divisions and guarded reads, and are right
    a = np.arange(4 * n, dtype=np.float32).reshape(4, n)
    b = np.ones((4, 8 - n), np.float32)
    check(lambda a, b: gnp.concatenate([a, b], axis=1).reshape(2, 16) * 3.0, a, b)
