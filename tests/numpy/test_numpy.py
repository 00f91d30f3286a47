"""glue.numpy against NumPy: elementwise ops and promotion, reductions, creation and shape
functions, each run eagerly and under glue.jit (reference backend), and their error messages."""
from __future__ import annotations

import operator

import numpy as np
import pytest
from gnp_checks import BF16, arrays, assert_matches, check, shapes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
from glue.errors import GlueIndexError, GlueTypeError
from glue.settings import config

HERE = "test_numpy.py"


def broadcastable_pair(dtype=np.float32, lo=-10, hi=10, max_dims=3):
    return hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=max_dims, max_side=4).flatmap(
        lambda s: st.tuples(arrays(s.input_shapes[0], dtype, lo, hi), arrays(s.input_shapes[1], dtype, lo, hi)))


# --- elementwise ----------------------------------------------------------------------------

FLOAT_BINARY = {
    "add": (gnp.add, np.add, operator.add),
    "subtract": (gnp.subtract, np.subtract, operator.sub),
    "multiply": (gnp.multiply, np.multiply, operator.mul),
    "maximum": (gnp.maximum, np.maximum, None),
    "minimum": (gnp.minimum, np.minimum, None),
    "less": (gnp.less, np.less, operator.lt),
    "less_equal": (gnp.less_equal, np.less_equal, operator.le),
    "greater": (gnp.greater, np.greater, operator.gt),
    "greater_equal": (gnp.greater_equal, np.greater_equal, operator.ge),
    "equal": (gnp.equal, np.equal, operator.eq),
    "not_equal": (gnp.not_equal, np.not_equal, operator.ne),
    "logaddexp": (gnp.logaddexp, np.logaddexp, None),
}


@pytest.mark.parametrize("name", sorted(FLOAT_BINARY))
@given(pair=broadcastable_pair())
def test_float_binary_matches_numpy(name, pair):
    fn, ref, op = FLOAT_BINARY[name]
    dtype = np.bool_ if ref in (np.less, np.less_equal, np.greater, np.greater_equal, np.equal,
                                np.not_equal) else np.float32
    check(fn, ref, *pair, dtype=dtype)
    if op is not None:  # the operator on Tracers (inside jit) and on glue.Arrays
        check(op, ref, gnp.asarray(pair[0]), pair[1], dtype=dtype)


# Divisors stay away from zero: NumPy's zero-division results are not part of the contract.
DIVISIONS = {
    "true_divide": (gnp.true_divide, np.true_divide, operator.truediv),
    "floor_divide": (gnp.floor_divide, np.floor_divide, operator.floordiv),
    "remainder": (gnp.remainder, np.remainder, operator.mod),
}


