"""Kernel IR scalar expressions -> LLVM IR, shared by the CPU and NVPTX targets.

An `ExprEmitter` emits the value of an expression at one point of a kernel's domain: the target
supplies the domain indices (i64 values), the row values of finished reductions, and how to load
an element of an input buffer. Everything emitted is straight-line and branch-free, so loops
around it vectorise on the CPU. Primitive semantics match `glue.reference.impls` exactly
(integer division by zero, saturating float->int conversion, NaN-propagating max/min, shifts
past the width, ...); LLVM integers carry no sign, so each rule picks the signed or unsigned
instruction from the operand's dtype.
"""
from __future__ import annotations

from typing import Callable, Sequence

from llvmlite import ir

from glue.codegen import mathlib
from glue.codegen.types import I1, I32, I64, F32, constant, register_type, round_to_bf16_bits
from glue.ir import RuleTable
from glue.ir import dtypes as dt
from glue.ir.core import strides
from glue.ir.dtypes import DType
from glue.scheduler.kernel_ir import (Clamp, Const, Dim, Div, Expr, FromValue, InBounds, Index,
                                      IndexValue, Load, Mod, Op, RowValue, postorder)

LoadFn = Callable[[int, ir.Value, DType], ir.Value]  # (input slot, flat element offset) -> value



class ExprEmitter:
    """Emits expressions at one domain point; values are memoised within that point, and so
    are indices and the index atoms that take several instructions (floor divisions, moduli,
    clamps): a reshape's Div or Mod recurs in every load of the same layout, and emitting it
    once per point instead of once per load keeps a kernel's module a fraction of the size for
    LLVM to read (an inner emitter that inherits `memo` starts its own `atoms`, since its dims
    differ)."""

    def __init__(self, builder: ir.IRBuilder, dims: Sequence[ir.Value], input_shapes: Sequence[tuple[int, ...]],
                 load: LoadFn, rows: Sequence[ir.Value] = ()):
        self.b = builder
        self.dims = list(dims)
        self.input_shapes = input_shapes
        self.load_element = load
        self.rows = list(rows)
        self.memo: dict[object, ir.Value] = {}
        self.atoms: dict[Index | Div | Mod | Clamp, ir.Value] = {}

    # --- indices ---------------------------------------------------------------------------
    def index(self, index: Index) -> ir.Value:
        if not index.terms:
            return ir.Constant(I64, index.const)
        found = self.atoms.get(index)
        if found is None:
            found = self.atoms[index] = self._emit_index(index)
        return found

    def _emit_index(self, index: Index) -> ir.Value:
        total: ir.Value = ir.Constant(I64, index.const)
        for atom, coeff in index.terms:
            term = self.atom(atom)
            if coeff != 1:
                term = self.b.mul(term, ir.Constant(I64, coeff))
            total = term if _is_zero(total) else self.b.add(total, term)
        return total

    def atom(self, atom) -> ir.Value:
        if isinstance(atom, Dim):
            return self.dims[atom.k]
        if isinstance(atom, FromValue):
            return index_of(self.b, self.value(atom.value), atom.value.dtype)
        found = self.atoms.get(atom)
        if found is None:
            found = self.atoms[atom] = self._emit_atom(atom)
        return found

    def _emit_atom(self, atom: Div | Mod | Clamp) -> ir.Value:
        i = self.index(atom.index)
        if isinstance(atom, Div):
            return _floor_div(self.b, i, atom.divisor)
        if isinstance(atom, Mod):
            return _floor_mod(self.b, i, atom.divisor)
        low = self.b.select(self.b.icmp_signed("<", i, ir.Constant(I64, 0)), ir.Constant(I64, 0), i)
        top = ir.Constant(I64, atom.size - 1)
        return self.b.select(self.b.icmp_signed(">", low, top), top, low)

    def in_bounds(self, mask) -> ir.Value:
        ok: ir.Value = ir.Constant(I1, 1)
        for index, lo, hi in mask:
            i = self.index(index)
            # One unsigned compare checks lo <= i < hi.
            shifted = self.b.sub(i, ir.Constant(I64, lo))
            ok = self.b.and_(ok, self.b.icmp_unsigned("<", shifted, ir.Constant(I64, hi - lo)))
        return ok

    def offset(self, index: Sequence[Index], shape: Sequence[int]) -> ir.Value:
        flat = Index()
        for i, s in zip(index, strides(shape)):
            flat = flat + i * s
        return self.index(flat)

    # --- values ----------------------------------------------------------------------------
    def value(self, e: Expr) -> ir.Value:
        found = self.memo.get(e)
        if found is None:
            self.force(e)
            found = self.memo[e]
        return found

    def force(self, key) -> None:
        """Emit `key` (an expression, or a key a subclass emits apart) and everything it needs
        first, in the order a recursive emitter would, but with an explicit stack: expressions
        are as deep as the programs are long. A data-dependent index still emits its value when
        its load reaches it, as nested as such indices are (which fusion bounds)."""
        for node in postorder(key, self.needs, self.memo):
            self.memo[node] = self.emit(node)

    def needs(self, key) -> Sequence:
        """What emitting `key` reads from the memo: an op's arguments."""
        return key.args if isinstance(key, Op) else ()

    def emit(self, key) -> ir.Value:
        """The value of `key`, with what it `needs` emitted already."""
        return _EMIT[type(key)](self, key)

    def _load(self, e: Load) -> ir.Value:
        offset = self.offset(e.index, self.input_shapes[e.input])
        if not e.mask:
            return self.load_element(e.input, offset, e.dtype)
        return self.masked_load(e.input, offset, self.in_bounds(e.mask), e.dtype, constant(e.dtype, e.other))

    def masked_load(self, slot: int, offset: ir.Value, ok: ir.Value, dtype: DType, other: ir.Value) -> ir.Value:
        """Element `offset` of input `slot` where `ok`, else `other`: branch-free, reading
        element 0 where `ok` is false."""
        safe = self.b.select(ok, offset, ir.Constant(I64, 0))
        return self.b.select(ok, self.load_element(slot, safe, dtype), other)

    def _const(self, e: Const) -> ir.Value:
        return constant(e.dtype, e.value)

    def _index_value(self, e: IndexValue) -> ir.Value:
        return convert(self.b, self.index(e.index), dt.int64, e.dtype)

    def _in_bounds(self, e: InBounds) -> ir.Value:
        return self.in_bounds(e.mask)

    def _row(self, e: RowValue) -> ir.Value:
        return self.rows[e.k]

    def _op(self, e: Op) -> ir.Value:
        args = [self.value(a) for a in e.args]
        return OP_RULES[e.primitive](self.b, args, [a.dtype for a in e.args], e)


