"""Reduction combiners in LLVM IR (identity, combine step, arg-reductions), shared by targets.

Float sums and products carry the `reassoc` flag so that LLVM may vectorise them; the order is
then fixed by the generated code, so results stay deterministic from run to run. Float max and
min fold with llvm.maximum / llvm.minimum, which propagate NaN as NumPy's max/min do and which
the loop vectoriser recognises as reductions.

A float sum over a long row is only as accurate as its longest run of sequential additions:
each of LLVM's few vector accumulators would add millions of elements one after another (and
a float32 accumulator stops growing at 2**24 when adding ones). Targets therefore fold long
rows in blocks, each from zero, and add the block totals with `compensated_add` (Neumaier's
variant of Kahan summation: the rounding error of every addition is kept and added back at
the end), so the error stays a few units in the last place of the largest partial sum however
many blocks a row has.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from glue.codegen.expr import icmp, intrinsic
from glue.codegen.types import constant
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType


def identity(op: str, dtype: DType) -> ir.Constant:
    """The value a reduction starts from."""
    if op in ("sum", "prod"):
        return constant(dtype, 0 if op == "sum" else 1)
    largest = op in ("min", "argmin")
    if dtype == dt.bool_:
        return constant(dtype, largest)
    if dtype.is_int:
        info = np.iinfo(dtype.numpy)
        return constant(dtype, int(info.max if largest else info.min))
    return constant(dtype, float("inf") if largest else float("-inf"))


def combine(b: ir.IRBuilder, op: str, acc: ir.Value, value: ir.Value, dtype: DType) -> ir.Value:
    """acc (op) value for sum | prod | max | min, with NumPy's NaN propagation for max/min."""
    if op in ("sum", "prod"):
        if dtype.is_float:
            return (b.fadd if op == "sum" else b.fmul)(acc, value, flags=("reassoc",))
        return (b.add if op == "sum" else b.mul)(acc, value)
    if dtype.is_float:
        name = "llvm.maximum" if op == "max" else "llvm.minimum"
        return b.call(intrinsic(b.module, name, acc.type, [acc.type, acc.type], [acc.type]), [acc, value])
    return b.select(better(b, op, value, acc, dtype), value, acc)


def compensated(op: str, dtype: DType) -> bool:
    """Whether a reduction folds long rows in blocks with a compensated total (float sums)."""
    return op == "sum" and dtype.is_float


def compensated_add(b: ir.IRBuilder, total: ir.Value, error: ir.Value,
                    part: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(total + part, error + the rounding error of that addition), exactly (Neumaier's step:
    the error of an addition is recovered from the larger operand). No fast-math flags: with
    `reassoc` LLVM could simplify the error term away."""
    fabs = intrinsic(b.module, "llvm.fabs", total.type, [total.type], [total.type])
    new = b.fadd(total, part)
    larger = b.fcmp_ordered(">=", b.call(fabs, [total]), b.call(fabs, [part]))
    lost = b.select(larger, b.fadd(b.fsub(total, new), part), b.fadd(b.fsub(part, new), total))
    return new, b.fadd(error, lost)


def compensated_result(b: ir.IRBuilder, total: ir.Value, error: ir.Value) -> ir.Value:
    """The compensated sum's value. Once the total is inf or NaN it stays so, and its error term
    holds inf - inf = NaN, which must not turn an overflow to inf into a NaN: it is ignored."""
    fabs = intrinsic(b.module, "llvm.fabs", total.type, [total.type], [total.type])
    finite = b.fcmp_ordered("<", b.call(fabs, [total]), ir.Constant(total.type, float("inf")))
    return b.select(finite, b.fadd(total, error), total)


def better(b: ir.IRBuilder, op: str, value: ir.Value, best: ir.Value, dtype: DType) -> ir.Value:
    """Whether `value` replaces `best` in a max/min (first occurrence wins; NaN beats numbers)."""
    bigger = op in ("max", "argmax")
    if dtype.is_float:
        strict = b.fcmp_ordered(">" if bigger else "<", value, best)
        nan_wins = b.and_(b.fcmp_unordered("uno", value, value), b.fcmp_ordered("ord", best, best))
        return b.or_(strict, nan_wins)
    return icmp(b, dtype, ">" if bigger else "<", value, best)