@pytest.mark.parametrize("name", sorted(DIVISIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@given(data=st.data())
def test_division_matches_numpy_signs(name, dtype, data):
    fn, ref, op = DIVISIONS[name]
    x, y = data.draw(broadcastable_pair(dtype, -20, 20))
    y = np.where(np.abs(y) < 1, np.asarray(3, dtype), y).astype(dtype)
    out = np.float32 if name == "true_divide" else dtype
    # float floor_divide may cross an integer boundary against a float64 reference.
    expected = (lambda a, b: ref(a.astype(dtype), b.astype(dtype))) if dtype == np.float32 and \
        name != "true_divide" else ref
    check(fn, expected, x, y, dtype=out)
    check(op, expected, x, gnp.asarray(y), dtype=out)


@pytest.mark.parametrize("fn,ref", [(gnp.floor_divide, np.floor_divide), (gnp.remainder, np.remainder)])
def test_float_floor_division_exact_cases(fn, ref):
    x = np.array([1, -1, 7.5, -7.5, 0.3, 5], np.float32)
    y = np.array([0.1, 0.1, -2, 2, 0.1, -0.5], np.float32)
    assert_matches(fn(x, y), ref(x, y), np.float32)


@pytest.mark.parametrize("ref,fn,op", [(np.bitwise_and, gnp.bitwise_and, operator.and_),
                                       (np.bitwise_or, gnp.bitwise_or, operator.or_),
                                       (np.bitwise_xor, gnp.bitwise_xor, operator.xor)])
@given(pair=broadcastable_pair(np.int32, -100, 100))
def test_bitwise_matches_numpy(ref, fn, op, pair):
    check(fn, ref, *pair, dtype=np.int32)
    check(op, ref, gnp.asarray(pair[0]), pair[1], dtype=np.int32)


@pytest.mark.parametrize("fn,ref", [(gnp.logical_and, np.logical_and), (gnp.logical_or, np.logical_or),
                                    (gnp.logical_xor, np.logical_xor)])
@given(pair=broadcastable_pair(np.int32, -1, 1))
def test_logical_binary(fn, ref, pair):
    check(fn, ref, *pair, dtype=np.bool_)


@given(pair=broadcastable_pair(np.float32, -3, 3), exponent=st.integers(-4, 5))
def test_power(pair, exponent):
    x, y = pair
    base = gnp.asarray(np.where(np.abs(x) < 0.1, 1, x))
    check(lambda a: a ** exponent, lambda a: np.power(a, exponent), base, dtype=np.float32, scale=4)
    check(gnp.power, np.power, np.abs(x) + 0.5, y, dtype=np.float32, scale=4)
    ints = x.astype(np.int32)
    if exponent >= 0:
        check(lambda a: gnp.power(a, exponent), lambda a: np.power(a, exponent), ints, dtype=np.int32)


UNARY = {
    "exp": (gnp.exp, np.exp, -10, 10), "exp2": (gnp.exp2, np.exp2, -10, 10),
    "log": (gnp.log, np.log, 0.01, 100), "log2": (gnp.log2, np.log2, 0.01, 100),
    "log1p": (gnp.log1p, np.log1p, -0.99, 10), "expm1": (gnp.expm1, np.expm1, -5, 5),
    "tanh": (gnp.tanh, np.tanh, -10, 10), "sqrt": (gnp.sqrt, np.sqrt, 0, 100),
    "sin": (gnp.sin, np.sin, -10, 10), "cos": (gnp.cos, np.cos, -10, 10),
    "abs": (gnp.abs, np.abs, -10, 10), "negative": (gnp.negative, np.negative, -10, 10),
    "sign": (gnp.sign, np.sign, -3, 3), "floor": (gnp.floor, np.floor, -10, 10),
    "ceil": (gnp.ceil, np.ceil, -10, 10), "round": (gnp.round, np.round, -10, 10),
    "square": (gnp.square, np.square, -10, 10), "reciprocal": (gnp.reciprocal, np.reciprocal, 0.1, 10),
    "isnan": (gnp.isnan, np.isnan, -10, 10), "isfinite": (gnp.isfinite, np.isfinite, -10, 10),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_matches_numpy(name, data):
    fn, ref, lo, hi = UNARY[name]
    x = data.draw(arrays(shapes(), np.float32, lo, hi))
    check(fn, ref, x)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sqrt", "abs"])
@given(data=st.data())
def test_unary_low_precision_keeps_dtype(name, dtype, data):
    fn, ref, lo, hi = UNARY[name]
    check(fn, ref, data.draw(arrays(shapes(), dtype, lo, hi)), dtype=dtype)


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -2.5], np.float32)
    assert_matches(gnp.isnan(x), np.isnan(x))
    assert_matches(gnp.isinf(x), np.isinf(x))
    assert_matches(gnp.isfinite(x), np.isfinite(x))
    assert_matches(gnp.maximum(x, 0.0), np.maximum(x, 0.0))
    assert_matches(gnp.logaddexp(x, x), np.logaddexp(x, x))
    ints = np.array([1, -2], np.int32)
    assert_matches(gnp.isnan(ints), np.zeros(2, bool))
    assert_matches(gnp.logical_not(ints), np.logical_not(ints))
    assert_matches(gnp.invert(ints), np.invert(ints))
    assert_matches(~gnp.asarray(ints), np.invert(ints))
    assert_matches(-gnp.asarray(ints), -ints)
    assert_matches(abs(gnp.asarray(ints)), np.abs(ints))


@given(data=st.data())
def test_where_and_clip(data):
    s = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3))
    cond = data.draw(arrays(s.input_shapes[0], np.bool_))
    x, y = (data.draw(arrays(shape)) for shape in s.input_shapes[1:])
    check(gnp.where, np.where, cond, x, y, dtype=np.float32)
    check(lambda c, a: gnp.where(c, a, 0.5), lambda c, a: np.where(c, a, 0.5), cond, x, dtype=np.float32)
    lo, hi = sorted(data.draw(st.lists(st.floats(-5, 5, width=32), min_size=2, max_size=2)))
    check(lambda a: gnp.clip(a, lo, hi), lambda a: np.clip(a, lo, hi), x, dtype=np.float32)
    check(lambda a: gnp.clip(a, None, hi), lambda a: np.minimum(a, hi), x)
    check(lambda a, b: gnp.clip(a, b, None), lambda a, b: np.maximum(a, b), x, y)


