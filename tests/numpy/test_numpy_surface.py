"""The jax.numpy names glue.numpy added for issue 18 against NumPy: eagerly and under jit on the
reference backend for random shapes and values (hypothesis), on every backend against the
reference (`glue.testing.check`), and under grad where they are differentiable."""
import math

import ml_dtypes
import numpy as np
import pytest
from gnp_checks import arrays, assert_matches, check, check_grad, shapes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
import glue.testing
from glue.ir import dtypes as dt

api = pytest.mark.jax_api
X = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)


# --- dtypes ---------------------------------------------------------------------------------

@api("jnp.<dtype names>", "jnp.dtype")
def test_every_glue_dtype_has_its_numpy_name():
    for d in dt.ALL_DTYPES:
        assert getattr(gnp, d.numpy_name) is d.numpy.type
        assert gnp.dtype(getattr(gnp, d.numpy_name)) == d.numpy
    assert gnp.bfloat16 is ml_dtypes.bfloat16 and gnp.bool_ is np.bool_ and gnp.float32 is np.float32
    assert gnp.dtype("float32") == np.float32


@api("jnp.finfo", "jnp.iinfo")
def test_finfo_and_iinfo():
    assert gnp.finfo(gnp.float32).eps == np.finfo(np.float32).eps
    assert gnp.finfo(gnp.bfloat16).eps == 2.0 ** -7 and gnp.finfo("float16").max == 65504
    assert gnp.finfo(gnp.asarray(X)).tiny == np.finfo(np.float32).tiny
    assert gnp.iinfo(gnp.int32).min == -2 ** 31 and gnp.iinfo(np.int64).max == 2 ** 63 - 1
    with pytest.raises(glue.GlueError, match="floating-point"):
        gnp.finfo(gnp.int32)
    with pytest.raises(glue.GlueError, match="integer"):
        gnp.iinfo(gnp.float32)


@api("jnp.result_type", "jnp.issubdtype")
def test_result_type_follows_jax_promotion():
    assert gnp.result_type(gnp.float16, gnp.bfloat16) == np.float32
    assert gnp.result_type(np.int32, 1.0) == np.float32  # a Python float is weak
    assert gnp.result_type(gnp.bfloat16, 2.0) == ml_dtypes.bfloat16
    assert gnp.result_type(gnp.asarray(np.int32([1])), True) == np.int32
    assert gnp.result_type(3) == np.int32 and gnp.result_type(np.bool_) == np.bool_
    assert gnp.issubdtype(gnp.bfloat16, gnp.floating) and gnp.issubdtype(np.float32, gnp.inexact)
    assert gnp.issubdtype(gnp.int32, gnp.integer) and not gnp.issubdtype(gnp.int32, gnp.floating)
    assert gnp.issubdtype(gnp.asarray(X).dtype, gnp.float32)


@api("jnp.ndarray", "jnp.ndim", "jnp.shape", "jnp.size", "jnp.newaxis")
def test_array_type_and_shape_queries():
    a = gnp.asarray(X)
    assert isinstance(a, gnp.ndarray) and not isinstance(X, gnp.ndarray)
    traced = []
    glue.jit(lambda x: traced.append(isinstance(x, gnp.ndarray)) or x, backend="reference")(X)
    assert traced == [True]
    assert gnp.ndim(X) == gnp.ndim(a) == 2 and gnp.ndim(3.0) == 0 and gnp.ndim([[1, 2]]) == 2
    assert gnp.shape(a) == (3, 5) and gnp.size(a) == 15 and gnp.size(a, -1) == 5
    assert a[:, gnp.newaxis].shape == (3, 1, 5)


# --- scans ----------------------------------------------------------------------------------

