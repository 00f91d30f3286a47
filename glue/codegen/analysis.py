"""What one call of a compiled program costs, shared by the backends: the memory it needs
(from the scheduler's memory plan, itemised: what is live where the arena is fullest, by
value and by the user's source line) and an estimate of its arithmetic and memory traffic."""
from __future__ import annotations

import math
from dataclasses import dataclass

from glue.codegen.scope import Analysis
from glue.ir import TensorType, primitive
from glue.ir.printer import graph_var_names
from glue.scheduler.kernel_ir import Op, subexpressions
from glue.scheduler.plan import Plan


@dataclass(frozen=True)
class LiveValue:
    """An arena value live at the peak: its printed name and type, the primitive and the user's
    line that made it, and the kernels (positions) from its writer to its last reader."""

    name: str
    type: TensorType
    primitive: str
    source: str | None
    first: int
    last: int

    @property
    def nbytes(self) -> int:
        return self.type.nbytes


@dataclass(frozen=True)
class MemoryAnalysis:
    """Bytes a call needs: arguments, fresh outputs, the arena of intermediates (peak is their
    sum), against one buffer per value; scratch is the per-thread working memory on top.

    The itemisation: `live_peak_bytes` is the most arena bytes live at once (at kernel
    `peak_kernel`, named `peak_kernel_name`; the arena exceeds it only by what packing cannot
    fit), and `live_at_peak` the values live there, largest first: in a training step, the
    activations the forward saved for the backward."""

    peak_bytes: int
    naive_bytes: int
    arena_bytes: int
    argument_bytes: int
    output_bytes: int
    scratch_bytes: int
    live_peak_bytes: int = 0
    peak_kernel: int = -1
    peak_kernel_name: str = ""
    live_at_peak: tuple[LiveValue, ...] = ()

    def by_source(self) -> list[tuple[str, int, int]]:
        """(source line, bytes, values) of what is live at the peak, the most bytes first."""
        lines: dict[str, list[int]] = {}
        for v in self.live_at_peak:
            entry = lines.setdefault(v.source or "?", [0, 0])
            entry[0] += v.nbytes
            entry[1] += 1
        return sorted(((s, b, n) for s, (b, n) in lines.items()), key=lambda t: -t[1])

    def report(self, top: int = 20) -> str:
        """The analysis as text: totals, then what is live at the peak by line and by value."""
        mib = 2 ** 20
        lines = [f"peak {self.peak_bytes / mib:.1f} MiB = arguments {self.argument_bytes / mib:.1f} + arena "
                 f"{self.arena_bytes / mib:.1f} + outputs {self.output_bytes / mib:.1f} (scratch "
                 f"{self.scratch_bytes / mib:.1f}); naive {self.naive_bytes / mib:.1f}",
                 f"most live in the arena: {self.live_peak_bytes / mib:.1f} MiB at kernel {self.peak_kernel} "
                 f"{self.peak_kernel_name}, {len(self.live_at_peak)} values"]
        lines += [f"  {b / mib:9.1f} MiB  {n:3d} values  {s}" for s, b, n in self.by_source()[:top]]
        lines.append("largest live values:")
        lines += [f"  {v.nbytes / mib:9.1f} MiB  {v.name}:{v.type} = {v.primitive} (kernels {v.first}..{v.last})"
                  f"  {v.source or '?'}" for v in self.live_at_peak[:top]]
        return "\n".join(lines)


def analyse_memory(plan: Plan, scratch_bytes: int = 0) -> MemoryAnalysis:
    """The memory analysis of a Plan, with what is live at the peak itemised."""
    m = plan.memory
    live = m.live_bytes()
    peak = max(range(len(live)), key=live.__getitem__, default=-1)
    made = {v.id: e for e in plan.graph.eqns for v in e.outvars}
    names = graph_var_names(plan.graph)
    values = []
    for vid, p in m.placements.items():
        first, last = m.lifetimes.get(vid, (0, -1))
        if p.kind == "arena" and first <= peak <= last:
            eqn = made.get(vid)
            values.append(LiveValue(names.get(vid, f"#{vid}"), p.type, eqn.primitive if eqn else "?",
                                    eqn.source if eqn else None, first, last))
    values.sort(key=lambda v: (-v.nbytes, v.first, v.name))
    return MemoryAnalysis(m.peak_bytes, m.naive_bytes, m.arena_bytes, m.argument_bytes, m.output_bytes,
                          scratch_bytes, live[peak] if live else 0, peak,
                          plan.kernels[peak].name if peak >= 0 else "", tuple(values))


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