_EMIT = {Load: ExprEmitter._load, Const: ExprEmitter._const, IndexValue: ExprEmitter._index_value,
         InBounds: ExprEmitter._in_bounds, RowValue: ExprEmitter._row, Op: ExprEmitter._op}


def index_of(b: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
    """An integer value as an i64 index; uint64 values past the i64 range saturate (they are
    out of range of every array either way, as the reference sees them)."""
    if dtype == dt.uint64:
        top = ir.Constant(I64, (1 << 63) - 1)
        return b.select(b.icmp_unsigned(">", value, top), top, value)
    if value.type == I64:
        return value
    return b.sext(value, I64) if dtype.signed else b.zext(value, I64)


def _is_zero(v: ir.Value) -> bool:
    return isinstance(v, ir.Constant) and v.constant == 0


def _power_of_two(d: int) -> bool:
    return d & (d - 1) == 0


def _floor_div(b: ir.IRBuilder, i: ir.Value, d: int) -> ir.Value:
    """floor(i / d) for d > 0: for a power of two an arithmetic shift, which floors (one
    instruction where sdiv, which truncates toward zero, needs six more to floor)."""
    if d == 1:
        return i
    if _power_of_two(d):
        return b.ashr(i, ir.Constant(I64, d.bit_length() - 1))
    q = b.sdiv(i, ir.Constant(I64, d))
    adjust = b.and_(b.icmp_signed("<", i, ir.Constant(I64, 0)),
                    b.icmp_signed("!=", b.mul(q, ir.Constant(I64, d)), i))
    return b.sub(q, b.zext(adjust, I64))


def _floor_mod(b: ir.IRBuilder, i: ir.Value, d: int) -> ir.Value:
    """i - d * floor(i / d) for d > 0, in [0, d): for a power of two the low bits of `i`
    (two's complement makes that the floored modulus of negative `i` too)."""
    if _power_of_two(d):
        return b.and_(i, ir.Constant(I64, d - 1))
    return b.sub(i, b.mul(_floor_div(b, i, d), ir.Constant(I64, d)))


# --- conversions ------------------------------------------------------------------------------

def convert(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """`x` (a register value of dtype `src`) converted to `dst`, as the reference does."""
    if src == dst:
        return x
    to = register_type(dst)
    if dst == dt.bool_:
        return b.fcmp_unordered("une", x, ir.Constant(x.type, 0.0)) if src.is_float else \
            b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if src == dt.bool_:
        return b.uitofp(x, to) if dst.is_float else b.zext(x, to)
    if src.is_int and dst.is_int:  # wraps: widening extends by the source's signedness
        if to.width > x.type.width:
            return b.sext(x, to) if src.signed else b.zext(x, to)
        return b.trunc(x, to) if to.width < x.type.width else x
    if src.is_int:
        return _round_float(b, b.sitofp(x, to) if src.signed else b.uitofp(x, to), dst)
    if dst.is_int:
        saturating = "llvm.fptosi.sat" if dst.signed else "llvm.fptoui.sat"
        return b.call(intrinsic(b.module, saturating, to, [x.type], [to, x.type]), [x])
    if src == dt.float64 and dst == dt.float16:
        return _round_float(b, _narrow_to_odd(b, x), dst)
    widened = b.fpext(x, to) if _width(to) > _width(x.type) else b.fptrunc(x, to) if _width(to) < _width(x.type) else x
    return _round_float(b, widened, dst)


def _narrow_to_odd(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """double -> float rounded to odd (truncated, last bit set when inexact), so that rounding
    the result once more to float16 gives the correctly rounded float16 of `x`, as NumPy does
    (rounding through float32 to nearest would round twice; LLVM's direct double -> half
    conversion is a libm call on x86)."""
    nearest = b.fptrunc(x, F32)
    back = b.fpext(nearest, x.type)
    inexact = b.fcmp_unordered("!=", back, x)
    fabs = intrinsic(b.module, "llvm.fabs", x.type, [x.type], [x.type])
    overshot = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [x]))
    bits = b.bitcast(nearest, I32)
    bits = b.select(b.and_(inexact, overshot), b.sub(bits, ir.Constant(I32, 1)), bits)
    bits = b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits)
    return b.bitcast(bits, F32)


