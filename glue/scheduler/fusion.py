"""Fusion: grouping a Graph's equations into kernels.

Legality and profitability are decided apart, as Inductor's scheduler keeps "why not fuse"
apart from its score:

- Legality comes from each group's summary: its domain (kind, parallel and reduce extents,
  element shape), its contraction, scatter and reductions, and a `SiteWalk`: which values it
  computes at which indices and where it reads each value it takes from memory. Whether an
  equation may join a group follows from the places the group reads the equation's value at,
  pushed through the equation's index rule (the same `reads` half lowering builds expressions
  with), so no attempt builds a kernel; `lower_group` runs once per distinct final kernel.
- Profitability is a score in bytes: the memory traffic a fusion saves (values no longer
  written and read back, inputs read once instead of twice), plus `LAUNCH_BYTES` per launch it
  saves, less what it adds (operands a recomputing kernel must read, the recomputation itself).
  A candidate whose score is not positive is refused as "not profitable".

Equations are visited from the outputs back. Each producer joins the kernel of its consumers
when they all sit in one kernel; a cheap producer needed by several kernels is recomputed in
each of them where that pays; otherwise it is computed in one consumer kernel that writes it
for the others, or gets a kernel of its own. A producer only ever joins the kernel of *all* its
consumers or is written for them, so the kernels stay acyclic (a `KernelDag` keeps their
dependency order and checks the cases that could close a cycle). Then kernels over the same domain that
read a common input or one another's output merge, best score first. Every refusal is recorded
with its reason, for the "fusion" stage. Equations with several results, and opaque primitives,
are kernels of their own.

Memory counts too, as bytes against a score: a merge or a join that would make a kernel run
far from where its equations are (a backward kernel pulled into the forward, a weight
gradient held back for a late epilogue operand) keeps values alive across the kernels between
(`_moved_bytes`, `_delayed_bytes`); a kernel runs at its own earliest equation, not at a cheap
copy recomputed in it (`_Group.at`); and a narrowing cast of a computed value is computed with
it, so memory holds the narrow value.
"""
from __future__ import annotations

import heapq
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Callable, Container, Iterable, Iterator

from glue.ir import Eqn, Graph, Var, primitive
from glue.ir.printer import format_param, graph_var_names
from glue.scheduler.calls import lower_call
from glue.scheduler.dag import KernelDag
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.lowering import (Domain, FusionRefused, GroupLowering, SiteWalk, check_contents,
                                     check_scatter_target, contraction_reads, kernel_domain,
                                     placement, reduction_read, root_reads, row_signature, scatter_reads)

# A kernel launch costs about the time it takes to move this many bytes (a few microseconds of
# launch and synchronisation, at the tens of GB/s a small kernel reaches).
LAUNCH_BYTES = 64 * 1024
# What evaluating a cheap operation once more costs, in bytes of memory traffic: a kernel that
# is bound by memory does several operations in the time it moves a byte.
RECOMPUTE_BYTES_PER_ELEMENT = 0.125
# How many equations back the estimate of what a recomputed value reads looks.
SOURCE_DEPTH = 16
# The most values a kernel computes per point, counted once for every pass over a row that
# computes them (a row kernel with chained reductions recomputes its element values in each
# pass). Past this a kernel costs more to compile than fusing saves at run time: LLVM's
# optimisation time grows with the square of a loop body (a 2,500-operation body takes 3 s,
# 5,000 take 11 s), while splitting a long chain every few hundred operations adds only a
# write and a read per element to hundreds of operations on it.
MAX_KERNEL_SIZE = 256
# How many kernels between two merged kernels count against the merge, each once, for what
# the later one writes being alive across them (see `_Fuser._moved_bytes`).
MOVE_SPAN = 4


def _never_copied(name: str) -> bool:
    """Work a kernel never recomputes for another kernel that reads it: expensive math,
    reductions, contractions and data movement through indices."""
    prim = primitive(name)
    return prim.expensive or prim.fold is not None or prim.kind in ("contraction", "index")


