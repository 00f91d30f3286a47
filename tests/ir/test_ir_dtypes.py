"""The dtype lattice: strong promotion, weak Python scalars and NumPy dtype mapping."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from glue import GlueTypeError
from glue.ir import dtypes as dt

bool_, i32, i64, f16, bf16, f32, f64 = dt.bool_, dt.int32, dt.int64, dt.float16, dt.bfloat16, dt.float32, dt.float64
any_dtype = st.sampled_from(dt.ALL_DTYPES)


@pytest.mark.parametrize("a, b, want", [
    (f16, bf16, f32), (bool_, i32, i32), (i32, i64, i64), (i64, f16, f16), (i32, bf16, bf16),
    (i32, f32, f32), (f32, f64, f64), (bf16, f32, f32), (f16, f64, f64), (bool_, bool_, bool_),
    (bool_, f16, f16),
])
def test_promotion_table(a, b, want):
    assert dt.promote(a, b) == want
    assert dt.promote(b, a) == want


@given(any_dtype, any_dtype, any_dtype)
def test_promotion_is_a_join(a, b, c):
    ab = dt.promote(a, b)
    assert dt.promote(a, a) == a
    assert dt.promote(ab, a) == ab and dt.promote(ab, b) == ab  # an upper bound of both
    assert dt.promote(ab, c) == dt.promote(a, dt.promote(b, c))


@pytest.mark.parametrize("strong, scalar, want", [
    (f16, 2.0, f16), (bf16, 3, bf16), (i32, 2.5, f32), (i64, 2.5, f32), (bool_, 1, i32),
    (bool_, True, bool_), (bool_, 0.5, f32), (i64, 7, i64), (i32, True, i32), (f64, 1, f64),
])
def test_weak_scalars_take_the_arrays_dtype_unless_of_a_higher_kind(strong, scalar, want):
    assert dt.promote_with_weak(strong, scalar) == want


@pytest.mark.parametrize("scalar, want", [(True, bool_), (3, i32), (2.5, f32), (np.bool_(False), bool_)])
def test_weak_scalar_defaults(scalar, want):
    assert dt.weak_scalar_dtype(scalar) == want


@pytest.mark.parametrize("spec, want", [
    (np.float32, f32), (np.dtype("float16"), f16), (ml_dtypes.bfloat16, bf16), ("f32", f32),
    ("bool", bool_), (np.int64, i64), (np.int8, i32), (np.uint16, i32), (np.uint32, i64), (bf16, bf16),
])
def test_from_numpy(spec, want):
    assert dt.from_numpy(spec) == want


@given(any_dtype)
def test_numpy_dtype_round_trips(d):
    assert dt.from_numpy(d.numpy) == d
    assert d.itemsize == d.numpy.itemsize


def test_unsupported_numpy_dtype_is_a_glue_type_error():
    with pytest.raises(GlueTypeError, match="complex64"):
        dt.from_numpy(np.complex64)