def _width(t: ir.Type) -> int:
    return {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}[type(t)]


def _round_float(b: ir.IRBuilder, x: ir.Value, dtype: DType) -> ir.Value:
    """Round a float32 register value to a 16-bit float's precision (still held as float32)."""
    if dtype in (dt.float16, dt.bfloat16):
        return from_bits(b, to_bits(b, x, dtype), dtype)
    return x


# --- elementwise primitives ----------------------------------------------------------------------

def _is_float(dtypes) -> bool:
    return dtypes[0].is_float


def _arith(float_op: str, int_op: str):
    def rule(b, args, dtypes, e):
        out = getattr(b, float_op if _is_float(dtypes) else int_op)(*args)
        return _round_float(b, out, e.dtype)
    return rule


def _int_div(b, x, y, zero_result, minus_one_result, op):
    zero, minus_one = ir.Constant(x.type, 0), ir.Constant(x.type, -1)
    y_zero, y_m1 = b.icmp_signed("==", y, zero), b.icmp_signed("==", y, minus_one)
    safe = b.select(b.or_(y_zero, y_m1), ir.Constant(x.type, 1), y)
    q = getattr(b, op)(x, safe)
    return b.select(y_zero, zero_result(x), b.select(y_m1, minus_one_result(x), q))


def _unsigned_div(b, x, y, zero_result, op):
    y_zero = b.icmp_unsigned("==", y, ir.Constant(x.type, 0))
    q = getattr(b, op)(x, b.select(y_zero, ir.Constant(x.type, 1), y))
    return b.select(y_zero, zero_result, q)


def _div(b, args, dtypes, e):
    x, y = args
    if _is_float(dtypes):
        return _round_float(b, b.fdiv(x, y), e.dtype)
    if not dtypes[0].signed:
        return _unsigned_div(b, x, y, ir.Constant(x.type, -1), "udiv")
    return _int_div(b, x, y, lambda x: ir.Constant(x.type, -1), lambda x: b.neg(x), "sdiv")


