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

from glue.ir import Graph, Var, primitive
from glue.ir.printer import graph_var_names
from glue.scheduler.calls import lower_call
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.lowering import FusionRefused, lower_group


def _never_copied(name: str) -> bool:
    """Work a kernel never recomputes for another kernel that reads it: expensive math,
    reductions, contractions and data movement through indices."""
    prim = primitive(name)
    return prim.expensive or prim.fold is not None or prim.kind in ("contraction", "index")


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

    def call(self, members: set[int]) -> int | None:
        """The equation of an opaque primitive that is a group's only member (a call kernel)."""
        if len(members) != 1:
            return None
        i = next(iter(members))
        return i if primitive(self.eqns[i].primitive).opaque else None

    def outputs(self, gid: int, members: set[int]) -> list[Var]:
        """What kernel `gid` writes: its values that the program returns or that a consumer in
        another kernel, which does not compute them itself, reads."""
        if self.call(members) is not None:
            return list(self.eqns[self.call(members)].outvars)
        outs = []
        for i in sorted(members):
            v = self.eqns[i].outvars[0]
            if self.home.get(v.id) != gid:
                continue
            if v.id in self.external or any(
                    c not in members if g == gid else i not in self.groups[g]
                    for c in self.consumers.get(v.id, []) for g in self.groups_of.get(c, {gid})):
                outs.append(v)
        return outs

    def lower(self, gid: int, members: set[int], name: str | None = None) -> Kernel:
        if self.call(members) is not None:
            return lower_call(self.eqns[self.call(members)], str(gid) if name is None else name)
        return lower_group([self.eqns[i] for i in sorted(members)], self.outputs(gid, members),
                           str(gid) if name is None else name)

    def try_join(self, i: int, gid: int, as_home: bool) -> bool:
        if self.call(self.groups[gid]) is not None:
            self.refusals.append(Refusal(i, max(self.groups[gid]), "a call runs as a kernel of its own"))
            return False
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
        if not dots or primitive(self.eqns[i].primitive).moves_data_only:
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
        self.home.update({v.id: gid for v in self.eqns[i].outvars})
        return gid

    def run(self) -> Fusion:
        for i in reversed(range(len(self.eqns))):
            self.place(i)
        self.merge_siblings()
        return self.finish()

    def merge_siblings(self) -> None:
        """Merge kernels over the same domain that read a common input or one another's output
        (several reductions over the same rows, say): the data is read once, one launch saved."""
        domains = {g: self._domain(g) for g in self.groups}
        for a in sorted(self.groups, key=lambda g: min(self.groups[g])):
            for b in sorted(self.groups, key=lambda g: min(self.groups[g])):
                if a == b or a not in self.groups or b not in self.groups or domains[a] != domains[b] \
                        or domains[a][0] == "call":
                    continue
                if self._related(a, b) and not self._path_through_others(a, b) and \
                        not self._path_through_others(b, a):
                    self._try_merge(a, b)

    def _domain(self, gid: int) -> tuple:
        k = self.lower(gid, self.groups[gid])
        return k.kind, k.parallel, k.reduce

    def _related(self, a: int, b: int) -> bool:
        def reads(g):
            return {x.id for j in self.groups[g] for x in self.eqns[j].inputs if isinstance(x, Var)}
        return bool(reads(a) & reads(b)) or a in self.reads_from(b) or b in self.reads_from(a)

    def _path_through_others(self, a: int, b: int) -> bool:
        """Whether `a` depends on `b` through a third kernel (merging would make a cycle)."""
        return any(b in self.ancestors(x) for x in self.reads_from(a) - {b})

    def _try_merge(self, a: int, b: int) -> None:
        members = self.groups[a] | self.groups[b]
        saved = dict(self.home)
        for vid, g in self.home.items():
            if g == b:
                self.home[vid] = a
        try:
            self.lower(a, members)
        except FusionRefused:
            self.home = saved
            return
        self.groups[a] = members
        del self.groups[b]
        for gids in self.groups_of.values():
            if b in gids:
                gids.discard(b)
                gids.add(a)

    def place(self, i: int) -> None:
        if primitive(self.eqns[i].primitive).opaque:
            self.new_group(i)
            return
        v = self.eqns[i].outvars[0]
        if v.id not in self.external and not self.consumers.get(v.id):
            return  # dead: nothing reads it
        users = {g for c in self.consumers.get(v.id, []) for g in self.groups_of.get(c, ())}
        if len(users) == 1:
            (gid,) = users
            if not self.try_join(i, gid, as_home=True):
                self.new_group(i)
            return
        readers = set(users)
        if users and not _never_copied(self.eqns[i].primitive):
            readers -= {gid for gid in sorted(users) if self.try_join(i, gid, as_home=False)}
            if not readers and v.id not in self.external:
                return
        if users and self.join_one_as_home(i, users, readers):
            return
        self.new_group(i)

    def join_one_as_home(self, i: int, users: set[int], readers: set[int]) -> bool:
        """Compute the value in one consumer kernel, which also writes it for the others.

        That kernel must not itself depend on a kernel that reads the value (a cycle). Kernels
        without reductions are tried first: there the value can still reach its own producer's
        kernel as an epilogue (a reduction kernel cannot take in a contraction)."""
        def order(g: int) -> tuple[bool, int]:
            return any(primitive(self.eqns[j].primitive).fold for j in self.groups[g]), min(self.groups[g])

        for gid in sorted(users, key=order):
            others = readers - {gid}
            if others & self.ancestors(gid):
                continue
            if self.try_join(i, gid, as_home=True):
                return True
        return False

    def reads_from(self, gid: int) -> set[int]:
        """The kernels whose outputs kernel `gid` reads (values it does not compute itself)."""
        members = self.groups[gid]
        computed = {v.id for j in members for v in self.eqns[j].outvars}
        return {self.home[a.id] for j in members for a in self.eqns[j].inputs
                if isinstance(a, Var) and a.id not in computed and a.id in self.home}

    def ancestors(self, gid: int) -> set[int]:
        """The kernels `gid` reads from, directly or through others."""
        seen: set[int] = set()
        frontier = [gid]
        while frontier:
            for home in self.reads_from(frontier.pop()) - seen:
                seen.add(home)
                frontier.append(home)
        return seen

    def finish(self) -> Fusion:
        order = self._topological([gid for gid in self.groups])
        groups = [sorted(self.groups[g]) for g in order]
        outputs = [self.outputs(g, self.groups[g]) for g in order]
        kernels = [self.lower(g, self.groups[g], str(k)) for k, g in enumerate(order)]
        return Fusion(self.graph, groups, outputs, kernels, self.refusals)

    def _topological(self, gids: list[int]) -> list[int]:
        """Kernels in an order where each runs after the kernels whose outputs it reads."""
        deps = {g: self.reads_from(g) for g in gids}
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