# --- promotion ------------------------------------------------------------------------------

PROMOTIONS = [
    (np.int32, np.float16, np.float16), (np.float16, BF16, np.float32), (np.int32, np.int64, np.int64),
    (np.bool_, np.int32, np.int32), (BF16, np.float32, np.float32), (np.float32, np.float64, np.float64),
    (np.bool_, np.bool_, np.bool_), (np.uint8, np.int8, np.int16), (np.uint16, np.int16, np.int32),
    (np.uint32, np.int32, np.int64), (np.uint64, np.int8, np.float64), (np.uint8, np.uint32, np.uint32),
    (np.int8, np.float16, np.float16), (np.uint16, BF16, BF16), (np.bool_, np.uint8, np.uint8),
]


@pytest.mark.parametrize("a,b,expected", PROMOTIONS)
def test_array_promotion_follows_the_jax_lattice(a, b, expected, x64):
    x, y = np.ones(3, a), np.ones(3, b)
    assert np.asarray(gnp.add(x, y)).dtype == np.dtype(expected)
    assert np.asarray(gnp.add(y, x)).dtype == np.dtype(expected)
    assert glue.make_ir(gnp.multiply)(x, y).graph.out_types[0].dtype.numpy == np.dtype(expected)


@pytest.mark.parametrize("a,scalar,expected", [
    (np.int32, 1.5, np.float32), (np.float16, 2, np.float16), (BF16, 2.5, BF16), (np.int64, 3, np.int32),
    (np.bool_, 1, np.int32), (np.int32, True, np.int32), (np.uint8, 3, np.uint8), (np.int8, -3, np.int8),
    (np.uint16, 2.5, np.float32), (np.uint32, True, np.uint32),
])
def test_python_scalars_are_weak(a, scalar, expected):
    x = gnp.asarray(np.ones(2, a))
    assert (x + scalar).dtype == np.dtype(expected)
    assert (scalar * x).dtype == np.dtype(expected)


def test_defaults_and_float_functions():
    assert gnp.asarray([1, 2]).dtype == np.int32
    assert gnp.asarray([1.0, 2]).dtype == np.float32
    ints = np.array([1, 2], np.int32)
    assert gnp.exp(ints).dtype == np.float32
    assert (gnp.asarray(ints) / 2).dtype == np.float32
    assert gnp.mean(ints).dtype == np.float32
    assert gnp.sum(np.array([True, False, True])).dtype == np.int32
    assert int(gnp.sum(np.array([True, False, True]))) == 2
    assert gnp.add(np.array([True]), np.array([True])).dtype == np.bool_
    assert gnp.astype(ints, "bfloat16").dtype == BF16
    assert gnp.astype(ints, gnp.float16).dtype == np.float16
    assert gnp.float32(2.0) == 2.0 and gnp.bfloat16(1.0) == 1.0


@pytest.mark.parametrize("target", [np.int32, np.float16, BF16, np.bool_, np.float64, np.int8, np.uint8,
                                    np.int16, np.uint16, np.uint32, np.uint64])
@given(x=arrays(shapes(), np.float32, -100, 100))
@pytest.mark.usefixtures("x64")
def test_astype(target, x):
    def reference(a):  # float -> int truncates and saturates
        a = a.astype(np.float32)
        if np.dtype(target).kind in "iu":
            a = np.clip(np.trunc(a), np.iinfo(target).min, np.iinfo(target).max)
        return a.astype(target)

    check(lambda a: gnp.astype(a, target), reference, x, dtype=target)
    check(lambda a: a.astype(target), reference, gnp.asarray(x), dtype=target)


