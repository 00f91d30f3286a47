"""Online softmax for rows too long to hold: a max and the sum of exponentials relative to it,
folded in one pass over the row instead of two.

A softmax or log-sum-exp over a row reduces m = max(x) and then s = sum(exp(x - m)). Where the
row is re-read from HBM on each pass (rows so long that the rows in flight outgrow L2), folding
both in one pass saves a read of the row: each chunk of a thread's elements
raises the running max from m to m' and rescales the running sum by exp(m - m') before adding
its own exp(x - m'); two partial results merge the same way (`OnlineSum.combine`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from llvmlite import ir

from glue.backend_cuda.codegen.fastmath import exp_f32
from glue.codegen import reductions
from glue.codegen.scope import Analysis
from glue.codegen.types import F32
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Kernel, Op, Reduction, RowValue

if TYPE_CHECKING:
    from glue.backend_cuda.codegen.common import KernelEmitter, LaneGroup

ONLINE_DTYPES = (dt.float32, dt.bfloat16, dt.float16)


def online_pairs(kernel: Kernel, analysis: Analysis) -> dict[int, int]:
    """max reduction -> a float32 sum of exp(x - that max) over the same x (a softmax's or a
    log-sum-exp's two reductions), which one pass can fold together."""
    pairs: dict[int, int] = {}
    for j, r in enumerate(kernel.reductions):
        e = r.value
        while isinstance(e, Op) and e.primitive == "convert_element_type" and e.args[0].dtype in ONLINE_DTYPES:
            e = e.args[0]  # widened, as 16-bit exponentials are summed in float32
        if r.op != "sum" or r.dtype != dt.float32 or not (isinstance(e, Op) and e.primitive == "exp"):
            continue
        d = e.args[0]
        if not (isinstance(d, Op) and d.primitive == "sub" and isinstance(d.args[1], RowValue)):
            continue
        i = d.args[1].k
        m = kernel.reductions[i]
        if m.op == "max" and m.value == d.args[0] and m.value.dtype in ONLINE_DTYPES \
                and analysis.uses(r.value).rows == {i} and i not in pairs:
            pairs[i] = j
    return pairs


@dataclass(frozen=True)
class OnlineSum:
    """The running max m (of `reduction`) and sum s (of `total`, relative to m) of one thread or
    group. Duck-types `Partial` for `KernelEmitter.group_reduce`; elements come in by chunk
    (`add_chunk`), since the chunk's own max must be known before its exponentials."""

    reduction: Reduction   # the max
    total: Reduction       # the sum of exponentials
    values: tuple[ir.Value, ir.Value]

    @staticmethod
    def start(m: Reduction, total: Reduction) -> "OnlineSum":
        return OnlineSum(m, total, (reductions.identity("max", m.value.dtype), reductions.identity("sum", dt.float32)))

    def with_values(self, values: Sequence[ir.Value]) -> "OnlineSum":
        return OnlineSum(self.reduction, self.total, tuple(values))

    def add(self, b: ir.IRBuilder, value: ir.Value, position: ir.Value, valid: ir.Value | None) -> "OnlineSum":
        return self

    def add_chunk(self, b: ir.IRBuilder, k: int, groups: list[tuple["LaneGroup", ir.Value | None]]) -> "OnlineSum":
        """Fold in a chunk: the vector groups of this thread (each with its validity); `k` is
        the max's index among the kernel's reductions."""
        dtype = self.reduction.value.dtype
        chunk = [(em, valid) for lanes, valid in groups for em in lanes.emitters]
        top = self.values[0]
        for em, valid in chunk:
            x = em.value(self.reduction.value)
            top = reductions.combine(b, "max", top, x if valid is None else
                                     b.select(valid, x, reductions.identity("max", dtype)), dtype)
        total = b.fmul(self.values[1], rescale(b, self.values[0], top))
        for em, valid in chunk:
            em.rows = list(em.rows)  # this chunk's exponentials are relative to its new maximum
            em.rows[k] = top
            term = em.value(self.total.value)
            total = b.fadd(total, term if valid is None else b.select(valid, term, ir.Constant(F32, 0.0)))
        return self.with_values((top, total))

    def combine(self, b: ir.IRBuilder, other: "OnlineSum") -> "OnlineSum":
        (m1, s1), (m2, s2) = self.values, other.values
        top = reductions.combine(b, "max", m1, m2, self.reduction.value.dtype)
        total = b.fadd(b.fmul(s1, rescale(b, m1, top)), b.fmul(s2, rescale(b, m2, top)))
        return self.with_values((top, total))

    def shuffled(self, ke: "KernelEmitter", mask: int) -> "OnlineSum":
        return self.with_values(tuple(ke.shuffle_xor(v, mask) for v in self.values))


def rescale(b: ir.IRBuilder, old: ir.Value, new: ir.Value) -> ir.Value:
    """exp(old - new) for a partial sum taken relative to `old`, now relative to `new` >= old;
    1 when they are equal (so two infinite maxima do not make NaN)."""
    same = b.fcmp_unordered("==", old, new)
    return b.select(same, ir.Constant(F32, 1.0), exp_f32(b, b.fsub(old, new)))
