"""How glue dtypes live in LLVM: in registers, and in memory.

16-bit floats are stored as half / i16 (bfloat16) and computed in float32; bools are i1 in
registers and one byte in memory; integers are LLVM integers of their width, signed or not (LLVM
has no signed types: instructions say how they read the bits).
"""
from __future__ import annotations

from llvmlite import ir

from glue.ir import dtypes as dt
from glue.ir.dtypes import DType

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()

_INTEGERS = {d: ir.IntType(d.bits) for d in dt.INT_DTYPES}  # signedness lives in the instructions
_REGISTER = {dt.bool_: I1, **_INTEGERS, dt.float16: F32, dt.bfloat16: F32, dt.float32: F32, dt.float64: F64}
_MEMORY = {dt.bool_: I8, **_INTEGERS, dt.float16: F16, dt.bfloat16: I16, dt.float32: F32, dt.float64: F64}


def register_type(dtype: DType) -> ir.Type:
    """The LLVM type a value of `dtype` is computed in."""
    return _REGISTER[dtype]


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type an element of `dtype` is stored as."""
    return _MEMORY[dtype]


def from_memory(b: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
    """A loaded element, widened to its register type."""
    if dtype == dt.bool_:
        return b.icmp_unsigned("!=", value, ir.Constant(I8, 0))
    if dtype == dt.float16:
        return b.fpext(value, F32)
    if dtype == dt.bfloat16:
        return b.bitcast(b.shl(b.zext(value, I32), ir.Constant(I32, 16)), F32)
    return value


def to_memory(b: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
    """A register value narrowed to how `dtype` is stored (bfloat16 rounds to nearest even)."""
    if dtype == dt.bool_:
        return b.zext(value, I8)
    if dtype == dt.float16:
        return b.fptrunc(value, F16)
    if dtype == dt.bfloat16:
        return round_to_bf16_bits(b, value)
    return value


def round_to_bf16_bits(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """float32 -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN."""
    bits = b.bitcast(value, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb))
    is_nan = b.fcmp_unordered("uno", value, value)
    quiet = b.or_(bits, ir.Constant(I32, 0x00400000))
    return b.trunc(b.lshr(b.select(is_nan, quiet, rounded), ir.Constant(I32, 16)), I16)


def constant(dtype: DType, value) -> ir.Constant:
    """`value` as an LLVM constant of `dtype`'s register type."""
    ty = register_type(dtype)
    if dtype == dt.bool_:
        return ir.Constant(ty, int(bool(value)))
    if dtype.is_int:
        return ir.Constant(ty, _twos_complement(int(value), dtype.bits))
    return ir.Constant(ty, float(value))


def _twos_complement(value: int, bits: int) -> int:
    """An integer of `bits` bits as the signed number with the same bits (LLVM's text form)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value
