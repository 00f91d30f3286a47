"""Float arithmetic tuned for the GPU: excess precision for 16-bit floats inside a kernel, the
hardware's approximate functions where their error is far below a 16-bit ulp, and cheaper
float32 exp / tanh / logistic and divisions by values shared by many elements.

The kernel IR computes bfloat16 and float16 values in float32 and rounds every result back to
16 bits, as the reference does. Rounding a float32 to bfloat16 takes about seven integer
instructions (two with sm_80's `cvt.rn.bf16x2`, which `GpuEmitter.rounded` uses), so a bf16
elementwise chain would be bound by rounding, not memory. Like XLA's "excess
precision", `GpuEmitter` keeps 16-bit arithmetic results in float32 through a chain (`loose`
values) and rounds once, where the value is stored, compared, converted to an integer, or fed
to any op that is not plain float arithmetic. Results are then at least as close to the exact
values as rounding at every step; values exact in 16 bits are unchanged.

The transcendental functions of such a chain use the special-function unit (`ex2.approx`,
`lg2.approx`, `sqrt.approx`, `rsqrt.approx`, `rcp.approx`: relative errors near 2^-22, against a
bfloat16 ulp of 2^-8 and a float16 ulp of 2^-11), in their flush-to-zero forms: a float32
subnormal (below 1.2e-38) in or out of them is zero, which only bfloat16's own subnormals can
notice. The chain's multiplies and adds may contract into fused multiply-adds, as CUDA C does:
one rounding instead of two.

float32: exp is `ex2.approx` of x log2(e) with the product's rounding error put back (within
the hardware's 2 ulp plus half an ulp, against 0.5 ulp for the math library, at a third of the
instructions); tanh is an odd polynomial below 0.55 and 1 - 2e / (1 + e) above, and logistic
1 / (1 + e) (or e / (1 + e) below 0), with e = e^-2|x| or e^-|x| at most 1, so that the
reciprocal, of a number in [1, 2], is the hardware's estimate refined by one Newton step. A
float division whose divisor varies over fewer domain dims than its dividend (a softmax's row
sum, a mean's count) multiplies by the divisor's reciprocal, computed once (within 1.5 ulp).
float64 and every other function keep glue's math library.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from llvmlite import ir

from glue.codegen import mathlib
from glue.codegen.expr import OP_RULES, ExprEmitter, convert, intrinsic
from glue.codegen.types import F32, I32
from glue.ir import RuleTable
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.codegen.scope import Analysis
from glue.scheduler.kernel_ir import Expr, Op

HALF = (dt.bfloat16, dt.float16)
CONTRACTIBLE = frozenset({"fadd", "fsub", "fmul"})
ARITHMETIC = frozenset({"add", "sub", "mul", "div", "neg", "abs", "max", "min", "pow", "select"}
                       | mathlib.UNARY_FUNCTIONS) - {"floor", "ceil", "round", "sign"}


def _nvvm(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(F32, [F32]), name)
    return b.call(fn, [x])


def _c(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def _exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _nvvm(b, "llvm.nvvm.ex2.approx.f", x)


def exp2_ftz(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _nvvm(b, "llvm.nvvm.ex2.approx.ftz.f", x)


def _exp_ftz(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return exp2_ftz(b, b.fmul(x, _c(math.log2(math.e))))


def log2_ftz(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _nvvm(b, "llvm.nvvm.lg2.approx.ftz.f", x)


def _fast_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fmul(x, _nvvm(b, "llvm.nvvm.rcp.approx.ftz.f", y))


def _tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sign(x) (1 - 2 / (1 + e^(2|x|))): absolute error about 1e-7, fine for 16-bit results."""
    ax = b.call(intrinsic(b.module, "llvm.fabs", F32, [F32], [F32]), [x])
    t = exp2_ftz(b, b.fmul(ax, _c(2 * math.log2(math.e))))
    r = b.fsub(_c(1.0), _fast_div(b, _c(2.0), b.fadd(t, _c(1.0))))
    return b.call(intrinsic(b.module, "llvm.copysign", F32, [F32, F32], [F32]), [r, x])