@pytest.mark.parametrize("wide, narrow", [(np.float64, np.float32), (np.int64, np.int32), (np.uint64, np.uint32)])
def test_64_bit_inputs_narrow_unless_x64(wide, narrow):
    """As in JAX: without x64, 64-bit NumPy inputs, dtypes and scalars become 32-bit ones."""
    x = np.arange(3).astype(wide)
    double = glue.jit(lambda a: a * 2)
    assert np.asarray(double(x)).dtype == narrow
    assert gnp.asarray(x).dtype == narrow and gnp.zeros(2, wide).dtype == narrow
    assert glue.make_ir(double)(x).graph.in_types[0].dtype.numpy == narrow
    assert (gnp.ones(2, narrow) + wide(1)).dtype == narrow
    with config.override(enable_x64=True):
        assert np.asarray(double(x)).dtype == wide
        assert gnp.asarray(x).dtype == wide and gnp.zeros(2, wide).dtype == wide


def test_jax_enable_x64_in_the_environment_keeps_64_bits(monkeypatch):
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    assert np.asarray(glue.jit(lambda a: a + 1)(np.ones(2))).dtype == np.float64
    monkeypatch.setenv("JAX_ENABLE_X64", "0")
    assert np.asarray(glue.jit(lambda a: a + 1)(np.ones(2))).dtype == np.float32


def test_x64_also_widens_the_defaults():
    with config.override(enable_x64=True):
        assert gnp.asarray([1, 2]).dtype == np.int64 and gnp.asarray([1.5]).dtype == np.float64
        assert (gnp.ones(2, np.int32) + 0.5).dtype == np.float64
    assert gnp.asarray([1, 2]).dtype == np.int32 and (gnp.ones(2, np.int32) + 0.5).dtype == np.float32


def test_a_float64_scalar_narrowed_to_float32_holds_the_float32_value():
    third = np.float64(1 / 3)
    got = glue.jit(lambda a: a + third)(np.zeros(1, np.float32))
    assert np.asarray(got)[0] == np.float32(1 / 3)
    assert "0.3333333432674408:f32" in str(glue.make_ir(lambda a: a + third)(np.zeros(1, np.float32)))


def test_asarray_of_values_and_tracers():
    check(lambda a, b: gnp.asarray([a, b, a]), lambda a, b: np.stack([a, b, a]),
          np.ones(2, np.float32), np.zeros(2, np.float32), dtype=np.float32)
    assert isinstance(gnp.asarray(np.ones(3)), glue.Array) and gnp.asarray(np.ones(3)).dtype == np.float32
    assert gnp.asarray(2.5, gnp.float16).dtype == np.float16


# --- reductions -----------------------------------------------------------------------------

@st.composite
def reduction_case(draw, dtype=np.float32, lo=-10, hi=10):
    x = draw(arrays(shapes(), dtype, lo, hi))
    ndim = x.ndim
    axis = draw(st.one_of(
        st.none(),
        st.integers(-ndim, ndim - 1) if ndim else st.none(),
        st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim).map(tuple) if ndim else st.none()))
    return x, axis, draw(st.booleans())


REDUCTIONS = {
    "sum": (gnp.sum, np.sum), "mean": (gnp.mean, np.mean), "max": (gnp.max, np.max),
    "min": (gnp.min, np.min), "prod": (gnp.prod, np.prod), "var": (gnp.var, np.var),
    "std": (gnp.std, np.std), "any": (gnp.any, np.any), "all": (gnp.all, np.all),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@given(data=st.data())
def test_reductions_match_numpy(name, data):
    fn, ref = REDUCTIONS[name]
    lo, hi = (0.5, 1.5) if name == "prod" else (-10, 10)
    x, axis, keepdims = data.draw(reduction_case(np.float32, lo, hi))
    dtype = np.bool_ if name in ("any", "all") else np.float32
    check(lambda a: fn(a, axis, keepdims=keepdims), lambda a: ref(a, axis, keepdims=keepdims), x,
          dtype=dtype, scale=10)
    if name in ("sum", "max", "min", "mean", "prod", "std", "var"):
        check(lambda a: getattr(a, name)(axis=axis, keepdims=keepdims),
              lambda a: ref(a, axis, keepdims=keepdims), gnp.asarray(x), scale=10)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
@given(data=st.data())
def test_integer_reductions(name, data):
    fn, ref = REDUCTIONS[name]
    x, axis, keepdims = data.draw(reduction_case(np.int32, -3, 3))
    dtype = np.float32 if name == "mean" else np.int32
    check(lambda a: fn(a, axis, keepdims=keepdims), lambda a: ref(a, axis, keepdims=keepdims), x, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "var"])
