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

import operator
from dataclasses import dataclass
from functools import reduce
from typing import Sequence

from glue.ir import Graph, TensorType, Var
from glue.scheduler.kernel_ir import Kernel, loads_under
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

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.arena_bytes + self.output_bytes

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


def reads_only_where_written(kernel: Kernel, input_slot: int, output_slot: int) -> bool:
    """True when the kernel reads input `input_slot` only at the points it writes output
    `output_slot`, so both may share memory. A row kernel qualifies too: it finishes reading a
    row for its reductions before it writes that row, and no other row reads it."""
    stores = [s for s in kernel.stores if s.output == output_slot]
    if kernel.kind not in ("pointwise", "reduction") or len(stores) != 1 or stores[0].mode != "set" \
            or stores[0].level != "element":
        return False
    loads = loads_under(kernel.roots)
    mine = [ld for ld in loads if ld.input == input_slot]
    return all(ld.index == stores[0].index and not ld.mask for ld in mine)


def plan_memory(graph: Graph, kernels: Sequence[Kernel], donated: Sequence[int] = (),
                streams: StreamPlan | None = None) -> MemoryPlan:
    """Placements for every value; `streams` gives the order kernels run in (default: one
    stream, the list order)."""
    order = streams or plan_streams(kernels, max_streams=1)
    args = list(graph.constvars) + list(graph.invars)
    placements = {v.id: Placement("argument", i, v.type) for i, v in enumerate(args)}
    outputs = [a for a in graph.outvars if isinstance(a, Var) and a.id not in placements]
    produced: dict[int, int] = {}
    users: dict[int, int] = {}  # value -> bit mask of the kernels that write or read it
    last_use: dict[int, int] = {}
    types: dict[int, TensorType] = {}
    for k, kernel in enumerate(kernels):
        for b in kernel.inputs:
            last_use[b.value_id] = k
            users[b.value_id] = users.get(b.value_id, 0) | 1 << k
        for b in kernel.outputs:
            produced[b.value_id] = k
            types[b.value_id] = b.type
            users[b.value_id] = users.get(b.value_id, 0) | 1 << k
    lifetimes = {vid: (k, last_use.get(vid, k)) for vid, k in produced.items()}
    output_ids = list(dict.fromkeys(v.id for v in outputs))
    # A donated argument the program also returns keeps its values: its buffer is no donor.
    returned = {a.id for a in graph.outvars if isinstance(a, Var)}
    donors = {graph.invars[i].id: len(graph.constvars) + i for i in donated if graph.invars[i].id not in returned}
    n_fresh = 0  # fresh output buffers are numbered without gaps: donated outputs take none
    for vid in output_ids:
        donor = next((d for d, slot in donors.items() if args[slot].type.nbytes == types[vid].nbytes
                      and _free_by(d, vid, kernels, users, produced[vid], order)), None)
        if donor is not None:
            placements[vid] = Placement("donated", donors.pop(donor), types[vid])
        else:
            placements[vid] = Placement("output", n_fresh, types[vid])
            n_fresh += 1
    intermediates = [vid for vid in produced if vid not in placements]
    in_place = _in_place_pairs(kernels, intermediates, users, order)
    arena = _pack(intermediates, users, types, in_place, order)
    placements.update({vid: Placement("arena", off, types[vid]) for vid, off in arena[0].items()})
    return MemoryPlan(
        placements, arena[1], sum(v.type.nbytes for v in args),
        sum(types[v].nbytes for v in output_ids if placements[v].kind == "output"),
        sum(v.type.nbytes for v in args) + sum(v.type.nbytes for e in graph.eqns for v in e.outvars),
        lifetimes)


def _dead_by(mask: int, k: int, order: StreamPlan) -> bool:
    """Whether every kernel in `mask` other than k finishes before kernel k starts."""
    return not (mask & ~(1 << k)) & ~order.ancestors[k]


def _free_by(donor: int, vid: int, kernels: Sequence[Kernel], users: dict[int, int], k: int,
             order: StreamPlan) -> bool:
    """Whether the donated argument `donor` is dead when kernel `k` writes `vid`: read only by
    kernels that finish before k, or by kernel k itself only where it writes `vid`."""
    readers = users.get(donor, 0)
    if not _dead_by(readers, k, order):
        return False
    kernel = kernels[k]
    slots = [i for i, b in enumerate(kernel.inputs) if b.value_id == donor]
    out = next(o for o, b in enumerate(kernel.outputs) if b.value_id == vid)
    return all(reads_only_where_written(kernel, i, out) for i in slots)


def _in_place_pairs(kernels: Sequence[Kernel], intermediates: list[int], users: dict[int, int],
                    order: StreamPlan) -> dict[int, int]:
    """output value -> input value whose memory it may take over."""
    candidates = set(intermediates)
    pairs: dict[int, int] = {}
    taken: set[int] = set()
    for k, kernel in enumerate(kernels):
        for o, out in enumerate(kernel.outputs):
            if out.value_id not in candidates:
                continue
            for i, inp in enumerate(kernel.inputs):
                if (inp.value_id in candidates and inp.value_id not in taken
                        and _dead_by(users[inp.value_id], k, order)
                        and inp.type.nbytes == out.type.nbytes
                        and reads_only_where_written(kernel, i, o)):
                    pairs[out.value_id] = inp.value_id
                    taken.add(inp.value_id)
                    break
    return pairs


def _pack(values: list[int], users: dict[int, int], types: dict[int, TensorType],
          in_place: dict[int, int], order: StreamPlan) -> tuple[dict[int, int], int]:
    """Arena offsets, best fit by decreasing size; in-place chains share one slot. Two slots
    may overlap in memory only when all kernels touching one happen before all touching the
    other."""
    root = {v: v for v in values}

    def find(v: int) -> int:
        while root[v] != v:
            v = root[v]
        return v

    for out, inp in in_place.items():
        root[find(out)] = find(inp)
    slots: dict[int, list[int]] = {}
    for v in values:
        slots.setdefault(find(v), []).append(v)
    touch = {r: reduce(operator.or_, (users[v] for v in vs)) for r, vs in slots.items()}
    # the kernels that happen before every kernel touching the slot
    after = {r: reduce(operator.and_, (order.ancestors[k] for k in _bits(touch[r]))) for r in slots}

    def disjoint(a: int, b: int) -> bool:
        return not touch[a] & ~after[b] or not touch[b] & ~after[a]

    sizes = {r: _align(max(types[v].nbytes for v in vs)) for r, vs in slots.items()}
    first = {r: min(_bits(touch[r])) for r in slots}
    offsets: dict[int, int] = {}
    end = 0
    for r in sorted(slots, key=lambda r: (-sizes[r], first[r])):
        busy = sorted((offsets[o], offsets[o] + sizes[o]) for o in offsets if not disjoint(o, r))
        best, cursor = None, 0
        for lo, hi in busy + [(None, None)]:
            gap = (lo if lo is not None else float("inf")) - cursor
            if gap >= sizes[r] and (best is None or gap < best[1]):
                best = (cursor, gap)
            if hi is not None:
                cursor = max(cursor, hi)
        offsets[r] = best[0]
        end = max(end, best[0] + sizes[r])
    return {v: offsets[find(v)] for v in values}, end


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