def _logistic(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _fast_div(b, _c(1.0), b.fadd(_c(1.0), _exp_ftz(b, b.fneg(x))))


# The special functions of 16-bit chains; the `.ftz` forms are one special-function instruction
# each (the others add instructions to handle subnormal inputs and results).
FAST_UNARY = RuleTable("cuda 16-bit special functions")  # a fast path for some, not all
FAST_UNARY.update({
    "exp": _exp_ftz, "exp2": exp2_ftz, "log2": log2_ftz,
    "log": lambda b, x: b.fmul(log2_ftz(b, x), _c(math.log(2))),
    "sqrt": lambda b, x: _nvvm(b, "llvm.nvvm.sqrt.approx.ftz.f", x),
    "rsqrt": lambda b, x: _nvvm(b, "llvm.nvvm.rsqrt.approx.ftz.f", x),
    "tanh": _tanh, "logistic": _logistic,
})


LOG2E = 1.4426950216293335          # log2(e) rounded to float32
LOG2E_LO = 1.925963033500011e-08     # log2(e) - LOG2E
TANH_SMALL = 0.55
# tanh(x) = x + x^3 P(x^2) on |x| <= 0.55 (least-squares fit in float64; 0.8 ulp in float32)
TANH_P = (-0.33333316445350647, 0.13332580029964447, -0.05385185405611992, 0.021070195361971855,
          -0.006272520404309034)


def _fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, "llvm.fma", F32, [F32, F32, F32], [F32]), [x, y, z])


def _fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, "llvm.fabs", F32, [F32], [F32]), [x])


def exp_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x: 2^t for t = x log2(e) in float32, corrected by t's rounding error: 2^t (1 + t_lo ln 2)
    in one fma. Where 2^t overflows or x is infinite or NaN, 2^t alone is the answer."""
    t = b.fmul(x, _c(LOG2E))
    t_lo = b.fadd(_fma(b, x, _c(LOG2E), b.fneg(t)), b.fmul(x, _c(LOG2E_LO)))
    e = _exp2(b, t)
    corrected = _fma(b, e, b.fmul(t_lo, _c(math.log(2))), e)
    finite = b.and_(b.fcmp_ordered("<", _fabs(b, x), _c(104.0)), b.fcmp_ordered("<", e, _c(math.inf)))
    return b.select(finite, corrected, e)


def _reciprocal_1_2(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """1 / d for d in [1, 2]: the hardware's estimate and one Newton step (within 1 ulp), a
    third of the instructions of a correctly rounded division, which must also handle the
    zeros, infinities and subnormals that cannot occur here."""
    r = _nvvm(b, "llvm.nvvm.rcp.approx.ftz.f", d)
    return _fma(b, r, _fma(b, b.fneg(d), r, _c(1.0)), r)


def tanh_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = _fabs(b, x)
    s = b.fmul(x, x)
    p = _c(TANH_P[-1])
    for c in TANH_P[-2::-1]:
        p = _fma(b, p, s, _c(c))
    small = _fma(b, b.fmul(x, s), p, x)
    # tanh|x| = 1 - 2e / (1 + e) with e = e^-2|x| in (0, 1]: nothing overflows.
    e = exp_f32(b, b.fmul(ax, _c(-2.0)))
    large = _fma(b, b.fmul(e, _reciprocal_1_2(b, b.fadd(e, _c(1.0)))), _c(-2.0), _c(1.0))
    signed = b.call(intrinsic(b.module, "llvm.copysign", F32, [F32, F32], [F32]), [large, x])
    # NaN fails the compare and takes the polynomial, which keeps it NaN.
    return b.select(b.fcmp_ordered(">=", ax, _c(TANH_SMALL)), signed, small)


def logistic_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 / (1 + e^-x) as r = 1 / (1 + e) with e = e^-|x| in (0, 1]: r for x >= 0, e r below
    (e^x / (1 + e^x)), so nothing overflows and tiny results keep their relative accuracy."""
    e = exp_f32(b, b.fneg(_fabs(b, x)))
    r = _reciprocal_1_2(b, b.fadd(e, _c(1.0)))
    # NaN fails the compare and takes e r, which is NaN.
    return b.select(b.fcmp_ordered(">=", x, _c(0.0)), r, b.fmul(e, r))


FAST_F32: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "exp": exp_f32, "tanh": tanh_f32, "logistic": logistic_f32}


def _is_loose(e: Expr) -> bool:
    return (isinstance(e, Op) and e.dtype in HALF and e.primitive in ARITHMETIC
            and all(a.dtype.is_float or a.dtype == dt.bool_ for a in e.args))


def _is_narrowing(e: Expr) -> bool:
    return (isinstance(e, Op) and e.primitive == "convert_element_type" and e.dtype == dt.bfloat16
            and e.args[0].dtype in (dt.float32,) + HALF)


def _is_widening(e: Expr) -> bool:
    return (isinstance(e, Op) and e.primitive == "convert_element_type" and e.args[0].dtype in HALF
            and e.dtype in (dt.float32, dt.float64))


def _loose_key(e: Expr):
    """What `GpuEmitter.loose(e)` is memoised under."""
    return (e, "loose") if _is_loose(e) else e