@given(data=st.data())
def test_low_precision_reductions(name, dtype, data):
    fn, ref = REDUCTIONS[name]
    x, axis, keepdims = data.draw(reduction_case(dtype, -4, 4))
    check(lambda a: fn(a, axis, keepdims=keepdims), lambda a: ref(a, axis, keepdims=keepdims), x,
          dtype=dtype, scale=4)


@given(data=st.data(), ddof=st.integers(0, 1))
def test_var_std_ddof(data, ddof):
    x = data.draw(arrays(shapes(min_dims=1, min_side=2)))
    check(lambda a: gnp.var(a, 0, ddof=ddof), lambda a: np.var(a, 0, ddof=ddof), x, scale=10)
    check(lambda a: gnp.std(a, -1, ddof=ddof, keepdims=True),
          lambda a: np.std(a, -1, ddof=ddof, keepdims=True), x, scale=10)


@pytest.mark.parametrize("fn,ref", [(gnp.argmax, np.argmax), (gnp.argmin, np.argmin)])
@given(data=st.data())
def test_arg_reductions(fn, ref, data):
    x = data.draw(arrays(shapes(), np.float32, -3, 3).map(np.round))  # ties: the first index wins
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1)) if x.ndim else None
    keepdims = data.draw(st.booleans())
    check(lambda a: fn(a, axis, keepdims=keepdims), lambda a: ref(a, axis, keepdims=keepdims), x,
          dtype=np.int32)
    check(lambda a: fn(a, axis), lambda a: ref(a, axis), x.astype(np.int32))


# --- creation -------------------------------------------------------------------------------

@given(shape=shapes(), fill=st.floats(-5, 5, width=32))
def test_filled_arrays(shape, fill):
    check(lambda: gnp.zeros(shape), lambda: np.zeros(shape), dtype=np.float32)
    check(lambda: gnp.ones(shape, gnp.int32), lambda: np.ones(shape), dtype=np.int32)
    check(lambda: gnp.full(shape, fill), lambda: np.full(shape, fill), dtype=np.float32)
    check(lambda: gnp.full(shape, 3), lambda: np.full(shape, 3), dtype=np.int32)
    check(lambda: gnp.full(shape, True), lambda: np.full(shape, True), dtype=np.bool_)
    x = np.zeros(shape, np.float16)
    check(gnp.zeros_like, np.zeros_like, x, dtype=np.float16)
    check(gnp.ones_like, np.ones_like, x, dtype=np.float16)
    check(lambda a: gnp.full_like(a, fill, "float32"), lambda a: np.full(shape, fill), x, dtype=np.float32)


@given(start=st.integers(-10, 10), stop=st.integers(-10, 10), step=st.integers(-3, 3).filter(bool))
def test_integer_arange(start, stop, step):
    check(lambda: gnp.arange(start, stop, step), lambda: np.arange(start, stop, step), dtype=np.int32)
    check(lambda: gnp.arange(abs(stop)), lambda: np.arange(abs(stop)), dtype=np.int32)
    check(lambda: gnp.arange(start, stop, dtype=gnp.float32), lambda: np.arange(start, stop), dtype=np.float32)


@given(start=st.floats(-5, 5), length=st.integers(0, 8), step=st.sampled_from([0.5, -0.25, 1.5]))
def test_float_arange(start, length, step):
    stop = start + step * length
    check(lambda: gnp.arange(start, stop, step), lambda: np.arange(start, stop, step), dtype=np.float32, scale=10)


@given(n=st.integers(1, 5), m=st.integers(1, 5), k=st.integers(-5, 5))
def test_eye_tril_triu(n, m, k):
    check(lambda: gnp.eye(n, m, k), lambda: np.eye(n, m, k), dtype=np.float32)
    x = np.arange(2 * n * m, dtype=np.float32).reshape(2, n, m) - 3
    check(lambda a: gnp.tril(a, k), lambda a: np.tril(a, k), x, dtype=np.float32)
    check(lambda a: gnp.triu(a, k), lambda a: np.triu(a, k), x.astype(np.int32), dtype=np.int32)


