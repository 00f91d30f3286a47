"""The dtype lattice: strong promotion (JAX's table), weak Python scalars, x64 and the NumPy mapping."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from glue import GlueTypeError
from glue.ir import dtypes as dt
from glue.settings import config

bool_, f16, bf16, f32, f64 = dt.bool_, dt.float16, dt.bfloat16, dt.float32, dt.float64
i8, i16, i32, i64 = dt.SIGNED_INT_DTYPES
u8, u16, u32, u64 = dt.UNSIGNED_INT_DTYPES
any_dtype = st.sampled_from(dt.ALL_DTYPES)

# JAX's `jnp.promote_types` table (standard promotion, x64 enabled) for the dtypes glue has,
# rows and columns in this order; "f*" marks where the join is the weak float, which becomes
# the default float (float64 with x64, float32 without).
_ORDER = (bool_, u8, u16, u32, u64, i8, i16, i32, i64, bf16, f16, f32, f64)
_TABLE = """
       b    u8   u16  u32  u64  i8   i16  i32  i64  bf16 f16  f32  f64
b      b    u8   u16  u32  u64  i8   i16  i32  i64  bf16 f16  f32  f64
u8     u8   u8   u16  u32  u64  i16  i16  i32  i64  bf16 f16  f32  f64
u16    u16  u16  u16  u32  u64  i32  i32  i32  i64  bf16 f16  f32  f64
u32    u32  u32  u32  u32  u64  i64  i64  i64  i64  bf16 f16  f32  f64
u64    u64  u64  u64  u64  u64  f*   f*   f*   f*   bf16 f16  f32  f64
i8     i8   i16  i32  i64  f*   i8   i16  i32  i64  bf16 f16  f32  f64
i16    i16  i16  i32  i64  f*   i16  i16  i32  i64  bf16 f16  f32  f64
i32    i32  i32  i32  i64  f*   i32  i32  i32  i64  bf16 f16  f32  f64
i64    i64  i64  i64  i64  f*   i64  i64  i64  i64  bf16 f16  f32  f64
bf16   bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 f32  f32  f64
f16    f16  f16  f16  f16  f16  f16  f16  f16  f16  f32  f16  f32  f64
f32    f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f64
f64    f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64
"""


def _table_cases():
    rows = [line.split() for line in _TABLE.strip().splitlines()[1:]]
    names = {"b": "bool", "f*": "f*"}
    for a, row in zip(_ORDER, rows):
        for b, cell in zip(_ORDER, row[1:]):
            yield a, b, names.get(cell, cell)


@pytest.mark.parametrize("a, b, want", list(_table_cases()), ids=str)
def test_promotion_is_jaxs_table(a, b, want):
    with config.override(enable_x64=True):
        assert dt.promote(a, b).name == ("f64" if want == "f*" else want)
    if want == "f*":
        assert dt.promote(a, b) == f32  # without x64, the default float is float32


def test_the_table_is_symmetric():
    cases = {(a, b): want for a, b, want in _table_cases()}
    assert all(cases[b, a] == want for (a, b), want in cases.items())


@given(any_dtype, any_dtype, any_dtype)
def test_the_joint_result_type_is_a_join(a, b, c):
    with config.override(enable_x64=True):
        ab = dt.result_type(a, b)
        assert dt.result_type(a, a) == a
        assert dt.result_type(ab, a) == ab and dt.result_type(ab, b) == ab  # an upper bound of both
        assert dt.result_type(a, b, c) == dt.result_type(c, b, a)


def test_result_type_joins_before_defaulting():
    """JAX joins all operands in the lattice at once: int8, uint64 and float16 meet at float16,
    where promoting pairwise would pass through the default float."""
    assert dt.result_type(i8, u64, f16) == f16
    assert dt.promote(dt.promote(i8, u64), f16) == f32


@pytest.mark.parametrize("strong, scalar, want", [
    (f16, 2.0, f16), (bf16, 3, bf16), (i32, 2.5, f32), (i64, 2.5, f32), (bool_, 1, i32),
    (bool_, True, bool_), (bool_, 0.5, f32), (i32, True, i32), (u8, 3, u8), (i8, 300, i8),
    (u16, -1, u16), (u32, 2.0, f32), (u8, True, u8), (i16, 1.5, f32), (i64, 7, i32), (f64, 1, f32),
])
def test_weak_scalars_take_the_arrays_dtype_unless_of_a_higher_kind(strong, scalar, want):
    """(64-bit types narrow to 32 bits in the result without x64.)"""
    assert dt.result_type(strong, scalar) == want
    assert dt.result_type(scalar, strong) == want


@pytest.mark.parametrize("strong, scalar, want", [(i32, 2.5, f64), (bool_, 1, i64), (u8, 1.0, f64), (f16, 1.0, f16),
                                                  (i64, 7, i64), (f64, 1, f64)])
def test_weak_scalars_default_to_64_bits_with_x64(strong, scalar, want):
    with config.override(enable_x64=True):
        assert dt.result_type(strong, scalar) == want


@pytest.mark.parametrize("scalar, want", [(True, bool_), (3, i32), (2.5, f32), (np.bool_(False), bool_)])
def test_weak_scalar_defaults(scalar, want):
    assert dt.weak_scalar_dtype(scalar) == want


@pytest.mark.parametrize("spec, want", [
    (np.float32, f32), (np.dtype("float16"), f16), (ml_dtypes.bfloat16, bf16), ("f32", f32),
    ("bool", bool_), (np.int64, i64), (np.int8, i8), (np.uint16, u16), (np.uint32, u32), (bf16, bf16),
    ("u8", u8), ("uint64", u64), (np.intc, i32), (np.longlong, i64), (np.ulonglong, u64), (np.int16, i16),
])
def test_from_numpy_keeps_every_width(spec, want):
    assert dt.from_numpy(spec) == want


@pytest.mark.parametrize("wide, narrow", [(f64, f32), (i64, i32), (u64, u32)])
def test_canonical_narrows_64_bit_types_unless_x64(wide, narrow):
    assert dt.canonical(wide) == narrow
    with config.override(enable_x64=True):
        assert dt.canonical(wide) == wide
    for d in (i8, u8, u16, f16, bf16, bool_, f32, i32, u32):
        assert dt.canonical(d) == d


@given(any_dtype)
def test_numpy_dtype_round_trips(d):
    assert dt.from_numpy(d.numpy) == d
    assert d.itemsize == d.numpy.itemsize
    assert d.signed == (d.numpy.kind in "if" or d == bf16)


def test_unsupported_numpy_dtype_is_a_glue_type_error():
    with pytest.raises(GlueTypeError, match="complex64"):
        dt.from_numpy(np.complex64)
    with pytest.raises(GlueTypeError, match="not_a_dtype"):
        dt.from_numpy("not_a_dtype")