def _rem(b, args, dtypes, e):
    x, y = args
    if _is_float(dtypes):
        return _round_float(b, _fmod(b, x, y), e.dtype)
    if not dtypes[0].signed:
        return _unsigned_div(b, x, y, x, "urem")
    return _int_div(b, x, y, lambda x: x, lambda x: ir.Constant(x.type, 0), "srem")


def _fmod(b, x, y):
    """C fmod, exactly: x - trunc(x / y) * y is inexact, so use LLVM's frem."""
    return b.frem(x, y)


def _fcall(b, name, *args):
    t = args[0].type
    return b.call(intrinsic(b.module, name, t, [t] * len(args), [t]), list(args))


def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return {ir.HalfType: "f16", ir.FloatType: "f32", ir.DoubleType: "f64"}[type(t)]


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type],
              overloads: Sequence[ir.Type]) -> ir.Function:
    """The declaration of an overloaded LLVM intrinsic, e.g. llvm.fptosi.sat.i32.f32."""
    full = ".".join([name] + [_suffix(t) for t in overloads])
    existing = module.globals.get(full)
    return existing if existing is not None else ir.Function(module, ir.FunctionType(ret, args), full)


def _maxmin(ordered: str, signed: str):
    def rule(b, args, dtypes, e):
        x, y = args
        if _is_float(dtypes):
            # NumPy: x when x >= y (resp. <=) or x is NaN, else y (so NaN in y propagates too).
            keep_x = b.or_(b.fcmp_ordered(ordered, x, y), b.fcmp_unordered("uno", x, x))
            return b.select(keep_x, x, y)
        return b.select(icmp(b, dtypes[0], ordered, x, y), x, y)
    return rule


def icmp(b: ir.IRBuilder, dtype: DType, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """An integer (or bool) comparison that reads the bits as `dtype` does."""
    return b.icmp_signed(op, x, y) if dtype.signed else b.icmp_unsigned(op, x, y)


def _compare(op: str):
    def rule(b, args, dtypes, e):
        x, y = args
        if _is_float(dtypes):
            return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)
        return icmp(b, dtypes[0], op, x, y)
    return rule


def _neg(b, args, dtypes, e):
    return b.fneg(args[0]) if _is_float(dtypes) else b.neg(args[0])


def _abs(b, args, dtypes, e):
    x = args[0]
    if _is_float(dtypes):
        return _fcall(b, "llvm.fabs", x)
    if not dtypes[0].signed:
        return x
    return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)


def _sign(b, args, dtypes, e):
    x = args[0]
    if not dtypes[0].signed:
        return b.zext(b.icmp_unsigned("!=", x, ir.Constant(x.type, 0)), x.type)
    zero = ir.Constant(x.type, 0.0 if _is_float(dtypes) else 0)
    one, minus = ir.Constant(x.type, 1.0 if _is_float(dtypes) else 1), ir.Constant(x.type, -1.0 if _is_float(dtypes) else -1)
    gt = b.fcmp_ordered(">", x, zero) if _is_float(dtypes) else b.icmp_signed(">", x, zero)
    lt = b.fcmp_ordered("<", x, zero) if _is_float(dtypes) else b.icmp_signed("<", x, zero)
    return b.select(gt, one, b.select(lt, minus, x))


def _not(b, args, dtypes, e):
    return b.not_(args[0])


def _bitwise(op: str):
    return lambda b, args, dtypes, e: getattr(b, op)(*args)


def _shift(op: str):
    """XLA's shifts: an amount of the width or more (unsigned) shifts every bit out, where
    LLVM's shifts would be poison; the arithmetic shift then fills with the sign bit."""
    def rule(b, args, dtypes, e):
        x, y = args
        width = ir.Constant(x.type, x.type.width)
        inside = b.icmp_unsigned("<", y, width)
        if op == "ashr":
            return b.ashr(x, b.select(inside, y, ir.Constant(x.type, x.type.width - 1)))
        moved = getattr(b, op)(x, b.and_(y, ir.Constant(x.type, x.type.width - 1)))
        return b.select(inside, moved, ir.Constant(x.type, 0))
    return rule


