"""Reduction combiners in LLVM IR (identity, combine step, arg-reductions), shared by targets.

Float sums and products carry the `reassoc` flag so that LLVM may vectorise them; the order is
then fixed by the generated code, so results stay deterministic from run to run. Float max and
min fold with llvm.maximum / llvm.minimum, which propagate NaN as NumPy's max/min do and which
the loop vectoriser recognises as reductions.
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


def better(b: ir.IRBuilder, op: str, value: ir.Value, best: ir.Value, dtype: DType) -> ir.Value:
    """Whether `value` replaces `best` in a max/min (first occurrence wins; NaN beats numbers)."""
    bigger = op in ("max", "argmax")
    if dtype.is_float:
        strict = b.fcmp_ordered(">" if bigger else "<", value, best)
        nan_wins = b.and_(b.fcmp_unordered("uno", value, value), b.fcmp_ordered("ord", best, best))
        return b.or_(strict, nan_wins)
    return icmp(b, dtype, ">" if bigger else "<", value, best)
