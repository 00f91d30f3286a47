"""16-bit float arithmetic on the GPU: excess precision inside a kernel, and the hardware's
approximate functions where their error is far below a 16-bit ulp.

The kernel IR computes bfloat16 and float16 values in float32 and rounds every result back to
16 bits, as the reference does. Rounding a float32 to bfloat16 takes about seven instructions,
so a bf16 elementwise chain would be bound by rounding, not memory. Like XLA's "excess
precision", `GpuEmitter` keeps 16-bit arithmetic results in float32 through a chain (`loose`
values) and rounds once, where the value is stored, compared, converted to an integer, or fed
to any op that is not plain float arithmetic. Results are then at least as close to the exact
values as rounding at every step; values exact in 16 bits are unchanged.

The transcendental functions of such a chain use the special-function unit (`ex2.approx`,
`lg2.approx`, `sqrt.approx`, `rsqrt.approx`, `div.approx`: relative errors near 2^-22, against a
bfloat16 ulp of 2^-8 and a float16 ulp of 2^-11). float32 and float64 ops keep glue's accurate
math library.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from llvmlite import ir

from glue.codegen import mathlib
from glue.codegen.expr import OP_RULES, ExprEmitter, convert, intrinsic
from glue.codegen.types import F32
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Expr, Op

HALF = (dt.bfloat16, dt.float16)
ARITHMETIC = frozenset({"add", "sub", "mul", "div", "neg", "abs", "max", "min", "pow", "select"}
                       | mathlib.UNARY_FUNCTIONS) - {"floor", "ceil", "round", "sign"}


def _nvvm(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(F32, [F32]), name)
    return b.call(fn, [x])


def _c(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def _exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _nvvm(b, "llvm.nvvm.ex2.approx.f", x)


def _exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _exp2(b, b.fmul(x, _c(math.log2(math.e))))


def _log2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _nvvm(b, "llvm.nvvm.lg2.approx.f", x)


def _fast_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fdiv(x, y, flags=("afn", "arcp"))


def _tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sign(x) (1 - 2 / (1 + e^(2|x|))): absolute error about 1e-7, fine for 16-bit results."""
    ax = b.call(intrinsic(b.module, "llvm.fabs", F32, [F32], [F32]), [x])
    t = _exp2(b, b.fmul(ax, _c(2 * math.log2(math.e))))
    r = b.fsub(_c(1.0), _fast_div(b, _c(2.0), b.fadd(t, _c(1.0))))
    return b.call(intrinsic(b.module, "llvm.copysign", F32, [F32, F32], [F32]), [r, x])


def _logistic(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _fast_div(b, _c(1.0), b.fadd(_c(1.0), _exp(b, b.fneg(x))))


FAST_UNARY: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "exp": _exp, "exp2": _exp2, "log2": _log2,
    "log": lambda b, x: b.fmul(_log2(b, x), _c(math.log(2))),
    "sqrt": lambda b, x: _nvvm(b, "llvm.nvvm.sqrt.approx.f", x),
    "rsqrt": lambda b, x: _nvvm(b, "llvm.nvvm.rsqrt.approx.f", x),
    "tanh": _tanh, "logistic": _logistic,
}


def _is_loose(e: Expr) -> bool:
    return (isinstance(e, Op) and e.dtype in HALF and e.primitive in ARITHMETIC
            and all(a.dtype.is_float or a.dtype == dt.bool_ for a in e.args))


def _is_widening(e: Expr) -> bool:
    return (isinstance(e, Op) and e.primitive == "convert_element_type" and e.args[0].dtype in HALF
            and e.dtype in (dt.float32, dt.float64))


class GpuEmitter(ExprEmitter):
    """`ExprEmitter` with excess precision for 16-bit float chains (see the module docstring)."""

    def value(self, e: Expr) -> ir.Value:
        found = self.memo.get(e)
        if found is not None:
            return found
        if _is_loose(e):
            found = convert(self.b, self.loose(e), dt.float32, e.dtype)
        elif _is_widening(e):
            found = convert(self.b, self.loose(e.args[0]), dt.float32, e.dtype)
        else:
            return super().value(e)
        self.memo[e] = found
        return found

    def loose(self, e: Expr) -> ir.Value:
        """`e` in float32 without rounding to its 16-bit dtype (`value(e)` for other exprs)."""
        if not _is_loose(e):
            return self.value(e)
        key = (e, "loose")
        found = self.memo.get(key)
        if found is None:
            args = [self.loose(a) for a in e.args]
            fast = FAST_UNARY.get(e.primitive)
            if fast is not None:
                found = fast(self.b, args[0])
            elif e.primitive == "div":
                found = _fast_div(self.b, *args)
            else:
                dtypes = [dt.float32 if a.dtype in HALF else a.dtype for a in e.args]
                found = OP_RULES[e.primitive](self.b, args, dtypes, replace(e, dtype=dt.float32))
            self.memo[key] = found
        return found

    def stored(self, e: Expr) -> ir.Value:
        """The value to store for `e`: unrounded for 16-bit floats, which the store rounds."""
        return self.loose(e) if e.dtype in HALF else self.value(e)
