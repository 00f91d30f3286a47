"""Memory planning: where every value between kernels lives.

Arguments stay where the caller put them; outputs get buffers of their own (or the buffer of a
donated argument of the same size that is dead by then); every intermediate gets an offset in
one arena, packed best-fit by decreasing size; and a kernel may write an output over an input
that dies in it when it reads that input only at the position it writes (in place).

Liveness follows the stream plan's happens-before order, not the list order of the kernels:
two values may share memory only when every kernel that touches one finishes before any kernel
that touches the other starts, on every run. On one stream that is plain interval liveness; on
several, a value read by one stream stays reserved until the kernels that follow it are
ordered after that read, so no stream overwrites what another may still be reading.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from glue.ir import Graph, TensorType, Var
from glue.scheduler.kernel_ir import Kernel, Load, loads_under
from glue.scheduler.streams import StreamPlan, plan_streams

ALIGNMENT = 256  # bytes: cudaMalloc's alignment, a multiple of every vector width we load


@dataclass(frozen=True)
class Placement:
    """Where a value lives: kind is argument | arena | output | donated; `slot` is the argument
    or output position, or the arena offset in bytes."""

    kind: str
    slot: int
    type: TensorType


@dataclass
class MemoryPlan:
    placements: dict[int, Placement]
    arena_bytes: int
    argument_bytes: int
    output_bytes: int
    naive_bytes: int
    lifetimes: dict[int, tuple[int, int]]
    # Donated argument slots whose buffers no output took: free once a call's kernels are done.
    spare_donors: tuple[int, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.arena_bytes + self.output_bytes

    def live_bytes(self) -> list[int]:
        """Per kernel position, the bytes of arena values live there (produced at or before it,
        read at or after it): what packing must fit, before fragmentation. An output written in
        place over an input that dies in its kernel counts beside that input there."""
        ends = max((last for _, last in self.lifetimes.values()), default=-1) + 2
        delta = [0] * ends
        for vid, p in self.placements.items():
            if p.kind == "arena":
                first, last = self.lifetimes[vid]
                delta[first] += p.type.nbytes
                delta[last + 1] -= p.type.nbytes
        live, total = [], 0
        for d in delta[:-1]:
            total += d
            live.append(total)
        return live

    def analysis(self) -> dict[str, int]:
        return {"peak_bytes": self.peak_bytes, "naive_bytes": self.naive_bytes,
                "arena_bytes": self.arena_bytes, "argument_bytes": self.argument_bytes,
                "output_bytes": self.output_bytes}

    def text(self, names: dict[int, str]) -> str:
        lines = [f"arena {self.arena_bytes} bytes; arguments {self.argument_bytes}; outputs "
                 f"{self.output_bytes}; peak {self.peak_bytes}; naive (one buffer per value) {self.naive_bytes}"]
        for vid, p in sorted(self.placements.items(), key=lambda kv: (kv[1].kind, kv[1].slot)):
            live = self.lifetimes.get(vid)
            span = f" live kernels {live[0]}..{live[1]}" if live else ""
            where = f"@{p.slot}" if p.kind == "arena" else f"#{p.slot}"
            lines.append(f"  {names.get(vid, vid)}:{p.type} {p.kind}{where} ({p.type.nbytes} B){span}")
        return "\n".join(lines)


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


# The store levels at which each kind of kernel may write over an input it reads only there.
_IN_PLACE_LEVELS = {"pointwise": ("element",), "reduction": ("element", "row"), "contraction": ("row",)}


def reads_only_where_written(kernel: Kernel, input_slot: int, output_slot: int,
                             loads: "Loads | None" = None) -> bool:
    """True when the kernel reads input `input_slot` only at the points it writes output
    `output_slot`, so both may share memory. A row kernel qualifies too: it finishes reading a
    row for its reductions before it writes that row, and no other row reads it. So does a
    contraction's epilogue that reads the input only at the output element it then writes (an
    optimizer update fused after a weight gradient): every backend runs the epilogue of an
    element once, after the element's sum, and keeps the sum itself apart from the outputs.
    Several outputs may each take an input this way, crossed (a new first moment over the old
    second moment): every backend computes all the values it stores at a point before it
    stores any of them. A reduction's row-level store (the update fused after a bias gradient)
    is the contraction's case again: a row's stores follow all of its folds, wherever they ran,
    and a fold of that row may read the input there too (the bias inside the gradient it
    sums); no other row reads it. Its element stores may not: on the GPU the threads of a row
    store their elements after the row's folds meet, each at its own pace, and one of them
    then stores the row's values. `loads` finds the kernel's loads (and keeps them)."""
    stores = [s for s in kernel.stores if s.output == output_slot]
    if len(stores) != 1 or stores[0].mode != "set" or stores[0].level not in _IN_PLACE_LEVELS.get(kernel.kind, ()):
        return False
    loads = loads or Loads()
    if kernel.kind == "contraction" and any(ld.input == input_slot for ld in loads.under(kernel, "reductions")):
        return False
    if stores[0].level == "row" and any(ld.input == input_slot for ld in loads.under(kernel, "element stores")):
        return False
    mine = [ld for ld in loads.under(kernel, "all") if ld.input == input_slot]
    return all(ld.index == stores[0].index and not ld.mask for ld in mine)


class Loads:
    """The loads of kernels, all of them or those under their reductions or their element
    stores, found once for each computation: planning asks of a kernel once per input and
    output it pairs, and a model's layers repeat their kernels (lowered once, the copies share
    their reductions and stores and differ only in their buffers, so their loads read the same
    slots). Computations are told apart by identity: comparing equal expressions walks them."""

    def __init__(self) -> None:
        # (id of reductions, id of stores, part) -> (the kernel, held so that those ids stay its; the loads)
        self.found: dict[tuple[int, int, str], tuple[Kernel, list[Load]]] = {}

    def under(self, kernel: Kernel, part: str) -> list[Load]:
        key = id(kernel.reductions), id(kernel.stores), part
        found = self.found.get(key)
        if found is None:
            if part == "reductions":
                exprs = [r.value for r in kernel.reductions]
            elif part == "element stores":
                exprs = [s.value for s in kernel.stores if s.level == "element"]
            else:
                exprs = kernel.roots
            found = self.found[key] = kernel, loads_under(exprs)
        return found[1]


def plan_memory(graph: Graph, kernels: Sequence[Kernel], donated: Sequence[int] = (),
                streams: StreamPlan | None = None) -> MemoryPlan:
    """Placements for every value; `streams` gives the order kernels run in (default: one
    stream, the list order)."""
    order = streams or plan_streams(kernels, max_streams=1)
    args = list(graph.constvars) + list(graph.invars)
    placements = {v.id: Placement("argument", i, v.type) for i, v in enumerate(args)}
    outputs = [a for a in graph.outvars if isinstance(a, Var) and a.id not in placements]
    produced: dict[int, int] = {}
    users: dict[int, list[int]] = {}  # value -> the kernels that write or read it, in order
    last_use: dict[int, int] = {}
    types: dict[int, TensorType] = {}
    for k, kernel in enumerate(kernels):
        for b in kernel.inputs + kernel.outputs:
            touching = users.setdefault(b.value_id, [])
            if not touching or touching[-1] != k:
                touching.append(k)
        for b in kernel.inputs:
            last_use[b.value_id] = k
        for b in kernel.outputs:
            produced[b.value_id] = k
            types[b.value_id] = b.type
    lifetimes = {vid: (k, last_use.get(vid, k)) for vid, k in produced.items()}
    output_ids = list(dict.fromkeys(v.id for v in outputs))
    # A donated argument the program also returns keeps its values: its buffer is no donor.
    returned = {a.id for a in graph.outvars if isinstance(a, Var)}
    donors = {graph.invars[i].id: len(graph.constvars) + i for i in donated if graph.invars[i].id not in returned}
    loads = Loads()
    # Outputs first take a donor their own kernel reads where it writes (a weight update takes
    # the old weight's buffer): as many as can, matched, then any donor dead by then, greedily
    # in output order. Each output prefers its own donor: the k-th output of a type the k-th
    # donated argument of that type (a step returning its new (params, m, v) in the order it
    # took them). A training loop then passes every value back at the address it came from,
    # and a backend that keys a replay by the addresses (a CUDA graph) replays it; crossed,
    # they would permute from call to call.
    # An output takes no other output's own donor: one that cannot take its own (its kernel
    # must not write over it) comes back fresh, and the executor copies it home, rather than
    # displace another output, which would displace a third, and so on: on the H200 such
    # chains made a training step's addresses cycle with a period longer than the graphs it
    # keeps, and it never replayed one.
    same_place = own_donors(output_ids, types, [(d, args[slot].type) for d, slot in donors.items()])
    owned = set(same_place.values())

    def fits(d: int, vid: int) -> bool:
        return (d == same_place.get(vid) or d not in owned) and args[donors[d]].type.nbytes == types[vid].nbytes \
            and _free_by(d, vid, kernels, users, produced[vid], order, loads)

    def preferred(vid: int, ids: Iterable[int]) -> list[int]:
        """`ids` once each, `vid`'s own donor first."""
        return sorted(dict.fromkeys(ids), key=lambda d: d != same_place.get(vid))

    reading = {vid: [b.value_id for b in kernels[produced[vid]].inputs] for vid in output_ids}
    chosen = {vid: donors[d] for vid, d in _matching(
        {vid: [d for d in preferred(vid, reading[vid]) if d in donors and fits(d, vid)] for vid in output_ids}).items()}
    for slot in chosen.values():
        del donors[args[slot].id]
    for vid in output_ids:
        donor = None if vid in chosen else \
            next((d for d in preferred(vid, donors) if d not in reading[vid] and fits(d, vid)), None)
        if donor is not None:
            chosen[vid] = donors.pop(donor)
    n_fresh = 0  # fresh output buffers are numbered without gaps: donated outputs take none
    for vid in output_ids:
        if vid in chosen:
            placements[vid] = Placement("donated", chosen[vid], types[vid])
        else:
            placements[vid] = Placement("output", n_fresh, types[vid])
            n_fresh += 1
    intermediates = [vid for vid in produced if vid not in placements]
    in_place = _in_place_pairs(kernels, intermediates, users, order, loads)
    arena = _pack(intermediates, users, types, in_place, order)
    placements.update({vid: Placement("arena", off, types[vid]) for vid, off in arena[0].items()})
    return MemoryPlan(
        placements, arena[1], sum(v.type.nbytes for v in args),
        sum(types[v].nbytes for v in output_ids if placements[v].kind == "output"),
        sum(v.type.nbytes for v in args) + sum(v.type.nbytes for e in graph.eqns for v in e.outvars),
        lifetimes, tuple(sorted(donors.values())))


