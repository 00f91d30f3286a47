"""Hand-checked cases for the NumPy implementation of each primitive, above all its conventions:
integer division by zero, float -> int saturation, rounding, gather clamping and scatter_add."""
import math

import ml_dtypes
import numpy as np
import pytest

from glue.ir import PRIMITIVES
from glue.ir import dtypes as dt
from glue.reference import IMPLS

bf16 = ml_dtypes.bfloat16


def run(name, *args, **params):
    return IMPLS[name](*[np.asarray(a) for a in args], **params)


def same(actual, expected, dtype=None):
    actual = np.asarray(actual)
    if dtype is not None:
        assert actual.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(actual.astype(np.float64) if actual.dtype == bf16 else actual, expected)


def test_every_primitive_has_an_implementation():
    assert set(PRIMITIVES) <= set(IMPLS)


@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_integer_division_truncates_and_gives_minus_one_on_zero(itype):
    x = np.array([7, -7, 7, -7, 5, 0, -3], itype)
    y = np.array([2, 2, -2, -2, 0, 0, 5], itype)
    same(run("div", x, y), [3, -3, -3, 3, -1, -1, 0], itype)


@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_integer_remainder_follows_the_dividend_and_keeps_it_on_zero(itype):
    x = np.array([7, -7, 7, -7, 5, -5, 0], itype)
    y = np.array([2, 2, -2, -2, 0, 0, 3], itype)
    same(run("rem", x, y), [1, -1, 1, -1, 5, -5, 0], itype)


def test_float_division_and_remainder_follow_ieee():
    same(run("div", np.float32([1, -1, 0]), np.float32([0, 0, 0]))[:2], [np.inf, -np.inf])
    assert np.isnan(run("div", np.float32(0), np.float32(0)))
    same(run("rem", np.float32([5.5, -5.5]), np.float32([2, 2])), [1.5, -1.5], np.float32)


def test_integer_power_with_negative_exponents():
    x = np.array([2, -2, 1, -1, -1, 0, 3], np.int32)
    y = np.array([3, -1, -5, -3, -2, -1, 0], np.int32)
    same(run("pow", x, y), [8, 0, 1, -1, 1, 0, 1], np.int32)


@pytest.mark.parametrize("ftype", [np.float16, bf16, np.float32, np.float64])
@pytest.mark.parametrize("itype", [dt.int32, dt.int64])
def test_float_to_int_truncates_and_saturates_and_nan_gives_zero(ftype, itype):
    with np.errstate(over="ignore"):
        x = np.array([np.nan, np.inf, -np.inf, 60000.0, -60000.0, 2.75, -2.75, 0.5, -0.5], ftype)
    info = np.iinfo(itype.numpy)
    got = run("convert_element_type", x, new_dtype=itype)
    big = 60000 if ftype is np.float16 else int(np.float64(x[3]))
    same(got, [0, info.max, info.min, big, -big, 2, -2, 0, 0], itype.numpy)


@pytest.mark.parametrize("itype", [dt.int32, dt.int64])
def test_float_to_int_saturates_at_the_integer_limits(itype):
    bits = itype.bits
    x = np.array([2.0 ** (bits - 1), -2.0 ** (bits - 1), 1e30, -1e30, -2.0 ** (bits - 1) - 2 ** 12])
    info = np.iinfo(itype.numpy)
    same(run("convert_element_type", x, new_dtype=itype), [info.max, info.min, info.max, info.min, info.min])


def test_conversions_to_and_from_bool():
    same(run("convert_element_type", np.float32([0.0, -0.0, 0.5, np.nan]), new_dtype=dt.bool_), [0, 0, 1, 1], bool)
    same(run("convert_element_type", np.int32([0, -3]), new_dtype=dt.bool_), [False, True], bool)
    same(run("convert_element_type", np.array([True, False]), new_dtype=dt.float16), [1, 0], np.float16)


@pytest.mark.parametrize("ftype", [np.float16, bf16, np.float32, np.float64])
def test_round_is_half_to_even(ftype):
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 2.25, -1.75], ftype)
    same(run("round", x), [0, 2, 2, 0, -2, 4, 2, -2], ftype)
    same(run("floor", x), [0, 1, 2, -1, -3, 3, 2, -2], ftype)
    same(run("ceil", x), [1, 2, 3, 0, -2, 4, 3, -1], ftype)