def _population_count(b, args, dtypes, e):
    return _fcall(b, "llvm.ctpop", args[0])


def _bitcast_convert(b, args, dtypes, e):
    return from_bits(b, to_bits(b, args[0], dtypes[0]), e.dtype)


def to_bits(b: ir.IRBuilder, x: ir.Value, dtype: DType) -> ir.Value:
    """A register value's bits as an integer of its dtype's width (16-bit floats are held in
    float32 registers: their bits come from rounding, which is exact for their values)."""
    if dtype == dt.float16:
        return b.bitcast(b.fptrunc(x, ir.HalfType()), ir.IntType(16))
    if dtype == dt.bfloat16:
        return round_to_bf16_bits(b, x)
    return b.bitcast(x, ir.IntType(dtype.bits)) if dtype.is_float else x


def from_bits(b: ir.IRBuilder, bits: ir.Value, dtype: DType) -> ir.Value:
    """The register value of `dtype` with these bits (the inverse of `to_bits`)."""
    if dtype == dt.float16:
        return b.fpext(b.bitcast(bits, ir.HalfType()), F32)
    if dtype == dt.bfloat16:
        return b.bitcast(b.shl(b.zext(bits, I32), ir.Constant(I32, 16)), F32)
    return b.bitcast(bits, register_type(dtype)) if dtype.is_float else bits


def _select(b, args, dtypes, e):
    return b.select(*args)


def _convert(b, args, dtypes, e):
    return convert(b, args[0], dtypes[0], e.dtype)


def _rounding(intrinsic: str):
    return lambda b, args, dtypes, e: _fcall(b, intrinsic, args[0])


def _math(name: str):
    def rule(b, args, dtypes, e):
        return _round_float(b, mathlib.emit_unary(b, name, args[0]), e.dtype)
    return rule


def _pow(b, args, dtypes, e):
    x, y = args
    if _is_float(dtypes):
        return _round_float(b, mathlib.emit_pow(b, x, y), e.dtype)
    return _int_pow(b, x, y, dtypes[0].signed)


def _int_pow(b, x, y, signed: bool):
    """x**y for integers by square-and-multiply over every exponent bit; negative y as the
    reference: 1 for x == 1, +-1 for x == -1, else 0."""
    one = ir.Constant(x.type, 1)
    result, base, exp = one, x, y
    for _ in range(x.type.width - 1 if signed else x.type.width):
        bit = b.trunc(exp, I1)
        result = b.select(bit, b.mul(result, base), result)
        base = b.mul(base, base)
        exp = b.lshr(exp, one)
    if not signed:
        return result
    negative = b.icmp_signed("<", y, ir.Constant(x.type, 0))
    odd = b.trunc(y, I1)
    minus_one = b.select(odd, ir.Constant(x.type, -1), one)
    neg_result = b.select(b.icmp_signed("==", x, one), one,
                          b.select(b.icmp_signed("==", x, ir.Constant(x.type, -1)), minus_one, ir.Constant(x.type, 0)))
    return b.select(negative, neg_result, result)


OP_RULES = RuleTable("codegen", lambda p: p.kind == "elementwise")
OP_RULES.update({
    "add": _arith("fadd", "add"), "sub": _arith("fsub", "sub"), "mul": _arith("fmul", "mul"),
    "div": _div, "rem": _rem, "pow": _pow, "max": _maxmin(">=", ">="), "min": _maxmin("<=", "<="),
    "eq": _compare("=="), "ne": _compare("!="), "lt": _compare("<"), "le": _compare("<="),
    "gt": _compare(">"), "ge": _compare(">="),
    "and": _bitwise("and_"), "or": _bitwise("or_"), "xor": _bitwise("xor"), "not": _not,
    "shift_left": _shift("shl"), "shift_right_logical": _shift("lshr"),
    "shift_right_arithmetic": _shift("ashr"), "population_count": _population_count,
    "bitcast_convert_type": _bitcast_convert,
    "neg": _neg, "abs": _abs, "sign": _sign, "select": _select, "convert_element_type": _convert,
    "floor": _rounding("llvm.floor"), "ceil": _rounding("llvm.ceil"), "round": _rounding("llvm.rint"),
    **{name: _math(name) for name in mathlib.UNARY_FUNCTIONS},
})