def own_donors(outputs: Sequence[int], types: dict[int, TensorType], donors: Sequence[tuple[int, TensorType]]
               ) -> dict[int, int]:
    """output -> the donor it corresponds to: per type, the k-th output (in `outputs` order,
    `types` giving each one's) and the k-th of `donors` (donor, type)."""
    queues: dict[TensorType, list[int]] = {}
    for d, t in donors:
        queues.setdefault(t, []).append(d)
    waiting = {t: iter(q) for t, q in queues.items()}
    own = {}
    for vid in outputs:
        donor = next(waiting.get(types[vid], iter(())), None)
        if donor is not None:
            own[vid] = donor
    return own


def _matching(candidates: dict[int, list[int]]) -> dict[int, int]:
    """A largest matching of outputs to donors (`candidates`: output -> the donors it may take,
    preferred first; a donor goes to one output): augmenting paths, each found breadth first."""
    match: dict[int, int] = {}  # output -> donor
    owner: dict[int, int] = {}  # donor -> output
    for start in candidates:
        reached_from: dict[int, int] = {}  # donor -> the output whose candidates reached it
        frontier, seen, free = [start], {start}, None
        while frontier and free is None:
            following = []
            for out in frontier:
                for d in candidates[out]:
                    if d in reached_from:
                        continue
                    reached_from[d] = out
                    if d not in owner:
                        free = d
                        break
                    if owner[d] not in seen:
                        seen.add(owner[d])
                        following.append(owner[d])
                if free is not None:
                    break
            frontier = following
        d = free
        while d is not None:  # along the path back to `start`, each output takes the next donor
            out = reached_from[d]
            previous = match.get(out)
            match[out], owner[d] = d, out
            d = previous
    return match


