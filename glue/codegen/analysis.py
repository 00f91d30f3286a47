"""What one call of a compiled program costs, shared by the backends: the memory it needs
(from the scheduler's memory plan) and an estimate of its arithmetic and memory traffic."""
from __future__ import annotations

import math
from dataclasses import dataclass

from glue.codegen.scope import Analysis
from glue.scheduler.kernel_ir import Op, subexpressions
from glue.ir import primitive
from glue.scheduler.plan import Plan


@dataclass(frozen=True)
class MemoryAnalysis:
    """Bytes a call needs: arguments, fresh outputs, the arena of intermediates (peak is their
    sum), against one buffer per value; scratch is the per-thread working memory on top."""

    peak_bytes: int
    naive_bytes: int
    arena_bytes: int
    argument_bytes: int
    output_bytes: int
    scratch_bytes: int


@dataclass(frozen=True)
class CostAnalysis:
    """Estimated work of one call: floating-point operations (a multiply-add counts two;
    transcendental functions are counted apart), and bytes the kernels read and write."""

    flops: float
    transcendentals: float
    bytes_accessed: float


def estimate_cost(plan: Plan) -> CostAnalysis:
    """Operations and bytes of one call: an element-level operation counts once per point of
    its kernel's domain, a row-level one once per row; a float sum or dot adds one per point."""
    flops = transcendentals = traffic = 0.0
    for kernel in plan.kernels:
        rows = math.prod(kernel.parallel)
        points = rows * math.prod(kernel.reduce)
        reduce_dims = frozenset(range(len(kernel.parallel), kernel.rank))
        analysis = Analysis()
        for e in subexpressions(kernel.roots):
            if isinstance(e, Op) and e.dtype.is_float and e.primitive != "convert_element_type":
                count = points if analysis.inside(e, reduce_dims) else rows
                if primitive(e.primitive).expensive:
                    transcendentals += count
                else:
                    flops += count
        flops += points * sum(r.op == "sum" and r.dtype.is_float for r in kernel.reductions)
        traffic += sum(b.type.nbytes for b in kernel.inputs + kernel.outputs)
    return CostAnalysis(flops, transcendentals, traffic)