@api("jnp.cumsum", "jnp.cumprod")
@given(data=st.data())
def test_cumulative_sums_and_products(data):
    x = data.draw(arrays(shapes(min_dims=1, max_side=20), lo=-2, hi=2))
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    with glue.config.override(enable_x64=True):  # the drawn float64 arrays stay float64
        check(lambda a: gnp.cumsum(a, axis), lambda a: np.cumsum(a, axis), x, scale=4)
        # factors near 1, so that a product over every element (axis None) stays within float32.
        # Each step rounds once, all the same way for equal factors: n steps drift up to n
        # half-ulps (2^-24 in float32), and the float32 tolerance (1e-5) is about 168 of them.
        near = min(1.2, math.exp(60 / x.size)) if x.size else 1.2
        steps = x.size if axis is None else x.shape[axis]
        check(lambda a: gnp.cumprod(a, axis), lambda a: np.cumprod(a, axis), np.clip(x, 1 / near, near),
              scale=max(4, steps / 128))
    ints = data.draw(arrays(x.shape, np.int32, -3, 3))
    check(lambda a: gnp.cumsum(a, axis), lambda a: np.cumsum(a, axis).astype(np.int32), ints)
    check(lambda a: gnp.cumsum(a, axis), lambda a: np.cumsum(a, axis).astype(np.int32), ints > 0,
          dtype=np.int32)


@api("jnp.cumsum", "jnp.cumprod")
@pytest.mark.parametrize("n", [1, 5, 130])  # 130: past the contraction, a scan
def test_cumulative_ops_on_every_backend_and_under_grad(n):
    x = np.random.default_rng(n).uniform(0.5, 1.5, (3, n)).astype(np.float32)
    glue.testing.check(lambda a: (gnp.cumsum(a, 1), gnp.cumprod(a[:, :20], 1), gnp.cumsum(a, 0),
                                  gnp.cumsum(a.astype(np.int32), 1)), x)
    check_grad(lambda a: gnp.cumsum(a, 1), x[:1, :])
    check_grad(lambda a: gnp.cumprod(a, 1), x[:, :6])