def _own_kernel(eqn: Eqn) -> bool:
    """An equation with several results, or of an opaque primitive, is never fused."""
    return len(eqn.outvars) != 1 or primitive(eqn.primitive).opaque


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
    notes: list[str] = field(default_factory=list)  # what was recognised before fusing (attention)

    def __str__(self) -> str:
        names = graph_var_names(self.graph)

        def results(e: Eqn) -> str:
            return " ".join(names[v.id] for v in e.outvars)

        lines = []
        for k, (kernel, eqns, outs) in enumerate(zip(self.kernels, self.groups, self.outputs)):
            lines.append(f"kernel {k} {kernel.kind} {kernel.name}: writes "
                         + ", ".join(f"{names[v.id]}:{v.type}" for v in outs))
            for i in eqns:
                e = self.graph.eqns[i]
                params = " ".join(f"{key}={format_param(v)}" for key, v in e.params)
                args = " ".join(names[a.id] if isinstance(a, Var) else str(a) for a in e.inputs)
                lines.append(f"    {results(e)} = {e.primitive}{'[' + params + ']' if params else ''} {args}")
        if self.notes:
            lines.append("recognised:")
            lines.extend(f"    {note}" for note in self.notes)
        if self.refusals:
            lines.append("refused:")
            for r in self.refusals:
                e = self.graph.eqns[r.eqn]
                lines.append(f"    {results(e)} = {e.primitive} not into the kernel of "
                             f"{results(self.graph.eqns[r.into])}: {r.reason}")
        return "\n".join(lines)


def _kernel_size(sites: int, levels: int) -> int:
    """What a kernel costs to compile: the values it computes per point (`sites` of its walk),
    once per pass over a row (one more than its chained reductions, `levels`)."""
    return sites * (levels + 1)


class _Group:
    """A kernel being formed: its equations and the summary fusion decides by."""

    def __init__(self, gid: int, eqn_index: int, eqn: Eqn):
        self.gid = gid
        self.order = gid  # breaks ties in the kernel order: merged groups keep the earlier one's
        self.members: set[int] = {eqn_index}
        self.first = self.last = eqn_index
        # Where the kernel runs in the order (its earliest equation that is not a cheap copy
        # recomputed for it: a copy of a forward value in a backward kernel must not pull that
        # kernel, and its outputs' lifetimes, into the forward).
        self.at = eqn_index
        self.defined: dict[int, Eqn] = {v.id: eqn for v in eqn.outvars}
        self.own = _own_kernel(eqn)
        self.dot = eqn if eqn.primitive == "dot_general" else None
        self.scatter = eqn if eqn.primitive == "scatter_add" else None
        self.fold = eqn if primitive(eqn.primitive).fold else None
        self.folds = int(self.fold is not None)
        self.feeds_dot: set[int] = set()  # members whose values flow into the contraction
        # member -> how many reductions its value passes through, itself included, on the way to
        # the kernel's outputs; the most of them is the number of chained row reductions
        self.folds_above: dict[int, int] = {eqn_index: self.folds}
        self.levels = self.folds
        self.outputs: dict[int, Var] = {}  # values written for other kernels or the caller
        self.domain: Domain | None = None
        self.walk: SiteWalk | None = None

    def add(self, i: int, eqn: Eqn, copy: bool = False) -> None:
        self.members.add(i)
        self.first, self.last = min(self.first, i), max(self.last, i)
        if not copy:
            self.at = min(self.at, i)
        self.defined.update((v.id, eqn) for v in eqn.outvars)
        if eqn.primitive == "dot_general":
            self.dot = eqn
        elif eqn.primitive == "scatter_add":
            self.scatter = eqn
        elif primitive(eqn.primitive).fold:
            self.fold = self.fold or eqn
            self.folds += 1

    @property
    def merge_key(self) -> tuple | None:
        """Kernels may merge only with kernels of the same key (None: with none)."""
        if self.own or self.domain.kind not in ("pointwise", "reduction"):
            return None
        return self.domain, row_signature(self.fold) if self.fold else None


@dataclass
class _Trial:
    """A legal candidate's effect on its group, kept until it is taken."""

    domain: Domain
    walk: SiteWalk
    extends: bool  # walk extends the group's walk (else it replaces it)
    output: bool  # the joining value becomes an output of the group
    folds_above: int  # of the joining equation (see `_Group.folds_above`)
    size: int  # of the group with it (see `_kernel_size`)


