"""Fusion: grouping a Graph's equations into kernels.

Equations are visited from the outputs back. Each producer joins the kernel of its consumers
when they all sit in one kernel and the joined group still lowers to a single kernel (the rules
of `lowering`); a cheap producer needed by several kernels is recomputed in each of them; every
other producer gets a kernel of its own and its value is written to memory. A producer only
ever joins the kernel of *all* its consumers, so no fusion can create a cycle. Each refusal is
recorded with its reason, for the "fusion" dump.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from glue.ir import Graph, Var
from glue.ir.printer import graph_var_names
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.lowering import EXPENSIVE, REDUCTIONS, FusionRefused, lower_group

_NEVER_COPIED = EXPENSIVE | set(REDUCTIONS) | {"dot_general", "scatter_add", "gather"}


@dataclass(frozen=True)
class Refusal:
    """Equation `eqn` was not fused into the kernel holding `into`: `reason`."""

    eqn: int
    into: int
    reason: str


@dataclass
class Fusion:
    """The kernels of a Graph in execution order, each with the equations it computes."""

    graph: Graph
    groups: list[list[int]]
    outputs: list[list[Var]]
    kernels: list[Kernel]
    refusals: list[Refusal] = field(default_factory=list)

    def __str__(self) -> str:
        from glue.ir.printer import format_param

        names = graph_var_names(self.graph)
        lines = []
        for k, (kernel, eqns, outs) in enumerate(zip(self.kernels, self.groups, self.outputs)):
            lines.append(f"kernel {k} {kernel.kind} {kernel.name}: writes "
                         + ", ".join(f"{names[v.id]}:{v.type}" for v in outs))
            for i in eqns:
                e = self.graph.eqns[i]
                params = " ".join(f"{key}={format_param(v)}" for key, v in e.params)
                args = " ".join(names[a.id] if isinstance(a, Var) else str(a) for a in e.inputs)
                lines.append(f"    {names[e.outvars[0].id]} = {e.primitive}"
                             f"{'[' + params + ']' if params else ''} {args}")
        if self.refusals:
            lines.append("refused:")
            for r in self.refusals:
                e = self.graph.eqns[r.eqn]
                lines.append(f"    {names[e.outvars[0].id]} = {e.primitive} not into the kernel of "
                             f"{names[self.graph.eqns[r.into].outvars[0].id]}: {r.reason}")
        return "\n".join(lines)


class _Fuser:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.eqns = graph.eqns
        self.consumers: dict[int, list[int]] = {}
        for i, e in enumerate(self.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    self.consumers.setdefault(a.id, []).append(i)
        self.external = {a.id for a in graph.outvars if isinstance(a, Var)}
        self.groups: dict[int, set[int]] = {}
        self.groups_of: dict[int, set[int]] = {}  # eqn -> groups computing it
        self.home: dict[int, int] = {}  # var id -> group that writes it to memory
        self.refusals: list[Refusal] = []

    def outputs(self, gid: int, members: set[int]) -> list[Var]:
        outs = []
        for i in sorted(members):
            v = self.eqns[i].outvars[0]
            if self.home.get(v.id) != gid:
                continue
            if v.id in self.external or any(c not in members for c in self.consumers.get(v.id, [])):
                outs.append(v)
        return outs

    def lower(self, gid: int, members: set[int]) -> Kernel:
        return lower_group([self.eqns[i] for i in sorted(members)], self.outputs(gid, members), str(gid))

    def try_join(self, i: int, gid: int, as_home: bool) -> bool:
        members = self.groups[gid] | {i}
        v = self.eqns[i].outvars[0]
        previous = self.home.get(v.id)
        if as_home:
            self.home[v.id] = gid
        try:
            self._check_prologue(i, members)
            self.lower(gid, members)
        except FusionRefused as why:
            if as_home:
                self.home.pop(v.id) if previous is None else self.home.__setitem__(v.id, previous)
            self.refusals.append(Refusal(i, max(self.groups[gid]), str(why)))
            return False
        self.groups[gid] = members
        self.groups_of.setdefault(i, set()).add(gid)
        return True

    def _check_prologue(self, i: int, members: set[int]) -> None:
        """Only cheap work may feed a contraction: its operands are re-read for every tile."""
        dots = [j for j in members if self.eqns[j].primitive == "dot_general"]
        if not dots or self.eqns[i].primitive not in _NEVER_COPIED | {"div", "rem"}:
            return
        frontier, seen = [i], {i}
        while frontier:
            j = frontier.pop()
            for c in self.consumers.get(self.eqns[j].outvars[0].id, []):
                if c in dots:
                    raise FusionRefused("only casts and layout changes are fused before a contraction")
                if c in members and c not in seen:
                    seen.add(c)
                    frontier.append(c)

    def new_group(self, i: int) -> int:
        gid = len(self.groups)
        self.groups[gid] = {i}
        self.groups_of.setdefault(i, set()).add(gid)
        self.home[self.eqns[i].outvars[0].id] = gid
        return gid

    def run(self) -> Fusion:
        for i in reversed(range(len(self.eqns))):
            self.place(i)
        return self.finish()

    def place(self, i: int) -> None:
        v = self.eqns[i].outvars[0]
        if v.id not in self.external and not self.consumers.get(v.id):
            return  # dead: nothing reads it
        users = {g for c in self.consumers.get(v.id, []) for g in self.groups_of.get(c, ())}
        if len(users) == 1:
            (gid,) = users
            if not self.try_join(i, gid, as_home=True):
                self.new_group(i)
            return
        if users and self.eqns[i].primitive not in _NEVER_COPIED:
            joined = [gid for gid in sorted(users) if self.try_join(i, gid, as_home=False)]
            if len(joined) == len(users) and v.id not in self.external:
                return
        elif users:
            anchor = min(self.consumers[v.id])
            self.refusals.append(Refusal(i, anchor, f"used by {len(users)} kernels and too "
                                                    "expensive to recompute in each"))
        self.new_group(i)

    def finish(self) -> Fusion:
        order = self._topological([gid for gid in self.groups])
        groups = [sorted(self.groups[g]) for g in order]
        outputs = [self.outputs(g, self.groups[g]) for g in order]
        kernels = [lower_group([self.eqns[i] for i in eqns], outs, str(k))
                   for k, (eqns, outs) in enumerate(zip(groups, outputs))]
        return Fusion(self.graph, groups, outputs, kernels, self.refusals)

    def _topological(self, gids: list[int]) -> list[int]:
        """Kernels in an order where each runs after the kernels whose outputs it reads."""
        deps = {g: set() for g in gids}
        for g in gids:
            for i in self.groups[g]:
                for a in self.eqns[i].inputs:
                    if isinstance(a, Var) and a.id in self.home and self.home[a.id] != g:
                        deps[g].add(self.home[a.id])
        order, done = [], set()
        # Group ids grow from the outputs backwards; visiting producers-first in ascending
        # first-equation order keeps the kernel order close to the program's.
        pending = sorted(gids, key=lambda g: min(self.groups[g]))
        while pending:
            ready = next(g for g in pending if deps[g] <= done)
            order.append(ready)
            done.add(ready)
            pending.remove(ready)
        return order


def fuse(graph: Graph) -> Fusion:
    """Group the equations of `graph` into kernels."""
    return _Fuser(graph).run()