def _dead_by(touching: Sequence[int], k: int, order: StreamPlan) -> bool:
    """Whether every kernel of `touching` other than k finishes before kernel k starts."""
    return all(j == k or order.before(j, k) for j in touching)


def _free_by(donor: int, vid: int, kernels: Sequence[Kernel], users: dict[int, list[int]], k: int,
             order: StreamPlan, loads: Loads) -> bool:
    """Whether the donated argument `donor` is dead when kernel `k` writes `vid`: read only by
    kernels that finish before k, or by kernel k itself only where it writes `vid`."""
    if not _dead_by(users.get(donor, ()), k, order):
        return False
    kernel = kernels[k]
    slots = [i for i, b in enumerate(kernel.inputs) if b.value_id == donor]
    out = next(o for o, b in enumerate(kernel.outputs) if b.value_id == vid)
    return all(reads_only_where_written(kernel, i, out, loads) for i in slots)


def _in_place_pairs(kernels: Sequence[Kernel], intermediates: list[int], users: dict[int, list[int]],
                    order: StreamPlan, loads: Loads) -> dict[int, int]:
    """output value -> input value whose memory it may take over."""
    candidates = set(intermediates)
    pairs: dict[int, int] = {}
    taken: set[int] = set()
    for k, kernel in enumerate(kernels):
        by_size: dict[int, list[int]] = {}
        for i, inp in enumerate(kernel.inputs):
            if inp.value_id in candidates:
                by_size.setdefault(inp.type.nbytes, []).append(i)
        for o, out in enumerate(kernel.outputs):
            if out.value_id not in candidates:
                continue
            for i in by_size.get(out.type.nbytes, ()):
                inp = kernel.inputs[i].value_id
                if inp not in taken and _dead_by(users[inp], k, order) \
                        and reads_only_where_written(kernel, i, o, loads):
                    pairs[out.value_id] = inp
                    taken.add(inp)
                    break
    return pairs