class _Fuser:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.eqns = graph.eqns
        self.vars: dict[int, Var] = {v.id: v for v in graph.constvars + graph.invars}
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list[int]] = {}
        for i, e in enumerate(self.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    self.consumers.setdefault(a.id, []).append(i)
            for v in e.outvars:
                self.vars[v.id] = v
                self.producer[v.id] = i
        self.external = {a.id for a in graph.outvars if isinstance(a, Var)}
        self.groups: dict[int, _Group] = {}
        self.groups_of: dict[int, set[int]] = {}  # eqn -> groups computing it
        self.home: dict[int, int] = {}  # var id -> group that writes it to memory
        self.dag = KernelDag()
        self.refusals: list[Refusal] = []
        self._sources: dict[int, set[int]] = {}  # see `sources`
        self.lower = GroupLowering()  # each distinct group lowered once

    # --- what kernels read and write ------------------------------------------------------------
    def readers(self, var: Var, computing: Iterable[int] = ()) -> set[int]:
        """The groups that read `var` from memory: those holding a consumer but not its producer
        (nor in `computing`, groups about to compute it)."""
        return set(self._readers(var, set(computing)))

    def _readers(self, var: Var, skip: Container[int]) -> Iterator[int]:
        i = self.producer[var.id]
        return (g for c in self.consumers.get(var.id, ()) for g in self.groups_of.get(c, ())
                if g not in skip and i not in self.groups[g].members)

    def needed(self, var: Var, writer: int) -> bool:
        """Whether group `writer`, computing `var`, must write it."""
        return var.id in self.external or next(self._readers(var, (writer,)), None) is not None

    def nbytes(self, vid: int) -> int:
        return self.vars[vid].type.nbytes

    def sources(self, i: int) -> set[int]:
        """The values a kernel reads from memory to compute equation i if it also computes the
        cheap work the equation is made from (fusion recomputes such work where it is needed):
        the results of expensive work, reductions, contractions and gathers, and the program's
        inputs (the search stops after SOURCE_DEPTH equations; what it has not expanded counts
        as read). Found once per equation: each kernel that might recompute it asks."""
        found = self._sources.get(i)
        if found is not None:
            return found
        found = self._sources[i] = set()
        stack = [a for a in self.eqns[i].inputs if isinstance(a, Var)]
        expanded = 0
        while stack:
            var = stack.pop()
            j = self.producer.get(var.id)
            if j is None or expanded == SOURCE_DEPTH or _never_copied(self.eqns[j].primitive) \
                    or _own_kernel(self.eqns[j]):
                found.add(var.id)
                continue
            expanded += 1
            stack.extend(a for a in self.eqns[j].inputs if isinstance(a, Var))
        return found

    def _new_bytes(self, values: Iterable[int], group: _Group) -> tuple[int, int]:
        """Bytes of `values`, and of those `group` neither reads nor computes yet."""
        total = new = 0
        for vid in values:
            total += self.nbytes(vid)
            if vid not in group.walk.reads and vid not in group.defined:
                new += self.nbytes(vid)
        return total, new

    # --- groups ---------------------------------------------------------------------------------
    def new_group(self, i: int) -> int:
        eqn = self.eqns[i]
        gid = len(self.groups)
        group = self.groups[gid] = _Group(gid, i, eqn)
        self.groups_of.setdefault(i, set()).add(gid)
        self.dag.add_node(gid)
        for v in eqn.outvars:
            self.home[v.id] = gid
            if self.needed(v, gid):
                group.outputs[v.id] = v
        if not group.own:
            group.domain = kernel_domain(group.dot, group.scatter, group.fold,
                                         [v.type.shape for v in group.outputs.values()])
            group.walk = SiteWalk(group.domain, group.defined)
            group.walk.visit(root_reads(group.domain, [eqn], list(group.outputs.values()), group.defined))
        self._link_readers(gid, eqn)
        return gid

    def _narrows_computed(self, eqn: Eqn) -> bool:
        """Whether `eqn` casts an elementwise result to a narrower type (mixed precision)."""
        if not primitive(eqn.primitive).cast or not isinstance(eqn.inputs[0], Var):
            return False
        source = self.producer.get(eqn.inputs[0].id)
        return source is not None and primitive(self.eqns[source].primitive).kind == "elementwise" \
            and eqn.outvars[0].type.dtype.itemsize < eqn.inputs[0].type.dtype.itemsize

    def _link_readers(self, gid: int, eqn: Eqn) -> None:
        """Edges from the group writing `eqn`'s values to the groups that read them."""
        for v in eqn.outvars:
            for r in self.readers(v, (gid,)):
                self.dag.add_edge(gid, r)

    def refuse(self, i: int, group: _Group, reason: str) -> bool:
        self.refusals.append(Refusal(i, group.last, reason))
        return False

    def _refusal(self, i: int, group: _Group) -> str | None:
        """Why equation i may never join `group`, whatever its indices."""
        eqn = self.eqns[i]
        if group.own:
            return f"{self.eqns[group.first].primitive} runs as a kernel of its own"
        if _own_kernel(eqn):
            return f"{eqn.primitive} runs as a kernel of its own"
        if group.dot is not None and not primitive(eqn.primitive).moves_data_only and self._feeds_dot(i, group):
            # Only cheap work may feed a contraction: its operands are re-read for every tile.
            return "only casts and layout changes are fused before a contraction"
        if group.dot is not None and self._narrows_computed(eqn) and self._feeds_dot(i, group):
            # Read through the cast, the wide value would be written for the contraction alone.
            return "a narrowing cast of a computed value is computed with that value, so memory holds the narrow one"
        return None

    def _feeds_dot(self, i: int, group: _Group) -> bool:
        dot = group.dot
        return any(c in group.feeds_dot or self.eqns[c] is dot
                   for v in self.eqns[i].outvars for c in self.consumers.get(v.id, ()) if c in group.members)

    def _trial(self, i: int, group: _Group, as_home: bool) -> _Trial:
        """What equation i joining `group` makes of it; FusionRefused if it cannot."""
        eqn = self.eqns[i]
        (var,) = eqn.outvars
        reduces = bool(primitive(eqn.primitive).fold)
        joining = i not in group.members
        output = as_home and var.id not in group.outputs and self.needed(var, group.gid)
        dot, scatter, fold = group.dot, group.scatter, group.fold
        dots, scatters, folds = int(dot is not None), int(scatter is not None), group.folds
        if joining:
            if eqn.primitive == "dot_general":
                dot, dots = eqn, dots + 1
            elif eqn.primitive == "scatter_add":
                scatter, scatters = eqn, scatters + 1
            elif reduces:
                fold, folds = fold or eqn, folds + 1
        check_contents(dots, scatters, folds)
        if joining and reduces and row_signature(eqn) != row_signature(fold):
            raise FusionRefused("reductions over different rows")
        outputs = list(group.outputs.values()) + ([var] if output else [])
        domain = kernel_domain(dot, scatter, fold, [v.type.shape for v in outputs])
        # a copy (of a few entries, usually) rather than a ChainMap: the walk looks up every
        # value it meets here, and a ChainMap's lookup costs several of a dict's
        defined = {**group.defined, var.id: eqn} if joining else group.defined
        above = group.folds_above.get(i, int(reduces) + max(
            (group.folds_above[c] for c in self.consumers.get(var.id, ()) if c in group.members), default=0))
        levels = max(group.levels, above)
        if domain != group.domain:
            members = [self.eqns[j] for j in sorted(group.members | {i})]
            walk = SiteWalk(domain, defined)
            walk.visit(root_reads(domain, members, outputs, defined))
            return _Trial(domain, walk, False, output, above, _kernel_size(len(walk.sites), levels))
        walk = SiteWalk(domain, defined, group.walk)
        requests = []
        if joining:
            if eqn.primitive == "dot_general":
                requests.extend(contraction_reads(domain, eqn))
            elif reduces:
                requests.append(reduction_read(domain, eqn))
            requests.extend((var, index, mask) for index, mask in group.walk.reads.get(var.id, ()))
        if group.scatter is not None and joining:
            check_scatter_target(group.scatter, defined)  # a scatter's store comes first
        if output:
            if eqn.primitive == "scatter_add":
                check_scatter_target(eqn, defined)
                picked, updates, _, _ = scatter_reads(domain, eqn)
                requests.extend([picked, updates])
            else:
                requests.append((var, placement(domain, var)[1], ()))
        walk.visit(requests)
        return _Trial(domain, walk, True, output, above,
                      _kernel_size(len(group.walk.sites) + len(walk.sites), levels))

    def _take(self, i: int, group: _Group, trial: _Trial, copy: bool) -> None:
        eqn = self.eqns[i]
        (var,) = eqn.outvars
        if i not in group.members:
            if group.dot is not None and self._feeds_dot(i, group):
                group.feeds_dot.add(i)
            group.add(i, eqn, copy)
            self.groups_of.setdefault(i, set()).add(group.gid)
            group.folds_above[i] = trial.folds_above
            group.levels = max(group.levels, trial.folds_above)
        if trial.output:
            group.outputs[var.id] = var
        group.domain = trial.domain
        if trial.extends:
            group.walk.absorb(trial.walk)
        else:
            group.walk = trial.walk
        group.walk.defined = group.defined
        group.walk.reads.pop(var.id, None)

    def try_join(self, i: int, gid: int, as_home: bool) -> bool:
        """Equation i joins group `gid`: as the home of its value (which the group then writes
        for other kernels where they need it), or as a recomputed copy for this group alone."""
        group = self.groups[gid]
        eqn = self.eqns[i]
        reason = self._refusal(i, group)
        if reason is not None:
            return self.refuse(i, group, reason)
        try:
            trial = self._trial(i, group, as_home)
        except FusionRefused as why:
            return self.refuse(i, group, str(why))
        if trial.size > MAX_KERNEL_SIZE:
            return self.refuse(i, group, self._too_large(trial.size))
        score, why = self._join_score(i, group, as_home)
        if score <= 0:
            return self.refuse(i, group, f"not profitable: {why()}")
        self._take(i, group, trial, copy=not as_home)
        if as_home:
            self.home[eqn.outvars[0].id] = gid
        return True

    @staticmethod
    def _too_large(size: int) -> str:
        return (f"not profitable: the kernel would compute {size} values per point (counting each pass "
                f"over a row), past {MAX_KERNEL_SIZE} it compiles slower than fusing saves")

    def _join_score(self, i: int, group: _Group, as_home: bool) -> tuple[float, Callable[[], str]]:
        """Bytes saved by equation i joining `group`, and what they are made of (written out when
        asked: only a refusal shows it)."""
        eqn = self.eqns[i]
        var = eqn.outvars[0]
        size = var.type.nbytes
        read_back = size if var.id in group.walk.reads else 0
        if as_home:
            # Against a kernel of its own: one launch, the value's write unless it is still
            # needed, its read back here, and the operands both kernels would read.
            operands, new = self._new_bytes({a.id for a in eqn.inputs if isinstance(a, Var)}, group)
            written = 0 if self.needed(var, group.gid) else size
            saved = LAUNCH_BYTES + written + read_back + operands - new - self._delayed_bytes(i, group)
            return saved, lambda: f"saves {saved} bytes"
        # Against reading the value from memory: that read, and the write it needs (the other
        # consumers are asked the same), for what computing it here reads (the cheap work it is
        # made from is recomputed here too) and the work done again.
        _, new = self._new_bytes(self.sources(i), group)
        work = var.type.size * RECOMPUTE_BYTES_PER_ELEMENT
        saved = read_back + size
        return saved - new - work, lambda: (f"recomputing {eqn.primitive} of {var.type} here reads {new} bytes "
                                            f"of operands and costs {work:g} bytes of work to save {saved} bytes")

    # --- the walk from the outputs back ---------------------------------------------------------
    def place(self, i: int) -> None:
        eqn = self.eqns[i]
        if not any(v.id in self.external or self.consumers.get(v.id) for v in eqn.outvars):
            return  # dead: nothing reads it
        if _own_kernel(eqn):
            self.new_group(i)
            return
        (var,) = eqn.outvars
        users = sorted({g for c in self.consumers.get(var.id, []) for g in self.groups_of.get(c, ())})
        if len(users) == 1:
            if not self.try_join(i, users[0], as_home=True):
                self.new_group(i)
            return
        readers = set(users)
        if users and not _never_copied(eqn.primitive):
            readers -= {gid for gid in users if self.try_join(i, gid, as_home=False)}
            if not readers and var.id not in self.external:
                return
        if users and self.join_one_as_home(i, users, readers):
            return
        self.new_group(i)

    def join_one_as_home(self, i: int, users: list[int], readers: set[int]) -> bool:
        """Compute the value in one consumer kernel, which also writes it for the others.

        That kernel must not itself depend on a kernel that reads the value (a cycle). Kernels
        without reductions are tried first: there the value can still reach its own producer's
        kernel as an epilogue (a reduction kernel cannot take in a contraction); then those
        that other kernels do not separate from the value (a far consumer made its home would
        run with it, its outputs alive from there on: a backward kernel pulled into the
        forward); then those with the best score, then the earliest."""
        def order(g: int) -> tuple[bool, bool, float, int]:
            group = self.groups[g]
            score = 0 if group.own else self._join_score(i, group, as_home=True)[0]
            return group.folds > 0, self._separated(i, group), -score, group.at

        for gid in sorted(users, key=order):
            others = readers - {gid}
            if others and self.dag.reaches(others, gid):
                self.refuse(i, self.groups[gid], "that kernel depends on a kernel that reads this value")
                continue
            if self.try_join(i, gid, as_home=True):
                for r in sorted(others):
                    self.dag.add_edge(gid, r)
                return True
        return False

    # --- sibling merges -------------------------------------------------------------------------
    def merge_siblings(self) -> None:
        """Merge kernels over the same domain that read a common input or one another's output
        (several reductions over the same rows, say): the data is read once, one launch saved.
        Candidates go best score first; a merge changes its kernels' later scores, so a
        candidate whose score moved goes back in the queue with the new one."""
        root = {g: g for g in self.groups}

        def find(g: int) -> int:
            while root[g] != g:
                root[g] = root[root[g]]
                g = root[g]
            return g

        version = dict.fromkeys(self.groups, 0)
        queue: list[tuple] = []

        def push(a: int, b: int) -> None:
            ga, gb = self.groups[a], self.groups[b]
            heapq.heappush(queue, (-self._merge_score(ga, gb), min(ga.at, gb.at), max(ga.at, gb.at),
                                   a, b, version[a], version[b]))

        for a, b in self._merge_candidates():
            push(a, b)
        tried: set[tuple[int, int, int, int]] = set()
        while queue:
            score, _, _, a, b, va, vb = heapq.heappop(queue)
            a, b = find(a), find(b)
            if a == b:
                continue
            if (va, vb) != (version[a], version[b]):
                push(a, b)  # one of them merged since: score it again
                continue
            if score >= 0:
                self.refuse(self.groups[b].last, self.groups[a], "not profitable: the later kernel's outputs "
                            "would be written before the kernels between the two and stay alive across them")
                continue
            if (a, b, va, vb) in tried or (b, a, vb, va) in tried:
                continue
            tried.add((a, b, va, vb))
            keep, gone = self._try_merge(a, b)
            if keep is not None:
                root[gone] = keep
                version[keep] += 1

    def _merge_candidates(self) -> list[tuple[int, int]]:
        """Pairs of groups with the same merge key: where one reads the other's output, where
        both read a common value (each reader paired with the first and with the previous one),
        and neighbours in program order (which save a launch even when they share nothing)."""
        readers: dict[tuple, list[int]] = {}
        same_key: dict[tuple, list[int]] = {}
        pairs = []
        for gid in sorted(self.groups, key=lambda g: self.groups[g].at):
            group = self.groups[gid]
            key = group.merge_key
            if key is None:
                continue
            same_key.setdefault(key, []).append(gid)
            for vid in group.walk.reads:
                readers.setdefault((vid, key), []).append(gid)
                home = self.home.get(vid)
                if home is not None and home != gid and self.groups[home].merge_key == key:
                    pairs.append((home, gid))
        for gids in readers.values():
            for k in range(1, len(gids)):
                pairs.append((gids[0], gids[k]))
                if k > 1:
                    pairs.append((gids[k - 1], gids[k]))
        for gids in same_key.values():
            pairs.extend(zip(gids, gids[1:]))
        return list(dict.fromkeys(pairs))

    def _passed(self, src: _Group, dst: _Group) -> Iterable[int]:
        """Values `src` writes that `dst` reads."""
        if len(src.outputs) < len(dst.walk.reads):
            return [vid for vid in src.outputs if vid in dst.walk.reads]
        return [vid for vid in dst.walk.reads if vid in src.outputs]

    def _merge_score(self, a: _Group, b: _Group) -> float:
        small, large = sorted((a.walk.reads, b.walk.reads), key=len)
        shared = sum(self.nbytes(vid) for vid in small if vid in large)
        passed = 0
        for src, dst in ((a, b), (b, a)):
            for vid in self._passed(src, dst):
                var = self.vars[vid]
                still = var.id in self.external or bool(self.readers(var, (a.gid, b.gid)))
                passed += self.nbytes(vid) * (1 if still else 2)
        return LAUNCH_BYTES + shared + passed - self._moved_bytes(a, b)

    def _between(self, lo: int, hi: int, pair: tuple[int, ...]) -> int:
        """How many kernels other than `pair` hold equations strictly between positions lo and
        hi, counted up to MOVE_SPAN."""
        between: set[int] = set()
        for i in range(lo + 1, hi):
            between.update(g for g in self.groups_of.get(i, ()) if g not in pair)
            if len(between) >= MOVE_SPAN:
                break
        return len(between)

    def _separated(self, i: int, group: _Group) -> bool:
        """Whether other kernels lie between equation i and the later `group`."""
        return group.at > i and self._between(i, group.at, (group.gid,)) > 0

    def _delayed_bytes(self, i: int, group: _Group) -> int:
        """What equation i joining `group` costs in memory when the group waits for a value made
        well after i (a weight gradient's epilogue adding the gradient the backward makes
        last): i's operands stay alive until then, across the kernels between (counted as in
        `_moved_bytes`)."""
        latest = max((self.producer[vid] for vid in group.walk.reads if vid in self.producer), default=-1)
        if latest <= i:
            return 0
        between = self._between(i, latest, (group.gid,))
        return between * sum(a.type.nbytes for a in self.eqns[i].inputs
                             if isinstance(a, Var) and a.id in self.producer)

    def _moved_bytes(self, a: _Group, b: _Group) -> int:
        """What a merge costs in memory: the merged kernel runs where the earlier of the two
        did, so what the later one writes is alive from there on, across the kernels between
        them (in a training step: a backward kernel pulled into the forward). Counted once per
        kernel between, up to MOVE_SPAN: holding memory across many kernels costs more than
        the one read a merge saves."""
        early, late = sorted((a, b), key=lambda g: g.at)
        between = self._between(early.last, late.at, (a.gid, b.gid))
        return between * sum(self.nbytes(vid) for vid in late.outputs if vid not in early.walk.reads)

    def _try_merge(self, a: int, b: int) -> tuple[int | None, int]:
        """Merge groups a and b; the kept group and the merged one, or (None, b) if refused."""
        keep, gone = sorted((a, b), key=lambda g: (-len(self.groups[g].members), g))
        gk, gg = self.groups[keep], self.groups[gone]
        if self.dag.path_between(keep, gone):
            self.refuse(gg.last, gk, "one of the two kernels reads the other through a third")
            return None, gone
        passed = [(src, dst, vid) for src, dst in ((gk, gg), (gg, gk)) for vid in self._passed(src, dst)]
        # Only what one writes for the other may stop being an output.
        dropped = {vid for _, _, vid in passed
                   if vid not in self.external and not self.readers(self.vars[vid], (keep, gone))}
        above = self._folds_above(passed[0][0], passed[0][1]) if passed else {}
        levels = max([gk.levels, gg.levels] + list(above.values()))
        size = _kernel_size(len(gk.walk.sites) + len(gg.walk.sites), levels)
        if size > MAX_KERNEL_SIZE:
            self.refuse(gg.last, gk, self._too_large(size))
            return None, gone
        if not passed and self._same_kernel(gk, gg) and not any(vid in gg.walk.reads for vid in gk.walk.reads):
            # Merged, a model's per-layer pieces (each layer's attention logsumexp, joined from
            # its query tiles) become one kernel that grows with the depth and compiles in time
            # linear in it (0.08 s of LLVM work per layer); apart they are one compiled kernel.
            self.refuse(gg.last, gk, "not profitable: the two kernels compute the same thing on data they do not "
                        "share; apart, one compiled kernel serves both, and merged, the kernel grows with each one")
            return None, gone
        try:
            walk = self._merge_walk(gk, gg, passed, dropped)
        except FusionRefused as why:
            self.refuse(gg.last, gk, str(why))
            return None, gone
        self._absorb(gk, gg, walk, dropped, [vid for _, _, vid in passed])
        gk.folds_above.update(above)
        gk.levels = levels
        return keep, gone

    def _same_kernel(self, a: _Group, b: _Group) -> bool:
        """Whether two groups are the same computation up to the ids of their values (a model's
        layers make such kernels): their equations and outputs, as kernel lowering tells them
        apart."""
        if len(a.members) != len(b.members) or len(a.outputs) != len(b.outputs):
            return False
        shapes = [self.lower.shape([self.eqns[i] for i in sorted(g.members)], list(g.outputs.values()))[0]
                  for g in (a, b)]
        return shapes[0] == shapes[1]

    def _merge_walk(self, gk: _Group, gg: _Group, passed: list[tuple[_Group, _Group, int]],
                    dropped: set[int]) -> SiteWalk:
        """What groups gk and gg compute as one kernel (no longer writing `dropped`, which the
        one reads from the other); FusionRefused if they cannot. The values `passed` from one
        to the other are computed where the reader reads them."""
        defined = ChainMap(gk.defined, gg.defined)
        if dropped:  # fewer stores: walk the merged kernel afresh
            members = [self.eqns[j] for j in sorted(gk.members | gg.members)]
            outputs = [v for g in (gk, gg) for v in g.outputs.values() if v.id not in dropped]
            walk = SiteWalk(gk.domain, defined)
            walk.visit(root_reads(gk.domain, members, outputs, defined))
            return walk
        walk = SiteWalk(gk.domain, defined, gk.walk)
        walk.sites |= gg.walk.sites
        walk.visit([(self.vars[vid], index, mask) for _, dst, vid in passed for index, mask in dst.walk.reads[vid]])
        for vid, places in gg.walk.reads.items():
            walk.reads.setdefault(vid, {}).update(places)
        return walk

    def _folds_above(self, src: _Group, dst: _Group) -> dict[int, int]:
        """`_Group.folds_above` of src's members once src and dst (which reads src's outputs)
        are one kernel."""
        above: dict[int, int] = {}
        for m in sorted(src.members, reverse=True):  # consumers before producers
            best = 0
            for v in self.eqns[m].outvars:
                for c in self.consumers.get(v.id, ()):
                    if c in above:
                        best = max(best, above[c])
                    elif c in dst.members:
                        best = max(best, dst.folds_above[c])
            above[m] = int(bool(primitive(self.eqns[m].primitive).fold)) + best
        return above

    def _absorb(self, keep: _Group, gone: _Group, walk: SiteWalk, dropped: set[int], passed: list[int]) -> None:
        keep.order = min((keep.at, keep.order), (gone.at, gone.order))[1]
        keep.at = min(keep.at, gone.at)
        keep.folds_above.update(gone.folds_above)
        for i in gone.members:
            keep.add(i, self.eqns[i], copy=True)  # `at` is set above
            gids = self.groups_of[i]
            gids.discard(gone.gid)
            gids.add(keep.gid)
        for vid in gone.outputs:
            self.home[vid] = keep.gid
        keep.outputs.update(gone.outputs)
        for vid in dropped:
            del keep.outputs[vid]
        if walk.base is not None:
            keep.walk.absorb(walk)
        else:
            keep.walk = walk
        keep.walk.defined = keep.defined
        keep.walk.base = None
        for vid in passed:
            keep.walk.reads.pop(vid, None)
        self.dag.merge(keep.gid, gone.gid)
        del self.groups[gone.gid]

    # --- the result -----------------------------------------------------------------------------
    def run(self) -> Fusion:
        for i in reversed(range(len(self.eqns))):
            self.place(i)
        self.merge_siblings()
        return self.finish()

    def outputs(self, gid: int) -> list[Var]:
        """What kernel `gid` writes: its values that the program returns or that a consumer in
        another kernel, which does not compute them itself, reads (a call writes all its
        results)."""
        group = self.groups[gid]
        call = self._call(group)
        if call is not None:
            return list(call.outvars)
        return [v for i in sorted(group.members) for v in self.eqns[i].outvars
                if self.home.get(v.id) == gid and self.needed(v, gid)]

    def _call(self, group: _Group) -> Eqn | None:
        """The opaque equation a group consists of, if it is a call kernel."""
        eqn = self.eqns[group.first]
        return eqn if group.own and primitive(eqn.primitive).opaque else None

    def finish(self) -> Fusion:
        # Of the kernels ready to run, the one with the earliest equation (copies aside, see
        # `_Group.at`): that keeps the kernel order close to the program's.
        order = self.dag.order(lambda g: (self.groups[g].at, self.groups[g].order))
        groups = [sorted(self.groups[g].members) for g in order]
        outputs = [self.outputs(g) for g in order]
        kernels = []
        for k, (gid, eqns, outs) in enumerate(zip(order, groups, outputs)):
            call = self._call(self.groups[gid])
            kernels.append(lower_call(call, str(k)) if call is not None else
                           self.lower([self.eqns[i] for i in eqns], outs, str(k)))
        return Fusion(self.graph, groups, outputs, kernels, self.refusals)


def fuse(graph: Graph) -> Fusion:
    """Group the equations of `graph` into kernels."""
    return _Fuser(graph).run()
