"""`schedule(graph) -> Plan`: simplify, fuse into kernels, assign streams, plan memory; and the
text of each scheduler stage ("optimized", "fusion", "kernels", "streams", "memory", "graph")."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from glue.ir import Graph, Literal, TensorType, Var
from glue.ir.printer import graph_var_names
from glue.scheduler.attention import AttentionPolicy, Tiled, tile_attention
from glue.scheduler.fusion import Fusion
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.memory import MemoryPlan, plan_memory
from glue.scheduler.passes import optimize
from glue.scheduler.remat import rematerialize
from glue.scheduler.streams import StreamPlan, plan_streams

STAGES = ("optimized", "fusion", "kernels", "streams", "memory", "graph")


@dataclass(frozen=True)
class Result:
    """How a graph output comes back from a call. kind is output (fresh output buffer `slot`),
    donated (argument `slot`'s buffer, which the kernels wrote), argument (a copy of argument
    `slot`: an input the program returns) or literal (`value` everywhere)."""

    kind: str
    slot: int
    type: TensorType
    value: Any = None


@dataclass
class Plan:
    """Everything a backend needs to run a Graph: kernels in order and where values live."""

    graph: Graph
    fusion: Fusion
    streams: StreamPlan
    memory: MemoryPlan

    @property
    def kernels(self) -> list[Kernel]:
        return self.fusion.kernels

    @property
    def argument_types(self) -> list[TensorType]:
        """What a call passes: the constvars' values, then the invars'."""
        return [v.type for v in self.graph.constvars + self.graph.invars]

    @property
    def output_types(self) -> list[TensorType]:
        """The fresh output buffers a call allocates, by slot."""
        outputs = sorted((p for p in self.memory.placements.values() if p.kind == "output"), key=lambda p: p.slot)
        return [p.type for p in outputs]

    def results(self) -> list[Result]:
        """How each of the graph's outputs is produced, in order."""
        placements = self.memory.placements
        return [Result("literal", -1, a.type, a.value) if isinstance(a, Literal) else
                Result(placements[a.id].kind, placements[a.id].slot, a.type) for a in self.graph.outvars]

    def as_text(self, stage: str) -> str:
        names = graph_var_names(self.graph)
        if stage == "optimized":
            return str(self.graph)
        if stage == "fusion":
            return str(self.fusion)
        if stage == "kernels":
            return "\n\n".join(str(k) for k in self.kernels)
        if stage == "streams":
            return self.streams.text(self.kernels)
        if stage == "memory":
            return self.memory.text(names)
        if stage == "graph":
            return graph_dot(self.graph, self.fusion, names)
        raise KeyError(stage)


def prepare(optimized: Graph, policy: AttentionPolicy = AttentionPolicy()) -> Tiled:
    """What fusion starts from, given the optimized Graph: hand-written attention recognised and
    every attention tiled (glue/scheduler/attention.py), then rematerialized (remat.py: after
    optimize, whose CSE would merge the recomputed copies back, and after attention tiling,
    whose recognition a recomputed copy of the scores would defeat). `policy`: how the backend
    runs attention equations."""
    tiled = tile_attention(optimized, policy)
    return replace(tiled, graph=rematerialize(tiled.graph))


# Side streams hold memory: a value a side stream reads stays reserved until the main stream
# waits for that stream (streams.py's joins bound how long). A program takes them only when its
# planned peak grows by at most this much over one stream's, or by STREAM_SLACK_FRACTION of it.
# On the H100, four streams made the step suite's four configs 2-16% faster (their weight
# gradients, the norms' column reductions and the optimizer updates overlap the backward's chain)
# for 16-33% more planned memory, the peaks still below jax.jit's (benchmarks/RESULTS.md).
STREAM_SLACK_BYTES = 16 << 20
STREAM_SLACK_FRACTION = 0.35


def place(graph: Graph, fusion: Fusion, donated: Sequence[int] = (), max_streams: int = 1) -> Plan:
    """The Plan of `fusion`'s kernels: their streams and memory, on up to `max_streams` streams
    where that costs little memory, else on one."""
    plans = []
    for n in sorted({1, max_streams}):
        streams = plan_streams(fusion.kernels, n)
        if plans and streams.n_streams == 1:  # nothing ran beside anything: the plan of one stream
            break
        plans.append(Plan(graph, fusion, streams, plan_memory(graph, fusion.kernels, donated, streams)))
    one, most = plans[0].memory.peak_bytes, plans[-1].memory.peak_bytes
    return plans[-1] if most - one <= max(STREAM_SLACK_BYTES, STREAM_SLACK_FRACTION * one) else plans[0]


def schedule(graph: Graph, donated: Sequence[int] = (), max_streams: int = 1) -> Plan:
    """The Plan for `graph`; `donated` lists invar positions whose buffers outputs may reuse;
    independent kernels go on up to `max_streams` streams (1 for a target that runs kernels one
    at a time) where that costs little memory (`place`)."""
    tiled = prepare(optimize(graph))
    return place(tiled.graph, tiled.fused(), donated, max_streams)


def graph_dot(graph: Graph, fusion: Fusion, names: dict[int, str]) -> str:
    """Graphviz DOT of the program, each kernel drawn as a cluster around its equations."""
    lines = ["digraph glue {", "  rankdir=TB; node [shape=box, fontname=monospace, fontsize=10];"]
    for v in graph.constvars + graph.invars:
        lines.append(f'  v{v.id} [label="{names[v.id]}: {v.type}", shape=ellipse];')
    for k, (kernel, eqns) in enumerate(zip(fusion.kernels, fusion.groups)):
        lines.append(f'  subgraph cluster_{k} {{ label="{kernel.name} ({kernel.kind})"; style=rounded;')
        for i in eqns:
            e = graph.eqns[i]
            lines.append(f'    e{k}_{i} [label="{names[e.outvars[0].id]} = {e.primitive}\\n{e.outvars[0].type}"];')
        lines.append("  }")
    homes = {}
    for k, eqns in enumerate(fusion.groups):
        for i in eqns:
            homes.setdefault(graph.eqns[i].outvars[0].id, f"e{k}_{i}")
    for k, eqns in enumerate(fusion.groups):
        local = {graph.eqns[i].outvars[0].id: f"e{k}_{i}" for i in eqns}
        for i in eqns:
            for a in graph.eqns[i].inputs:
                if isinstance(a, Var):
                    src = local.get(a.id) or homes.get(a.id) or f"v{a.id}"
                    lines.append(f"  {src} -> e{k}_{i};")
    for j, a in enumerate(graph.outvars):
        label = names.get(a.id, "?") if isinstance(a, Var) else str(a)
        lines.append(f'  out{j} [label="out {j}: {label}", shape=ellipse];')
        if not isinstance(a, Literal):
            lines.append(f"  {homes.get(a.id, f'v{a.id}')} -> out{j};")
    lines.append("}")
    return "\n".join(lines)