def test_sign_abs_not():
    same(run("sign", np.float32([-2, 0, 3])), [-1, 0, 1], np.float32)
    same(run("sign", np.int32([-2, 0, 3])), [-1, 0, 1], np.int32)
    same(run("abs", np.int32([-2, 3])), [2, 3], np.int32)
    same(run("not", np.array([True, False])), [False, True], bool)
    same(run("not", np.int32([0, 5])), [-1, -6], np.int32)


@pytest.mark.parametrize("name", ["erf", "logistic", "rsqrt", "tanh", "exp"])
@pytest.mark.parametrize("ftype", [np.float16, bf16, np.float32])
def test_math_functions_keep_dtype_and_rank_zero(name, ftype):
    for x in (np.asarray(0.75, ftype), np.asarray([0.75, 1.5], ftype)):
        got = run(name, x)
        assert got.dtype == x.dtype and got.shape == x.shape


@pytest.mark.parametrize("name", ["logistic", "rsqrt", "erf", "exp"])
def test_16_bit_math_rounds_once_from_float32(name):
    x = np.array([0.3, 1.7, 2.9, 0.55], np.float16)
    want = run(name, x.astype(np.float32)).astype(np.float16)
    same(run(name, x), want.astype(np.float64), np.float16)


def test_values_of_math_functions():
    x = np.array([-30.0, 0.0, 100.0], np.float32)  # no overflow in exp for large |x|
    np.testing.assert_allclose(run("logistic", x), [math.exp(-30), 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(run("erf", np.float64([0.5, -1.0])), [math.erf(0.5), math.erf(-1.0)])
    np.testing.assert_allclose(run("rsqrt", np.float32([4.0, 0.25])), [0.5, 2.0])
    same(run("exp2", np.float32([3, -1])), [8, 0.5])


def test_extremes_and_comparisons():
    same(run("max", np.int32([1, 5]), np.int32([3, 2])), [3, 5], np.int32)
    same(run("min", np.array([True, False]), np.array([True, True])), [True, False], bool)
    same(run("lt", np.float32([1, 2]), np.float32(2)), [True, False], bool)
    same(run("select", np.bool_(True), np.float32([1, 2]), np.float32([3, 4])), [1, 2])
    same(run("select", np.array([True, False]), np.float32(7), np.float32(9)), [7, 9])


def test_half_precision_reductions_and_contractions_accumulate_in_float32():
    ones = np.ones(4096, np.float16)  # a float16 running sum would stop at 2048
    same(run("reduce_sum", ones, axes=(0,)), 4096, np.float16)
    a, b = np.ones((1, 600), bf16), np.ones((600, 1), bf16)
    same(run("dot_general", a, b, dimension_numbers=(((1,), (0,)), ((), ()))), [[600]], bf16)


def test_reductions():
    x = np.array([[1, -2, 3], [4, 5, -6]], np.int32)
    same(run("reduce_sum", x, axes=(1,)), [2, 3], np.int32)
    same(run("reduce_prod", x, axes=(0,)), [4, -10, -18], np.int32)
    same(run("reduce_max", x, axes=(0, 1)), 5, np.int32)
    same(run("reduce_min", x, axes=()), x, np.int32)
    same(run("reduce_max", np.array([[True, False], [False, False]]), axes=(1,)), [True, False], bool)


def test_argmax_and_argmin_take_the_first_of_ties():
    x = np.array([[1, 3, 3], [2, 2, 1]], np.float32)
    same(run("argmax", x, axis=1, index_dtype=dt.int32), [1, 0], np.int32)
    same(run("argmin", x, axis=1, index_dtype=dt.int64), [0, 2], np.int64)
    same(run("argmax", x, axis=0, index_dtype=dt.int32), [1, 0, 0], np.int32)


def test_layout_primitives():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    same(run("broadcast_in_dim", np.int32([[7], [8]]), shape=(2, 2, 3), dims=(1, 2)), [[[7] * 3, [8] * 3]] * 2)
    same(run("reshape", x, shape=(3, 2)), [[0, 1], [2, 3], [4, 5]], np.int32)
    same(run("transpose", x, permutation=(1, 0)), [[0, 3], [1, 4], [2, 5]], np.int32)
    same(run("slice", np.arange(10), start=(1,), limit=(9,), strides=(3,)), [1, 4, 7])
    same(run("pad", np.int32([1, 2]), low=(2,), high=(1,), value=-1), [-1, -1, 1, 2, -1], np.int32)
    same(run("pad", np.array([1.5], bf16), low=(0,), high=(1,), value=0.25), [1.5, 0.25], bf16)
    same(run("concatenate", x, np.int32([[9], [9]]), dimension=1), [[0, 1, 2, 9], [3, 4, 5, 9]], np.int32)
    same(run("iota", dtype=dt.float32, shape=(2, 3), dimension=1), [[0, 1, 2], [0, 1, 2]], np.float32)


def test_dot_general_orders_batch_then_lhs_free_then_rhs_free():
    lhs = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)   # b, m, k
    rhs = np.arange(4 * 2 * 5, dtype=np.float64).reshape(4, 2, 5)   # k, b, n
    got = run("dot_general", lhs, rhs, dimension_numbers=(((2,), (0,)), ((0,), (1,))))
    assert got.shape == (2, 3, 5)
    want = np.array([[[sum(lhs[b, m, k] * rhs[k, b, n] for k in range(4)) for n in range(5)]
                      for m in range(3)] for b in range(2)])
    same(got, want)


def test_gather_clamps_indices():
    x = np.array([10, 20, 30], np.float32)
    same(run("gather", x, np.int32([-5, 0, 2, 7]), axis=0, batch_dims=0), [10, 10, 30, 30])


def test_gather_along_an_inner_axis_with_a_matrix_of_indices():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    got = run("gather", x, np.int32([[2, 0], [1, 1]]), axis=1, batch_dims=0)
    same(got, [[[3, 1], [2, 2]], [[6, 4], [5, 5]]], np.int32)  # out[p, q0, q1] = x[p, idx[q0, q1]]


def test_gather_with_a_scalar_index():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    same(run("gather", x, np.int32(1), axis=1, batch_dims=0), [1, 5, 9])


def test_gather_with_batch_dims():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    same(run("gather", x, np.int32([[2, 2], [0, 1]]), axis=1, batch_dims=1), [[3, 3], [4, 5]])


def test_gather_with_batch_dims_below_axis():
    x = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    idx = np.int32([[3, 0], [1, 9]])  # idx[p0, q]; 9 clamps to 3
    got = run("gather", x, idx, axis=2, batch_dims=1)  # out[p0, p1, q] = x[p0, p1, idx[p0, q]]
    assert got.shape == (2, 3, 2)
    same(got[0], [[3, 0], [7, 4], [11, 8]])
    same(got[1], [[13, 15], [17, 19], [21, 23]])


def test_scatter_add_accumulates_duplicates_and_drops_out_of_range():
    x = np.zeros(4, np.float32)
    got = run("scatter_add", x, np.int32([1, 1, 3, -1, 4]), np.float32([1, 2, 3, 4, 5]), axis=0, batch_dims=0)
    same(got, [0, 3, 0, 3], np.float32)
    same(x, [0, 0, 0, 0])  # the operand is not modified


def test_scatter_add_with_batch_dims_below_axis():
    x = np.zeros((2, 2, 3), np.int32)
    idx = np.int32([[0, 0], [2, 5]])
    updates = np.ones((2, 2, 2), np.int32)
    got = run("scatter_add", x, idx, updates, axis=2, batch_dims=1)
    same(got[0], [[2, 0, 0], [2, 0, 0]])
    same(got[1], [[0, 0, 1], [0, 0, 1]])


def test_scatter_add_is_the_transpose_of_gather():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    idx = np.int32([[0, 3, 3], [2, 1, 0], [1, 1, 1]])
    u = rng.standard_normal((3, 3))
    gathered = run("gather", x, idx, axis=1, batch_dims=1)
    scattered = run("scatter_add", np.zeros_like(x), idx, u, axis=1, batch_dims=1)
    np.testing.assert_allclose((gathered * u).sum(), (x * scattered).sum())