# --- shapes and axes ------------------------------------------------------------------------

@given(data=st.data())
def test_reshape_transpose_and_friends(data):
    x = data.draw(arrays(shapes(max_dims=4)))
    dims = list(x.shape)
    target = data.draw(st.permutations(dims)).copy() if dims else []
    if target:
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    check(lambda a: gnp.reshape(a, target), lambda a: np.reshape(a, target), x)
    check(lambda a: a.reshape(-1), lambda a: a.reshape(-1), gnp.asarray(x))
    check(gnp.ravel, np.ravel, x)
    perm = data.draw(st.permutations(range(x.ndim)))
    check(lambda a: gnp.transpose(a, perm), lambda a: np.transpose(a, perm), x)
    check(lambda a: a.T, lambda a: a.T, gnp.asarray(x))
    if x.ndim:
        a1, a2 = data.draw(st.integers(-x.ndim, x.ndim - 1)), data.draw(st.integers(-x.ndim, x.ndim - 1))
        check(lambda a: gnp.swapaxes(a, a1, a2), lambda a: np.swapaxes(a, a1, a2), x)
        check(lambda a: a.swapaxes(a1, a2), lambda a: np.swapaxes(a, a1, a2), gnp.asarray(x))
        check(lambda a: gnp.moveaxis(a, a1, a2), lambda a: np.moveaxis(a, a1, a2), x)
        check(lambda a: gnp.flip(a, a1), lambda a: np.flip(a, a1), x)
    check(gnp.flip, np.flip, x)
    new = data.draw(st.integers(-x.ndim - 1, x.ndim))
    check(lambda a: gnp.expand_dims(a, new), lambda a: np.expand_dims(a, new), x)
    check(lambda a: gnp.expand_dims(a, (0, -1)), lambda a: np.expand_dims(a, (0, -1)), x)


@given(data=st.data())
def test_squeeze_and_broadcast_to(data):
    shape = data.draw(st.lists(st.sampled_from([1, 1, 2, 3]), max_size=4).map(tuple))
    x = data.draw(arrays(shape))
    check(gnp.squeeze, np.squeeze, x)
    ones = [i for i, n in enumerate(shape) if n == 1]
    if ones:
        axis = data.draw(st.sampled_from(ones))
        check(lambda a: gnp.squeeze(a, axis), lambda a: np.squeeze(a, axis), x)
        check(lambda a: a.squeeze(axis - len(shape)), lambda a: np.squeeze(a, axis), gnp.asarray(x))
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    target = tuple(lead) + tuple(data.draw(st.sampled_from([n, 3])) if n == 1 else n for n in shape)
    check(lambda a: gnp.broadcast_to(a, target), lambda a: np.broadcast_to(a, target), x)
    assert gnp.broadcast_shapes(shape, target) == np.broadcast_shapes(shape, target)