@api("jnp.diff")
@given(data=st.data())
def test_diff(data):
    x = data.draw(arrays(shapes(min_dims=1, max_side=6)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = data.draw(st.integers(0, 3))
    check(lambda a: gnp.diff(a, n, axis), lambda a: np.diff(a, n, axis), x)
    check(lambda a: gnp.diff(a, 1, axis, prepend=0.0, append=1.0),
          lambda a: np.diff(a, 1, axis, prepend=0.0, append=1.0), x)
    check(lambda a: gnp.diff(a, 1, axis), lambda a: np.diff(a, 1, axis), x > 0)


# --- sorting --------------------------------------------------------------------------------

def _with_specials(draw, shape):
    x = draw(arrays(shape, lo=-3, hi=3)).round(0)  # ties are common
    mask = draw(hnp.arrays(np.int8, shape, elements=st.integers(0, 5)))
    return np.where(mask == 0, np.nan, np.where(mask == 1, -0.0, x)).astype(np.float32)


@api("jnp.sort", "jnp.argsort")
@given(data=st.data())
def test_sort_and_argsort_follow_numpy_and_are_stable(data):
    x = _with_specials(data.draw, data.draw(shapes(min_dims=1, max_side=9)))
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    check(lambda a: gnp.sort(a, axis), lambda a: np.sort(a, axis), x)
    want = np.argsort(x, axis, kind="stable").astype(np.int32)
    assert_matches(gnp.argsort(x, axis), want)
    assert_matches(glue.jit(lambda a: gnp.argsort(a, axis), backend="reference")(x), want)
    ints = data.draw(arrays(x.shape, np.int32, -3, 3))
    assert_matches(gnp.argsort(ints, axis), np.argsort(ints, axis, kind="stable").astype(np.int32))
    assert_matches(gnp.sort(ints > 0, axis), np.sort(ints > 0, axis))


@api("jnp.sort", "jnp.argsort")
@given(data=st.data())
def test_descending_sorts_reverse_the_order_and_keep_ties_in_place(data):
    x = _with_specials(data.draw, (data.draw(st.integers(1, 12)),))
    assert_matches(gnp.sort(x, descending=True), np.sort(x)[::-1])
    # JAX's stable descending argsort: ties keep their original order
    want = np.argsort(-np.nan_to_num(x, nan=np.inf), kind="stable").astype(np.int32)
    nans = np.isnan(x)
    want = np.concatenate([np.flatnonzero(nans), want[~nans[want]]]).astype(np.int32)
    assert_matches(gnp.argsort(x, descending=True), want)


@api("jnp.sort", "jnp.argsort")
def test_sort_on_every_backend_and_under_grad():
    x = np.random.default_rng(1).permutation(40).reshape(4, 10).astype(np.float32)
    glue.testing.check(lambda a: (gnp.sort(a), gnp.argsort(a, 0), gnp.sort(a, None)), x)
    check_grad(lambda a: gnp.sort(a, -1), x[:2, :7] / 10)  # distinct values: a permutation
    with pytest.raises(glue.GlueError, match="kind"):
        gnp.sort(x, kind="quicksort")


@api("jnp.searchsorted")
@given(data=st.data())
def test_searchsorted(data):
    a = np.sort(_with_specials(data.draw, (data.draw(st.integers(0, 17)),)))
    v = _with_specials(data.draw, data.draw(shapes(max_dims=2)))
    for side in ("left", "right"):
        want = np.searchsorted(a, v, side).astype(np.int32)
        assert_matches(gnp.searchsorted(a, v, side), want)
        assert_matches(glue.jit(lambda s, t: gnp.searchsorted(s, t, side), backend="reference")(a, v), want)
    order = np.random.default_rng(0).permutation(a.size)
    assert_matches(gnp.searchsorted(a[order], v, sorter=np.argsort(a[order], kind="stable")),
                   np.searchsorted(a, v).astype(np.int32))


@api("jnp.searchsorted")
def test_searchsorted_on_every_backend():
    a = np.linspace(-2, 2, 11).astype(np.float32)
    glue.testing.check(lambda s, t: gnp.searchsorted(s, t, "right"), a, X)


# --- linear algebra -------------------------------------------------------------------------

_NORMS = [None, 2, 1, np.inf, -np.inf, 0, 3, 0.5]


@api("jnp.linalg.norm")
@given(data=st.data())
def test_vector_and_matrix_norms(data):
    x = data.draw(arrays(shapes(min_dims=1, max_dims=3, max_side=5), lo=-3, hi=3))
    ord_ = data.draw(st.sampled_from(_NORMS))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check(lambda a: gnp.linalg.norm(a, ord_, axis), lambda a: np.linalg.norm(a, ord_, axis), x, scale=4)
    check(lambda a: gnp.linalg.norm(a, keepdims=True), lambda a: np.linalg.norm(a, keepdims=True), x)
    if x.ndim >= 2:
        matrix_ord = data.draw(st.sampled_from([None, "fro", 1, -1, np.inf, -np.inf]))
        check(lambda a: gnp.linalg.norm(a, matrix_ord, (0, -1)),
              lambda a: np.linalg.norm(a, matrix_ord, (0, -1)), x, scale=4)


@api("jnp.linalg.norm")
def test_norms_on_every_backend_and_under_grad():
    glue.testing.check(lambda a: (gnp.linalg.norm(a), gnp.linalg.norm(a, 1, 0), gnp.linalg.norm(a, "fro", (0, 1))), X)
    check_grad(lambda a: gnp.linalg.norm(a, axis=1), X)
    check_grad(lambda a: gnp.linalg.norm(a, 3, axis=0), X)
    with pytest.raises(glue.GlueError, match="decomposition"):
        gnp.linalg.norm(X, 2)  # the spectral norm


@api("jnp.outer", "jnp.tensordot")
@given(data=st.data())
def test_outer_and_tensordot(data):
    a, b = data.draw(arrays(shapes(max_side=3))), data.draw(arrays(shapes(max_side=3)))
    check(gnp.outer, np.outer, a, b)
    x = data.draw(arrays((2, 3, 4)))
    y = data.draw(arrays((3, 4, 2)))
    check(lambda p, q: gnp.tensordot(p, q, 2), lambda p, q: np.tensordot(p, q, 2), x, y)
    check(lambda p, q: gnp.tensordot(p, q, ([0, 2], [2, 1])), lambda p, q: np.tensordot(p, q, ([0, 2], [2, 1])), x, y)
    check(lambda p, q: gnp.tensordot(p, q, 0), lambda p, q: np.tensordot(p, q, 0), x[0], y[0])


@api("jnp.outer", "jnp.tensordot")
def test_contractions_on_every_backend_and_under_grad():
    glue.testing.check(lambda a, b: (gnp.outer(a, b), gnp.tensordot(a, b.T, 1)), X, X)
    check_grad(lambda a, b: gnp.tensordot(a, b, ([1], [1])), X[:2], X[:2])
    with pytest.raises(glue.GlueError, match="name 1 and 2 axes"):
        gnp.tensordot(X, X, ([0], [0, 1]))
    with pytest.raises(glue.GlueError, match=r"axis 1 of a \(size 5\) does not match axis 0 of b \(size 3\)"):
        gnp.tensordot(X, X, ([1], [0]))


# --- building arrays ------------------------------------------------------------------------

@api("jnp.diag", "jnp.diagonal", "jnp.trace", "jnp.tri")
@given(data=st.data())
def test_diagonals_and_triangles(data):
    k = data.draw(st.integers(-3, 3))
    v = data.draw(arrays(shapes(1, 1, max_side=4)))
    m = data.draw(arrays(shapes(2, 3, max_side=4)))
    check(lambda a: gnp.diag(a, k), lambda a: np.diag(a, k), v)
    check(lambda a: gnp.diag(a, k), lambda a: np.diag(a, k), m[0] if m.ndim == 3 else m)
    check(lambda a: gnp.diagonal(a, k, -1, 0), lambda a: np.diagonal(a, k, -1, 0), m)
    check(lambda a: gnp.trace(a, k), lambda a: np.trace(a, k), m)
    n, mm = data.draw(st.integers(0, 4)), data.draw(st.none() | st.integers(0, 4))
    assert_matches(gnp.tri(n, mm, k), np.tri(n, mm, k, np.float32))
    assert_matches(gnp.tri(n, mm, k, dtype=gnp.int32), np.tri(n, mm, k, np.int32))


@api("jnp.hstack", "jnp.vstack", "jnp.dstack", "jnp.column_stack", "jnp.atleast_1d", "jnp.atleast_2d",
     "jnp.atleast_3d")
@given(data=st.data())
def test_stacking_and_rank_promotion(data):
    shape = data.draw(shapes(max_dims=3, max_side=3))
    xs = [data.draw(arrays(shape)) for _ in range(data.draw(st.integers(1, 3)))]
    for name in ("hstack", "vstack", "dstack"):
        check(lambda *a: getattr(gnp, name)(a), lambda *a: getattr(np, name)(a), *xs)
    if len(shape) <= 2:
        check(lambda *a: gnp.column_stack(a), lambda *a: np.column_stack(a), *xs)
    for name in ("atleast_1d", "atleast_2d", "atleast_3d"):
        check(getattr(gnp, name), getattr(np, name), xs[0])
        if len(xs) > 1:
            check(lambda *a: getattr(gnp, name)(*a), lambda *a: list(getattr(np, name)(*a)), *xs)


@api("jnp.tile", "jnp.repeat")
@given(data=st.data())
def test_tile_and_repeat(data):
    x = data.draw(arrays(shapes(max_side=3)))
    reps = data.draw(st.integers(0, 3) | st.lists(st.integers(0, 3), min_size=1, max_size=4).map(tuple))
    check(lambda a: gnp.tile(a, reps), lambda a: np.tile(a, reps), x)
    axis = data.draw(st.none() | st.integers(-max(x.ndim, 1), max(x.ndim, 1) - 1)) if x.ndim else None
    n = x.size if axis is None else x.shape[axis]
    count = data.draw(st.integers(0, 3) | st.lists(st.integers(0, 3), min_size=n, max_size=n))
    check(lambda a: gnp.repeat(a, count, axis), lambda a: np.repeat(a, count, axis), x)


@api("jnp.repeat")
def test_repeat_with_traced_counts_needs_a_total_length():
    x = np.float32([1, 2, 3])
    f = glue.jit(lambda a, r: gnp.repeat(a, r, total_repeat_length=7), backend="reference")
    assert_matches(f(x, np.int32([2, 0, 3])), np.float32([1, 1, 3, 3, 3, 3, 3]))  # the last repeats
    assert_matches(f(x, np.int32([3, 3, 3])), np.float32([1, 1, 1, 2, 2, 2, 3]))  # the rest is cut
    with pytest.raises(glue.GlueError, match="total_repeat_length"):
        glue.jit(lambda a, r: gnp.repeat(a, r), backend="reference")(x, np.int32([1, 1, 1]))


@api("jnp.roll")
@given(data=st.data())
def test_roll(data):
    x = data.draw(arrays(shapes(min_dims=1, max_side=5)))
    shift = data.draw(st.integers(-7, 7))
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    check(lambda a: gnp.roll(a, shift, axis), lambda a: np.roll(a, shift, axis), x)
    traced = glue.jit(lambda a, s: gnp.roll(a, s, axis), backend="reference")(x, np.int32(shift))
    assert_matches(traced, np.roll(x, shift, axis))
    if x.ndim >= 2:
        check(lambda a: gnp.roll(a, (shift, 1), (0, -1)), lambda a: np.roll(a, (shift, 1), (0, -1)), x)


@api("jnp.array_split")
@given(data=st.data())
def test_array_split(data):
    x = data.draw(arrays(shapes(min_dims=1, max_side=7)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    sections = data.draw(st.integers(1, 8))
    check(lambda a: gnp.array_split(a, sections, axis), lambda a: np.array_split(a, sections, axis), x)


@api("jnp.pad")
@given(data=st.data(), mode=st.sampled_from(["constant", "edge", "reflect", "symmetric", "wrap"]))
def test_pad_modes(data, mode):
    x = data.draw(arrays(shapes(min_dims=1, max_dims=2, max_side=4)))
    widths = [tuple(data.draw(st.integers(0, 9)) for _ in range(2)) for _ in range(x.ndim)]
    check(lambda a: gnp.pad(a, widths, mode), lambda a: np.pad(a, widths, mode), x)
    check(lambda a: gnp.pad(a, 2, mode), lambda a: np.pad(a, 2, mode), x)


@api("jnp.pad")
def test_pad_on_every_backend_and_under_grad():
    glue.testing.check(lambda a: [gnp.pad(a, ((1, 2), (3, 0)), m) for m in ("edge", "reflect", "symmetric", "wrap")], X)
    check_grad(lambda a: gnp.pad(a, ((1, 2), (5, 0)), "reflect"), X[:2, :3])
    with pytest.raises(glue.GlueError, match="mode 'median'"):
        gnp.pad(X, 1, "median")


@api("jnp.linspace")
@given(start=st.floats(-5, 5), stop=st.floats(-5, 5), num=st.integers(0, 9), endpoint=st.booleans())
def test_linspace(start, stop, num, endpoint):
    check(lambda: gnp.linspace(start, stop, num, endpoint),
          lambda: np.linspace(start, stop, num, endpoint).astype(np.float32))
    out, step = gnp.linspace(start, stop, num, endpoint, retstep=True)
    _, want_step = np.linspace(start, stop, num, endpoint, retstep=True)
    np.testing.assert_allclose(float(step), want_step, rtol=1e-6, atol=1e-6)
    assert_matches(gnp.linspace(-3, 7, num, dtype=gnp.int32), np.linspace(-3, 7, num, dtype=np.int32))


@api("jnp.linspace")
def test_linspace_of_array_bounds_along_an_axis():
    lo, hi = np.float32([0, 1]), np.float32([[2, 3], [4, 5], [6, 7]])
    check(lambda a, b: gnp.linspace(a, b, 4, axis=-1), lambda a, b: np.linspace(a, b, 4, axis=-1), lo, hi)
    glue.testing.check(lambda a, b: gnp.linspace(a, b, 5, axis=1), lo, hi)


@api("jnp.meshgrid")
@given(data=st.data(), indexing=st.sampled_from(["xy", "ij"]), sparse=st.booleans())
def test_meshgrid(data, indexing, sparse):
    xs = [data.draw(arrays((data.draw(st.integers(1, 4)),))) for _ in range(data.draw(st.integers(1, 3)))]
    check(lambda *a: gnp.meshgrid(*a, indexing=indexing, sparse=sparse),
          lambda *a: np.meshgrid(*a, indexing=indexing, sparse=sparse), *xs)


# --- elementwise ----------------------------------------------------------------------------

_SPECIAL = st.sampled_from([0.0, -0.0, 1.0, 1.0 + 1e-6, 1e-9, np.inf, -np.inf, np.nan, 3.0])


@api("jnp.isclose", "jnp.allclose")
@given(a=hnp.arrays(np.float32, 5, elements=_SPECIAL), b=hnp.arrays(np.float32, 5, elements=_SPECIAL),
       equal_nan=st.booleans())
def test_isclose_and_allclose(a, b, equal_nan):
    assert_matches(gnp.isclose(a, b, equal_nan=equal_nan), np.isclose(a, b, equal_nan=equal_nan))
    assert_matches(gnp.isclose(a, b, 0.1, 0.5), np.isclose(a, b, 0.1, 0.5))
    assert bool(gnp.allclose(a, b, equal_nan=equal_nan)) == np.allclose(a, b, equal_nan=equal_nan)
    assert bool(gnp.allclose(a, a, equal_nan=True))
    glue.testing.check(lambda p, q: gnp.isclose(p, q, equal_nan=equal_nan), a, b)


@api("jnp.nan_to_num")
@given(x=hnp.arrays(np.float32, 6, elements=_SPECIAL))
def test_nan_to_num(x):
    f32 = np.finfo(np.float32)
    check(gnp.nan_to_num, lambda a: np.nan_to_num(a, posinf=f32.max, neginf=f32.min), x)
    check(lambda a: gnp.nan_to_num(a, nan=1.0, posinf=2.0, neginf=-2.0),
          lambda a: np.nan_to_num(a, nan=1.0, posinf=2.0, neginf=-2.0), x)
    assert_matches(gnp.nan_to_num(x.astype(ml_dtypes.bfloat16)),
                   np.nan_to_num(x.astype(np.float64), posinf=3.3895314e38, neginf=-3.3895314e38))


@api("jnp.round")
@given(x=arrays(shapes(), lo=-100, hi=100), decimals=st.integers(0, 3))
def test_round_to_decimals(x, decimals):
    # NumPy (and jnp) scale by 10**decimals in the input's own float32: at a tie there
    # (66.3085 -> 66308.5) float64 rounds the other way, so the expected value is float32's
    check(lambda a: gnp.round(a, decimals), lambda a: np.round(a.astype(np.float32), decimals), x)
    assert_matches(gnp.round(x.astype(np.int32)), x.astype(np.int32))


# --- reductions with where= and initial= ----------------------------------------------------

@api("jnp.sum(where=)", "jnp.mean(where=)", "jnp.max(where=, initial=)", "jnp.min(where=, initial=)")
@given(data=st.data())
def test_reductions_with_a_mask_and_an_initial_value(data):
    x = data.draw(arrays(shapes(min_dims=1, max_side=4)))
    mask = data.draw(hnp.arrays(np.bool_, x.shape[-1:]))  # broadcasts along the rows
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    full_mask = np.broadcast_to(mask, x.shape)
    check(lambda a: gnp.sum(a, axis, where=mask), lambda a: np.sum(a, axis, where=full_mask), x)
    # a product of up to 256 elements of [-10, 10] overflows float32 (not float64, the reference's):
    # elements of [-1, 1] keep it finite
    check(lambda a: gnp.prod(a, axis, where=mask, initial=2.0), lambda a: np.prod(a, axis, where=full_mask, initial=2.0),
          x / np.float32(10))
    check(lambda a: gnp.max(a, axis, where=mask, initial=-1.0),
          lambda a: np.max(a, axis, where=full_mask, initial=-1.0), x)
    check(lambda a: gnp.min(a, axis, initial=0.5), lambda a: np.min(a, axis, initial=0.5), x)
    with np.errstate(all="ignore"):  # rows the mask empties are 0 / 0
        want = np.sum(np.where(full_mask, x, 0.0), axis) / np.sum(full_mask, axis)
    assert_matches(gnp.mean(x, axis, where=mask), want)
    if full_mask.any(axis=axis).all():
        check(lambda a: gnp.var(a, axis, where=mask), lambda a: np.var(a, axis, where=full_mask), x)


@api("jnp.max(where=, initial=)")
def test_masked_reductions_on_every_backend_under_grad_and_on_empty_axes():
    mask = X > 0
    glue.testing.check(lambda a, m: (gnp.sum(a, 1, where=m), gnp.mean(a, 0, where=m),
                                     gnp.max(a, 1, where=m, initial=-5.0)), X, mask)
    check_grad(lambda a: gnp.mean(a, 1, where=mask), X)
    assert_matches(gnp.max(X[:, :0], 1, initial=3.0), np.full(3, 3.0, np.float32))
    with pytest.raises(glue.GlueError, match="initial"):
        gnp.max(X, where=mask)


# --- out-of-range gathers -------------------------------------------------------------------

@api("jnp.take_along_axis", "jnp.take")
def test_out_of_range_gathers_fill_as_jax_does():
    idx = np.int32([[0, 5, -1, -6]])
    want = np.float32([[X[0, 0], np.nan, X[0, 4], np.nan]])
    for f in (lambda a, i: gnp.take_along_axis(a, i, 1), glue.jit(lambda a, i: gnp.take_along_axis(a, i, 1))):
        assert_matches(f(X[:1], idx), want)
    assert_matches(gnp.take_along_axis(X[:1], idx, 1, mode="clip"), X[:1, [0, 4, 4, 0]])
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert_matches(gnp.take_along_axis(ints, np.int32([[3], [-4]]), 1), np.int32([[-2 ** 31], [-2 ** 31]]))
    assert_matches(gnp.take_along_axis(ints > 2, np.int32([[7]]), 1), np.array([[True], [True]]))
    assert_matches(gnp.take(X, np.int32([1, 7]), 1, fill_value=-1.0), np.stack([X[:, 1], np.full(3, -1.0)], 1))
    traced = glue.jit(lambda a, i: gnp.take(a, i, 0))(X, np.int32([2, 3, -3]))
    assert_matches(traced, np.stack([X[2], np.full(5, np.nan), X[0]]))
    glue.testing.check(lambda a, i: gnp.take_along_axis(a, i, 1), X[:1], idx)
    check_grad(lambda a: gnp.take_along_axis(a, np.int32([[0, -1, 2]]), 1), X[:1])
