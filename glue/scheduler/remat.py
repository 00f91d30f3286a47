"""Rematerialisation: what a program keeps across its fullest point, chosen by a minimum cut.

A training step is one Graph: the forward, the backward the VJP emitted after it, the optimizer.
The backward reads many forward intermediates (a softmax's exp and its output, a GELU's tanh, a
layer norm's centred and normalised values), and each one read there stays alive across the
whole gap between the two passes. Most are cheap elementwise functions of a few others. As
torch.compile's min-cut partitioner does, this pass picks the cheapest set of values to keep
across that gap and recomputes the rest after it, from what is kept:

- the gap is the program position where the bytes of values produced before it and read after
  it (those that must stay alive across it) are greatest: in a training step, the boundary of
  the forward and the backward;
- a value can be recomputed when its equation is elementwise, a layout change or a creation
  (kind elementwise | layout | creation, no effects); contractions, reductions, gathers and
  calls are kept when needed, and so is a narrowing cast of an argument (a 16-bit weight:
  see `recomputable`). Arguments are alive anyway and cost nothing; graph outputs have
  buffers of their own;
- the kept set is a minimum cut, in bytes, between the values that cannot be recomputed and
  those the far side reads (each value a node of capacity its size), the one nearest the far
  side of the cuts of least capacity (the least recomputation);
- every value the far side reads and that is not kept is recomputed by copies of its
  equations, made for each reading equation and placed just before it, so fusion folds them
  into that reader's kernel: a copy shared by two backward kernels would be written by one and
  kept for the other (an exp feeding both a product and a softmax's backward is written in
  float32 beside its 16-bit cast), and one shared across layers would live across them.

One cut, at the fullest gap: cutting again at the next fullest (inside the backward) keeps no
less, since what crosses there is mostly what the first cut kept. The copies compute exactly
what the originals do, so results are unchanged bit for bit. It runs after `optimize`, whose
CSE would merge the copies back into their originals.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Container

from glue.ir import PRIMITIVES, Eqn, Graph, Var
from glue.ir.core import Atom
from glue.ir.primitives import has_effects
from glue.scheduler.passes.dce import dce

RECOMPUTABLE_KINDS = ("elementwise", "layout", "creation")
# Recomputing costs work (transcendentals included): a cut must save at least this many bytes
# at the fullest gap, which small programs never reach, so their kernels stay as fusion made them.
MIN_SAVED_BYTES = 1 << 20
# Copies are made per reader, so a long chain of cheap work read all along (a hash's rounds
# over one iota, which fusion keeps in one kernel anyway) could be copied many times over: a
# rewrite adding more than this fraction of the program's equations (doubling it) is not worth
# its work.
MAX_COPIES = 1.0
_INF = 1 << 62


def recomputable(eqn: Eqn, arguments: Container[int] = ()) -> bool:
    """Whether the pass may compute `eqn` again after the gap (cheap, pure, one result). A
    narrowing cast of an argument (`arguments`: their ids) is kept instead: a mixed-precision
    step's 16-bit weights. Kept, they cost half the float32 weights' bytes across the gap;
    recomputed, every product reading one in the backward casts the weight once more (with a
    library GEMM, a launch of its own per product)."""
    prim = PRIMITIVES[eqn.primitive]
    if prim.cast and isinstance(eqn.inputs[0], Var) and eqn.inputs[0].id in arguments \
            and eqn.outvars[0].type.dtype.itemsize < eqn.inputs[0].type.dtype.itemsize:
        return False
    return prim.kind in RECOMPUTABLE_KINDS and not prim.multiple_results \
        and not has_effects(eqn.primitive, eqn.params)


@dataclass(frozen=True)
class Gap:
    """A program position (the first equation after it) and the bytes alive across it."""

    position: int
    bytes: int


def fullest_gap(graph: Graph) -> Gap:
    """The position across which the values produced before and read after weigh the most
    (arguments and graph outputs excluded: they live in buffers of their own)."""
    eqns = graph.eqns
    returned = {a.id for a in graph.outvars if isinstance(a, Var)}
    born: dict[int, tuple[int, int]] = {}  # value -> (producer position, size)
    last: dict[int, int] = {}
    for i, eqn in enumerate(eqns):
        for a in eqn.inputs:
            if isinstance(a, Var) and a.id in born:
                last[a.id] = i
        for v in eqn.outvars:
            if v.id not in returned:
                born[v.id] = (i, v.type.nbytes)
    delta = [0] * (len(eqns) + 1)
    for vid, j in last.items():
        i, size = born[vid]
        if j > i + 1:  # alive across positions i+1 .. j
            delta[i + 1] += size
            delta[j + 1] -= size
    best, total = Gap(0, 0), 0
    for b in range(len(eqns)):
        total += delta[b]
        if total > best.bytes:
            best = Gap(b, total)
    return best


class _Network:
    """A flow network on integer node ids with integer capacities (Dinic's algorithm)."""

    def __init__(self) -> None:
        self.edges: list[list[int]] = []  # [head, capacity]; edge e ^ 1 is its reverse
        self.out: list[list[int]] = []

    def node(self) -> int:
        self.out.append([])
        return len(self.out) - 1

    def edge(self, u: int, v: int, capacity: int) -> None:
        self.out[u].append(len(self.edges))
        self.edges.append([v, capacity])
        self.out[v].append(len(self.edges))
        self.edges.append([u, 0])

    def _levels(self, s: int) -> list[int]:
        level = [-1] * len(self.out)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.out[u]:
                v, cap = self.edges[e]
                if cap > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level

    def _push(self, s: int, t: int, level: list[int], nxt: list[int]) -> int:
        """One blocking-flow augmentation along a level path, iteratively (paths are long)."""
        path: list[int] = []  # edges from s
        u = s
        while True:
            if u == t:
                flow = min(self.edges[e][1] for e in path)
                for e in path:
                    self.edges[e][1] -= flow
                    self.edges[e ^ 1][1] += flow
                return flow
            advanced = False
            while nxt[u] < len(self.out[u]):
                e = self.out[u][nxt[u]]
                v, cap = self.edges[e]
                if cap > 0 and level[v] == level[u] + 1:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                nxt[u] += 1
            if not advanced:
                if not path:
                    return 0
                level[u] = -1  # a dead end: never enter it again in this phase
                e = path.pop()
                u = self.edges[e ^ 1][0]
                nxt[u] += 1

    def sink_side(self, s: int, t: int) -> set[int]:
        """The nodes on the sink's side of the minimum s-t cut nearest the sink: those that
        still reach it once a maximum flow is pushed. Of the cuts of least capacity, that one
        keeps the values latest in the program, so the least is recomputed."""
        while True:
            level = self._levels(s)
            if level[t] < 0:
                break
            nxt = [0] * len(self.out)
            while self._push(s, t, level, nxt):
                pass
        reach, stack = {t}, [t]
        while stack:
            v = stack.pop()
            for e in self.out[v]:  # e leaves v, so e ^ 1 enters it from edges[e][0]
                u = self.edges[e][0]
                if self.edges[e ^ 1][1] > 0 and u not in reach:
                    reach.add(u)
                    stack.append(u)
        return reach


def _kept(graph: Graph, gap: int) -> set[int] | None:
    """The values to keep across `gap`, or None when that saves less than MIN_SAVED_BYTES
    against keeping what is read after it."""
    eqns = graph.eqns
    made = {v.id: i for i, e in enumerate(eqns[:gap]) for v in e.outvars}
    returned = {a.id for a in graph.outvars if isinstance(a, Var)}
    needed = {a.id for e in eqns[gap:] for a in e.inputs if isinstance(a, Var) and a.id in made}
    net = _Network()
    source, sink = net.node(), net.node()
    nodes: dict[int, tuple[int, int]] = {}  # value -> (in, out)
    sizes: dict[int, int] = {}
    arguments = {v.id for v in graph.constvars + graph.invars}
    stack = list(needed)
    while stack:  # the values read after the gap and those they can be recomputed from
        vid = stack.pop()
        if vid in nodes:
            continue
        eqn = eqns[made[vid]]
        nodes[vid] = (net.node(), net.node())
        var = next(v for v in eqn.outvars if v.id == vid)
        sizes[vid] = 0 if vid in returned else var.type.nbytes
        if recomputable(eqn, arguments):
            stack.extend(a.id for a in eqn.inputs if isinstance(a, Var) and a.id in made)
    for vid, (v_in, v_out) in nodes.items():
        net.edge(v_in, v_out, sizes[vid])
        eqn = eqns[made[vid]]
        if not recomputable(eqn, arguments):
            net.edge(source, v_in, _INF)
        else:
            for a in eqn.inputs:
                if isinstance(a, Var) and a.id in made:
                    net.edge(nodes[a.id][1], v_in, _INF)
        if vid in needed:
            net.edge(v_out, sink, _INF)
    side = net.sink_side(source, sink)
    kept = {vid for vid, (v_in, v_out) in nodes.items() if v_in not in side and v_out in side}
    if sum(sizes[v] for v in kept) + MIN_SAVED_BYTES > sum(sizes[v] for v in needed):
        return None
    return kept


def _recompute(graph: Graph, gap: int, kept: set[int]) -> Graph:
    """`graph` with every value read after `gap` that is not kept recomputed for each reader."""
    eqns = graph.eqns
    producer = {v.id: e for e in eqns[:gap] for v in e.outvars}
    copies: dict[int, Atom] = {}
    out = list(eqns[:gap])

    def copy_of(root: Var) -> Atom:
        """The recomputed value of `root` (emitting its missing copies, inputs first)."""
        stack = [root]
        while stack:
            var = stack[-1]
            if var.id in copies:
                stack.pop()
                continue
            eqn = producer[var.id]
            missing = [a for a in eqn.inputs if isinstance(a, Var) and a.id in producer
                       and a.id not in kept and a.id not in copies]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            inputs = tuple(read(a) for a in eqn.inputs)
            fresh = Var(var.type)
            out.append(Eqn(eqn.primitive, inputs, eqn.params, (fresh,), eqn.source))
            copies[var.id] = fresh
        return copies[root.id]

    def read(a: Atom) -> Atom:
        if not isinstance(a, Var) or a.id not in producer or a.id in kept:
            return a
        return copies[a.id] if a.id in copies else copy_of(a)

    for eqn in eqns[gap:]:
        copies.clear()  # each reader its own copies (see the module docstring)
        inputs = tuple(read(a) for a in eqn.inputs)
        out.append(eqn if inputs == eqn.inputs else Eqn(eqn.primitive, inputs, eqn.params, eqn.outvars, eqn.source))
    return Graph(graph.constvars, graph.invars, tuple(out), graph.outvars)


def rematerialize(graph: Graph) -> Graph:
    """`graph` keeping less across its fullest gap (see the module docstring); the very Graph
    when nothing pays: the cut saves too little, the gap does not shrink by MIN_SAVED_BYTES,
    or the copies grow the program by more than MAX_COPIES."""
    gap = fullest_gap(graph)
    chosen = _kept(graph, gap.position) if gap.bytes else None
    if chosen is None:
        return graph
    # originals read only after the gap are dead now that copies serve their readers
    rewritten = dce(_recompute(graph, gap.position, chosen))
    if len(rewritten.eqns) > (1 + MAX_COPIES) * len(graph.eqns) \
            or fullest_gap(rewritten).bytes + MIN_SAVED_BYTES > gap.bytes:
        return graph
    return rewritten