def pack_bf16x2(b: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    """Two floats rounded to bfloat16 (nearest even) and packed into a 32-bit word (sm_80 on)."""
    asm = ir.InlineAsm(ir.FunctionType(I32, [F32, F32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
    return b.call(asm, [high, low])


class GpuEmitter(ExprEmitter):
    """`ExprEmitter` with the GPU's arithmetic (see the module docstring). `analysis` tells
    which domain dims an expression varies over; `packs_bf16` whether the target rounds to
    bfloat16 in one instruction."""

    analysis: Analysis | None = None
    packs_bf16: bool = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cases: dict[Expr, str] = {}

    def rounded(self, x: ir.Value, dtype: DType) -> ir.Value:
        """A float32 rounded to `dtype`, held as float32: for bfloat16, in two instructions
        where the target has the conversion, rather than the seven of the integer form."""
        if dtype != dt.bfloat16 or not self.packs_bf16:
            return convert(self.b, x, dt.float32, dtype)
        pair = pack_bf16x2(self.b, x, x)  # the rounded value in both halves; keep the high one
        return self.b.bitcast(self.b.and_(pair, ir.Constant(I32, -65536)), F32)

    def _case(self, e: Expr) -> str:
        """Which of the GPU's own forms emits `e` ("" for the shared emitter's)."""
        if _is_loose(e):
            return "loose"
        if _is_narrowing(e):
            return "narrow"
        if _is_widening(e):
            return "widen"
        if isinstance(e, Op) and e.dtype == dt.float32 and e.primitive in FAST_F32:
            return "fast"
        if self._shared_divisor(e):
            return "divide"
        return ""

    def needs(self, key) -> list:
        # Keys are expressions, and (expression, "loose") or (divisor, "reciprocal") pairs.
        if isinstance(key, tuple):
            e, kind = key
            return [_loose_key(a) for a in e.args] if kind == "loose" else [e]
        case = self._cases[key] = self._case(key)
        if case == "loose":
            return [(key, "loose")]
        if case in ("narrow", "fast"):
            return [key.args[0]]
        if case == "widen":
            return [_loose_key(key.args[0])]
        if case == "divide":
            return [key.args[0], (key.args[1], "reciprocal")]
        return list(super().needs(key))

    def emit(self, key) -> ir.Value:
        if isinstance(key, tuple):
            e, kind = key
            return self._emit_loose(e) if kind == "loose" else self._emit_reciprocal(e)
        case = self._cases.pop(key)  # chosen when its needs were listed
        if case == "loose":
            return self.rounded(self.loose(key), key.dtype)
        if case == "narrow":
            return self.rounded(self.value(key.args[0]), key.dtype)
        if case == "widen":
            return convert(self.b, self.loose(key.args[0]), dt.float32, key.dtype)
        if case == "fast":
            return FAST_F32[key.primitive](self.b, self.value(key.args[0]))
        if case == "divide":
            return self.b.fmul(self.value(key.args[0]), self.reciprocal(key.args[1]))
        return super().emit(key)

    def _shared_divisor(self, e: Expr) -> bool:
        if not (isinstance(e, Op) and e.primitive == "div" and e.dtype in (dt.float32, dt.float64)):
            return False
        if self.analysis is None:
            return False
        x, d = (self.analysis.uses(a).dims for a in e.args)
        return d < x

    def _memoised(self, key) -> ir.Value:
        found = self.memo.get(key)
        if found is None:
            self.force(key)
            found = self.memo[key]
        return found

    def reciprocal(self, d: Expr) -> ir.Value:
        return self._memoised((d, "reciprocal"))

    def _emit_reciprocal(self, d: Expr) -> ir.Value:
        value = self.value(d)
        return self.b.fdiv(ir.Constant(value.type, 1.0), value)

    def loose(self, e: Expr) -> ir.Value:
        """`e` in float32 without rounding to its 16-bit dtype (`value(e)` for other exprs)."""
        return self._memoised(_loose_key(e))

    def _emit_loose(self, e: Expr) -> ir.Value:
        args = [self.loose(a) for a in e.args]
        fast = FAST_UNARY.get(e.primitive)
        if fast is not None:
            return fast(self.b, args[0])
        if e.primitive == "div":
            return _fast_div(self.b, *args)
        dtypes = [dt.float32 if a.dtype in HALF else a.dtype for a in e.args]
        found = OP_RULES[e.primitive](self.b, args, dtypes, replace(e, dtype=dt.float32))
        if getattr(found, "opname", None) in CONTRACTIBLE:
            found.flags.append("contract")
        return found

    def stored(self, e: Expr, into: DType) -> ir.Value:
        """The value to store for `e` into an output of dtype `into`: unrounded for 16-bit
        floats, which the store rounds. A float32 narrowed to a bfloat16 output is stored as
        the float32 itself: the store's rounding is the narrowing's, one `cvt` where rounding
        it first and then packing the rounded value (exactly) took three and two masks."""
        if into == dt.bfloat16 and _is_narrowing(e) and e.args[0].dtype == dt.float32:
            return self.value(e.args[0])
        return self.loose(e) if e.dtype in HALF else self.value(e)