@given(data=st.data())
def test_concatenate_stack_split(data):
    base = data.draw(shapes(min_dims=1))
    axis = data.draw(st.integers(-len(base), len(base) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    parts = [data.draw(arrays(base[:axis % len(base)] + (n,) + base[axis % len(base) + 1:])) for n in sizes]
    parts[0] = parts[0].astype(np.float16)  # operands promote like any other op
    check(lambda *xs: gnp.concatenate(xs, axis), lambda *xs: np.concatenate(xs, axis), *parts,
          dtype=np.float32 if len(parts) > 1 else np.float16)
    check(lambda *xs: gnp.concatenate(xs, None), lambda *xs: np.concatenate(xs, None), *parts)
    same = [data.draw(arrays(base)) for _ in sizes]
    new = data.draw(st.integers(-len(base) - 1, len(base)))
    check(lambda *xs: gnp.stack(xs, new), lambda *xs: np.stack(xs, new), *same)
    x = np.concatenate(same, axis)
    n = x.shape[axis]
    sections = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    check(lambda a: gnp.split(a, sections, axis), lambda a: np.split(a, sections, axis), x)
    cuts = sorted(data.draw(st.lists(st.integers(-1, n + 1), max_size=3)))
    check(lambda a: gnp.split(a, cuts, axis), lambda a: np.split(a, cuts, axis), x)


@given(data=st.data())
def test_pad(data):
    x = data.draw(arrays(shapes(min_dims=1, max_dims=2)))
    widths = [tuple(data.draw(st.integers(0, 2)) for _ in range(2)) for _ in range(x.ndim)]
    check(lambda a: gnp.pad(a, widths, constant_values=1.5), lambda a: np.pad(a, widths, constant_values=1.5), x)
    check(lambda a: gnp.pad(a, 1), lambda a: np.pad(a, 1), x)


# --- errors ---------------------------------------------------------------------------------

def raises_naming(error, fn, *parts):
    """`fn()` raises `error`, eagerly; the message names every part and this file (the user's line)."""
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    for part in parts + (HERE,):
        assert part in message, f"{part!r} not in {message!r}"


def both_ways(error, fn, args, *parts):
    """fn(*args) raises `error` naming `parts` eagerly and while tracing under jit."""
    raises_naming(error, lambda: fn(*(gnp.asarray(a) for a in args)), *parts)
    raises_naming(error, lambda: glue.jit(fn, backend="reference")(*args), *parts)


def test_shape_errors_name_function_shapes_and_line():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    both_ways(GlueTypeError, lambda x, y: gnp.add(x, y), (a, b), "add", "f32[2,3]", "f32[4,5]")
    both_ways(GlueTypeError, lambda x, y: x + y, (a, b), "add", "f32[2,3]", "f32[4,5]")
    both_ways(GlueTypeError, lambda x, y: gnp.concatenate([x, y], 0), (a, b), "concatenate", "f32[2,3]",
              "f32[4,5]")
    both_ways(GlueTypeError, lambda x: gnp.concatenate([x, x[0]]), (a,), "concatenate", "f32[2,3]", "f32[3]")
    both_ways(GlueTypeError, lambda x: gnp.stack([x, x.T]), (a,), "stack", "f32[2,3]", "f32[3,2]")
    both_ways(GlueTypeError, lambda x: gnp.reshape(x, (4, 2)), (a,), "reshape", "f32[2,3]", "(4, 2)")
    both_ways(GlueTypeError, lambda x: x.reshape(-1, 4), (a,), "reshape", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.reshape(x, (-1, -1)), (a,), "reshape", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.broadcast_to(x, (3, 3)), (a,), "broadcast_to", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.split(x, 2, axis=1), (a,), "split", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.squeeze(x, 0), (a,), "squeeze", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.where(x > 0), (a,), "where", "bool[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.tril(x[0]), (a,), "tril", "f32[3]")


@pytest.mark.parametrize("fn", [gnp.sum, gnp.mean, gnp.max, gnp.argmax, gnp.var, gnp.squeeze, gnp.flip])
def test_bad_axis(fn):
    a = np.ones((2, 3), np.float32)
    both_ways(GlueTypeError, lambda x: fn(x, 2), (a,), fn.__name__, "f32[2,3]", "axis 2", "rank 2")
    both_ways(GlueTypeError, lambda x: fn(x, -3), (a,), fn.__name__, "f32[2,3]", "axis -3")


def test_other_errors():
    a = np.ones((2, 3), np.float32)
    both_ways(GlueTypeError, lambda x: gnp.sum(x, (0, -2)), (a,), "sum", "repeated axis")
    both_ways(GlueTypeError, lambda x: gnp.transpose(x, (0,)), (a,), "transpose", "f32[2,3]")
    both_ways(GlueTypeError, lambda x: gnp.max(x[:0]), (a,), "max", "f32[0,3]")
    raises_naming(GlueTypeError, lambda: glue.jit(gnp.arange, backend="reference")(np.int32(3)), "arange", "i32[]")
    both_ways(GlueTypeError, lambda x: x + 2 ** 40, (a.astype(np.int32),), "astype", "2199023255552")
    raises_naming(GlueTypeError, lambda: gnp.zeros((2, -1)), "full", "negative")
    raises_naming(GlueTypeError, lambda: gnp.arange(0, 3, 0), "arange", "step")
    assert np.isnan(np.asarray(gnp.take(a, [5], axis=1))).all()  # JAX's mode="fill"