@dataclass
class _Slot:
    """Memory shared by an in-place chain of values: its size, the kernels touching it (their
    first and last), per stream the last of them, and per stream the last kernel that happens
    before all of them."""

    size: int
    first: int
    last: int
    last_on: list[int]
    before_all: list[int]
    since: int  # every kernel before this one happens before all kernels touching the slot


def _slots(values: list[int], users: dict[int, list[int]], types: dict[int, TensorType],
           in_place: dict[int, int], order: StreamPlan) -> tuple[dict[int, int], dict[int, _Slot]]:
    """Each value's slot (the root of its in-place chain) and what each slot is."""
    root = {v: v for v in values}

    def find(v: int) -> int:
        while root[v] != v:
            v = root[v]
        return v

    for out, inp in in_place.items():
        root[find(out)] = find(inp)
    members: dict[int, list[int]] = {}
    for v in values:
        members.setdefault(find(v), []).append(v)
    width = max(map(len, order.clocks), default=1)
    on_stream: dict[int, list[int]] = {}
    for k, s in enumerate(order.streams):
        on_stream.setdefault(s, []).append(k)
    n = len(order.streams)

    def since(k: int) -> int:
        """The first kernel that does not happen before kernel k (on each stream, the kernel
        after the last one that does)."""
        clock = order.clocks[k]
        first = k
        for s, ks in on_stream.items():
            last = clock[s] if s < len(clock) else -1
            after = bisect.bisect_right(ks, last)
            first = min(first, ks[after] if after < len(ks) else n)
        return first

    slots = {}
    for r, vs in members.items():
        touching = sorted({k for v in vs for k in users[v]})
        last_on, before_all = [-1] * width, [n] * width
        for k in touching:
            s = order.streams[k]
            last_on[s] = max(last_on[s], k)
            clock = order.clocks[k]
            for t in range(width):
                before_all[t] = min(before_all[t], clock[t] if t < len(clock) else -1)
        slots[r] = _Slot(_align(max(types[v].nbytes for v in vs)), touching[0], touching[-1], last_on, before_all,
                         min(since(k) for k in touching))
    return {v: find(v) for v in values}, slots


class _Intervals:
    """Closed intervals of kernel positions in [0, n), reporting those that overlap a query."""

    def __init__(self, n: int):
        self.leaves = 1 << max(n - 1, 0).bit_length()
        self.cover: dict[int, list[int]] = {}  # segment tree node -> items whose interval covers it
        self.starts: list[tuple[int, int]] = []  # (start, item), sorted

    def add(self, lo: int, hi: int, item: int) -> None:
        left, right = lo + self.leaves, hi + self.leaves + 1
        while left < right:
            if left & 1:
                self.cover.setdefault(left, []).append(item)
                left += 1
            if right & 1:
                right -= 1
                self.cover.setdefault(right, []).append(item)
            left, right = left >> 1, right >> 1
        bisect.insort(self.starts, (lo, item))

    def overlapping(self, lo: int, hi: int) -> list[int]:
        found = []
        node = lo + self.leaves
        while node:  # the intervals holding lo
            found.extend(self.cover.get(node, ()))
            node >>= 1
        first = bisect.bisect_right(self.starts, (lo, float("inf")))
        last = bisect.bisect_right(self.starts, (hi, float("inf")))
        found.extend(item for _, item in self.starts[first:last])  # and those starting after it
        return found


def _pack(values: list[int], users: dict[int, list[int]], types: dict[int, TensorType],
          in_place: dict[int, int], order: StreamPlan) -> tuple[dict[int, int], int]:
    """Arena offsets, best fit by decreasing size; in-place chains share one slot. Two slots
    may overlap in memory only when all kernels touching one happen before all touching the
    other. A slot's kernels, widened back to the first kernel that does not happen before all of
    them, span an interval of positions; slots whose intervals do not meet never conflict, so
    only slots whose intervals meet are compared.

    Each slot is compared with every placed slot alive beside it, which in a deep training
    step's backward is most of them (740 on average in a 64-layer step on four streams): that
    inner loop runs over NumPy arrays of the placed slots."""
    slot_of, slots = _slots(values, users, types, in_place, order)
    ranked = sorted(slots, key=lambda r: (-slots[r].size, slots[r].first))
    placed = _Intervals(len(order.streams))
    offsets, ends = np.zeros(len(ranked), np.int64), np.zeros(len(ranked), np.int64)  # by rank, once placed
    # On one stream a slot's interval is exactly the span of its kernels, so every slot whose
    # interval meets it conflicts with it: only several streams need the finer test.
    one_stream = order.n_streams == 1
    if not one_stream:
        last_on = np.array([slots[r].last_on for r in ranked], np.int64)
        before_all = np.array([slots[r].before_all for r in ranked], np.int64)
    end = 0
    for i, r in enumerate(ranked):
        slot = slots[r]
        alive = np.array(placed.overlapping(slot.since, slot.last), np.int64)
        if not one_stream and len(alive):
            # disjoint: every kernel touching one slot finishes before any touching the other starts
            disjoint = (last_on[alive] <= before_all[i]).all(axis=1) | (last_on[i] <= before_all[alive]).all(axis=1)
            alive = alive[~disjoint]
        offsets[i] = _best_fit(offsets[alive], ends[alive], slot.size)
        ends[i] = offsets[i] + slot.size
        end = max(end, int(ends[i]))
        placed.add(slot.since, slot.last, i)
    extents = {r: int(offsets[i]) for i, r in enumerate(ranked)}
    return {v: extents[slot_of[v]] for v in values}, end


def _best_fit(lo: np.ndarray, hi: np.ndarray, size: int) -> int:
    """The offset of the smallest gap of at least `size` bytes below or between the busy
    extents [lo, hi) (the lowest of equal gaps), else the end of the highest."""
    if not len(lo):
        return 0
    by_start = np.lexsort((hi, lo))
    lo, hi = lo[by_start], hi[by_start]
    # the highest end below each extent: where the gap before it starts
    cursor = np.concatenate(([0], np.maximum.accumulate(np.maximum(hi, 0))[:-1]))
    gaps = lo - cursor
    fits = gaps >= size
    if not fits.any():
        return int(max(cursor[-1], hi[-1]))
    return int(cursor[np.argmin(np.where(fits, gaps, np.iinfo(np.int64).max))])
