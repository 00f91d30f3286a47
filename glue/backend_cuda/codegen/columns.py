"""Column reductions on the GPU: reductions whose rows (the kernel's parallel points) are the
contiguous dim of their data, and whose reduced dims are strided — a norm's weight gradient or
a bias gradient, summed over the tokens of each feature (with the optimizer update it feeds).

The row strategy (rows.py) would give each row a group of threads reading it at a stride: a
warp's loads touch 32 lines for 4 bytes of each. Here a thread owns `width` consecutive rows
(one 16-byte vector of the narrowest contiguous operand, so a warp's loads are consecutive
memory) and folds a run of the reduced points into registers. A block holds up to 32 such row
groups (a tile), each folded by up to 8 threads (`slices`) over consecutive runs of the points;
the slices' partials meet in shared memory, folded in slice order. The reduced points also split
over `splits` blocks so that the whole GPU works; each block writes its partials to the stream's
scratch region, and the last block of a tile to finish — counted with an atomic increment on a
zeroed counter, after a fence that makes the partials visible — folds every split's partials
(slice s takes splits s, s + slices, ..., in order, then the slices meet again), runs the
kernel's row-level stores (the epilogue) and sets the counter back to zero for the next call or
graph replay. The order of every fold is fixed, so the result does not depend on which block
finished last. Narrow tiles keep the partials the last block reads small (a norm's nine
reductions over 768 rows in one tile of 256 splits were 14 MB for one block to read); the
slices keep the blocks busy with fewer splits.

Element-level stores that need no row value (a gradient a sibling kernel merged in, computed
from the same loads) are written as the points are folded. It takes kernels whose reductions
(sum, prod, max, min) use no row values (one level), whose element stores use none either,
and where every load that reads both the reduced dims and the rows moves contiguously along
the last parallel dim (at least over aligned runs of 32 rows, as after a reshape that splits
it: attention's heads) and not along the last reduced dim.
"""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import (MAX_LANES, KernelEmitter, LaneGroup, Partial, Vectorization,
                                              flat_index, moves_in_runs, moves_with, pow2_at_least, when)
from glue.codegen.loops import loop, unflatten
from glue.codegen.scope import Analysis
from glue.codegen.types import I32, I64
from glue.scheduler.kernel_ir import Kernel, Load, subexpressions

BLOCK = 256
GROUPS_PER_BLOCK = 32  # a warp's row groups: its loads of one point are 32 consecutive vectors
SLICES = 8             # threads per row group: each folds the others' partials, one by one
ROWS_PER_THREAD = 4    # reduced points a thread folds, at least, before its partials are written
UNROLL = 4             # points whose loads a thread issues before it folds the first of them
SMS = 132              # an H200's multiprocessors
# A thread's live values per row group (width x (reductions + row-level stores)) from which
# ptxas gives the kernel more than 128 registers, so one 256-thread block per multiprocessor:
# such a grid is one wave of SMS blocks, a lighter one two waves of two.
HEAVY_VALUES = 64
FOLD_UNROLL = 4        # rounds of the splits' partials the last block loads at once
SLOT_BYTES = 8         # a partial's slot in scratch holds any register type up to 64 bits


def columns_fit(kernel: Kernel, analysis: Analysis) -> bool:
    """Whether `kernel` is a column reduction this strategy runs (see the module docstring)."""
    k = kernel
    if k.kind != "reduction" or not k.parallel or not k.reduce or not k.reductions:
        return False
    if any(s.mode != "set" or s.level == "element" and analysis.uses(s.value).rows for s in k.stores):
        return False
    if any(r.op not in ("sum", "prod", "max", "min") or analysis.uses(r.value).rows for r in k.reductions):
        return False
    column, last_reduced = len(k.parallel) - 1, k.rank - 1
    reduced = frozenset(range(len(k.parallel), k.rank))
    loads = [e for e in subexpressions(r.value for r in k.reductions) if isinstance(e, Load)]
    # The loads of every reduced point that differ from row to row: they must run along the rows
    # (a per-point value all rows share, such as a token's mean, is one load for every lane).
    strided = [ld for ld in loads if analysis.uses(ld).dims & reduced and column in analysis.uses(ld).dims]
    if not strided:
        return False
    for ld in strided:
        flat = flat_index(ld.index, k.inputs[ld.input].type.shape)
        if not moves_in_runs(flat, column, GROUPS_PER_BLOCK, analysis) or moves_with(flat, last_reduced, analysis):
            return False
    return True


def _lanes_for(values: int) -> int:
    """The widest vector (rows per thread, a power of two) that keeps a thread's live values
    (`values` per row: reductions and row-level stores) under HEAVY_VALUES. A layer norm's
    backward with its weights' AdamW updates (3 reductions, 9 row stores) took 19 us at 8 bf16
    rows per thread on the H200, its float32 twin at 4 rows 9 us: the narrower vector keeps the
    kernel out of the heavy class and gives the grid twice the row groups."""
    lanes = MAX_LANES
    while lanes > 1 and lanes * values >= HEAVY_VALUES:
        lanes //= 2
    return lanes


class ColumnPlan:
    """How a column reduction maps onto the GPU: `width` rows per thread, `per_block` of the
    `groups` row groups per block (a tile), each folded by `slices` threads, the reduced points
    split over `splits` blocks per tile."""

    def __init__(self, kernel: Kernel, analysis: Analysis):
        values = len(kernel.reductions) + sum(s.level == "row" for s in kernel.stores)
        self.vec = Vectorization(kernel, analysis, len(kernel.parallel) - 1, kernel.parallel[-1],
                                 _lanes_for(values))
        self.width = self.vec.width
        self.rows = math.prod(kernel.parallel)
        self.points = math.prod(kernel.reduce)
        self.groups = self.rows // self.width
        self.per_block = min(GROUPS_PER_BLOCK, pow2_at_least(self.groups))
        self.slices = min(SLICES, BLOCK // self.per_block)
        self.block = self.per_block * self.slices
        self.tiles = -(-self.groups // self.per_block)
        most = max(1, self.points // (ROWS_PER_THREAD * self.slices))
        self.resident = 1 if self.width * values >= HEAVY_VALUES else 2
        # whole waves: a last partial wave would take a whole block's time for a few blocks
        self.splits = max(1, min(most, self.resident * SMS // self.tiles))
        self.per_split = -(-self.points // self.splits)
        self.per_slice = -(-self.per_split // self.slices)
        self.reductions = len(kernel.reductions)

    @property
    def scratch_bytes(self) -> int:
        """The partials every split writes: one slot per split, reduction and row."""
        return 0 if self.splits == 1 else self.splits * self.reductions * self.rows * SLOT_BYTES

    @property
    def counter_bytes(self) -> int:
        return 0 if self.splits == 1 else 4 * self.tiles


def emit_columns(ke: KernelEmitter, plan: ColumnPlan) -> tuple[int, int, str]:
    """Emit the kernel; `ke.extra_ptrs` are (partials scratch, counters) when it splits."""
    k, b = ke.kernel, ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    if plan.resident > 1:
        # the wave of two blocks a multiprocessor the grid is sized for: without the floor the
        # driver's compiler may take more than half the registers (161 for a norm's weight
        # gradients at GPT-2 width, one block a multiprocessor and two waves: 33 us for 60 MiB)
        ke.min_blocks = plan.resident
    ke.await_producers()
    block_id, tid = ke.block_index(), ke.thread_index()
    split, tile = b.udiv(block_id, c(plan.tiles)), b.urem(block_id, c(plan.tiles))
    column, slice_ = b.urem(tid, c(plan.per_block)), b.udiv(tid, c(plan.per_block))
    group = b.add(b.mul(tile, c(plan.per_block)), column)
    valid = b.icmp_unsigned("<", group, c(plan.groups)) if plan.groups % plan.per_block else None
    if valid is not None:
        group = b.select(valid, group, c(0))
    first = b.mul(group, c(plan.width))
    coords = unflatten(b, first, k.parallel)
    end = _smaller(b, b.add(b.mul(split, c(plan.per_split)), c(plan.per_split)), c(plan.points))
    lo = _smaller(b, b.add(b.mul(split, c(plan.per_split)), b.mul(slice_, c(plan.per_slice))), end)
    hi = _smaller(b, b.add(lo, c(plan.per_slice)), end)
    starts = [[Partial.start(r) for r in k.reductions] for _ in range(plan.width)]
    shapes = [len(p.values) for p in starts[0]]

    element_stores = [s for s in k.stores if s.level == "element"]

    def body(b: ir.IRBuilder, r: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        it = iter(values)
        lanes = LaneGroup(ke, plan.vec, coords + unflatten(b, r, k.reduce))
        lanes.preload([red.value for red in k.reductions] + [s.value for s in element_stores])
        out = []
        for lane, em in enumerate(lanes.emitters):
            for red, n in zip(k.reductions, shapes):
                p = Partial.start(red).with_values([next(it) for _ in range(n)])
                out += list(p.add(b, em.value(red.value), r, None).values)
        for s in element_stores:  # evaluated here, so that no value the sums share is first
            lanes.values(s.value)  # computed inside the store's branch (it would not dominate)
        with when(b, valid):
            lanes.store_all(element_stores)
        return out

    carried = [v for lane in starts for p in lane for v in p.values]
    # Unrolled, a thread's loads of several points are in flight at once: a split is only a few
    # points long, and one point at a time its time is that many memory latencies.
    folded = loop(b, lo, hi, body, carried, name="point", vectorize=False, unroll=UNROLL)
    partials = _combine_slices(ke, plan, _unpack(folded, k, plan.width, shapes), slice_, column)
    first_slice = b.icmp_unsigned("==", slice_, c(0))
    writer = b.and_(valid, first_slice) if valid is not None else first_slice
    if plan.splits > 1:
        partials = _combine_splits(ke, plan, partials, split, tile, group, writer, slice_, column)
    _store_rows(ke, plan, coords, partials, writer)
    strategy = f"columns x{plan.width} slices {plan.slices} splits {plan.splits}" + \
        (" (last block combines)" if plan.splits > 1 else "")
    return plan.tiles * plan.splits, plan.block, strategy


def _smaller(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_unsigned("<", x, y), x, y)


def _unpack(values: list[ir.Value], k: Kernel, width: int, shapes: list[int]) -> list[list[Partial]]:
    it = iter(values)
    return [[Partial.start(r).with_values([next(it) for _ in range(n)]) for r, n in zip(k.reductions, shapes)]
            for _ in range(width)]


def _slot(ke: KernelEmitter, plan: ColumnPlan, split: ir.Value, reduction: int, row: ir.Value) -> ir.Value:
    """Where split `split` keeps reduction `reduction`'s partial for `row`."""
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    index = b.add(b.mul(b.add(b.mul(split, c(plan.reductions)), c(reduction)), c(plan.rows)), row)
    return b.gep(ke.extra_ptrs[0], [b.mul(index, c(SLOT_BYTES))], inbounds=True, source_etype=ir.IntType(8))


def _combine_slices(ke: KernelEmitter, plan: ColumnPlan, partials: list[list[Partial]], slice_: ir.Value,
                    column: ir.Value) -> list[list[Partial]]:
    """Every thread's partials folded with those of the other slices of its row group, in slice
    order, through shared memory: afterwards every slice of a group holds the same result."""
    if plan.slices == 1:
        return partials
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    arrays: dict[str, ir.Value] = {}  # one per register type, reused reduction after reduction

    def at(array: ir.Value, lane: int, s: ir.Value, ty: ir.Type) -> ir.Value:
        # [lane][slice][column]: a warp's 32 columns are consecutive words, no bank conflicts
        index = b.add(b.mul(b.add(b.mul(c(lane), c(plan.slices)), s), c(plan.per_block)), column)
        return ke.shared_at(array, index, ty)

    combined: list[list[Partial]] = [[] for _ in partials]
    for i in range(plan.reductions):
        ty = partials[0][i].values[0].type
        array = arrays.get(str(ty))
        if array is None:
            array = arrays[str(ty)] = ke.shared(ty, plan.width * plan.block)
        else:
            ke.barrier()  # every thread has read the previous reduction's partials
        for lane, lane_partials in enumerate(partials):
            b.store(lane_partials[i].values[0], at(array, lane, slice_, ty))
        ke.barrier()
        for lane, lane_partials in enumerate(partials):
            acc = lane_partials[i].with_values([b.load(at(array, lane, c(0), ty), typ=ty)])
            for s in range(1, plan.slices):
                acc = acc.combine(b, lane_partials[i].with_values([b.load(at(array, lane, c(s), ty), typ=ty)]))
            combined[lane].append(acc)
    ke.barrier()  # the shared arrays may be used again (the last block's second meeting)
    return combined


def _combine_splits(ke: KernelEmitter, plan: ColumnPlan, partials: list[list[Partial]], split: ir.Value,
                    tile: ir.Value, group: ir.Value, writer: ir.Value, slice_: ir.Value,
                    column: ir.Value) -> list[list[Partial]]:
    """Write this split's partials (the first slice of each row group does), count the block
    in, and in the tile's last block fold every split's partials back — slice s takes splits s,
    s + slices, ... in order, then the slices meet — the other blocks return here."""
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    first = b.mul(group, c(plan.width))
    with when(b, writer):
        for lane, lane_partials in enumerate(partials):
            row = b.add(first, c(lane))
            for i, p in enumerate(lane_partials):
                b.store(p.values[0], _slot(ke, plan, split, i, row))
    # The barrier orders every thread's partials before thread 0's fence, which releases them
    # to the GPU with its count; the last block's thread 0 acquires the others' the same way
    # before its barrier (the pattern of a cooperative grid sync: one fence per block, not per
    # thread, each costing a wait for the thread's writes).
    ke.barrier()
    flag = ke.shared(I32, 1)
    counter = b.gep(ke.extra_ptrs[1], [tile], inbounds=True, source_etype=I32)
    with b.if_then(b.icmp_unsigned("==", ke.thread_index(), c(0))):
        ke.fence_gpu()
        old = b.atomic_rmw("add", counter, ir.Constant(I32, 1), "monotonic")
        last = b.icmp_unsigned("==", old, ir.Constant(I32, plan.splits - 1))
        b.store(b.zext(last, I32), ke.shared_at(flag, c(0), I32))
        with b.if_then(last):
            ke.fence_gpu()
            b.store(ir.Constant(I32, 0), counter)  # every other block of the tile has counted in
    ke.barrier()
    is_last = b.icmp_unsigned("!=", b.load(ke.shared_at(flag, c(0), I32), typ=I32), ir.Constant(I32, 0))
    exit_block = b.append_basic_block("not_last")
    go_on = b.append_basic_block("last_block")
    b.cbranch(is_last, go_on, exit_block)
    b.position_at_end(exit_block)
    b.ret_void()
    b.position_at_end(go_on)
    identities = [Partial.start(r).values[0] for r in ke.kernel.reductions]

    def fold(b: ir.IRBuilder, round_: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        s = b.add(slice_, b.mul(round_, c(plan.slices)))
        inside = b.icmp_unsigned("<", s, c(plan.splits))
        slot = _smaller(b, s, c(plan.splits - 1))
        it = iter(values)
        out = []
        for lane, lane_partials in enumerate(partials):
            row = b.add(first, c(lane))
            for i, p in enumerate(lane_partials):
                value = b.load(_slot(ke, plan, slot, i, row), typ=identities[i].type)
                acc = p.with_values([next(it)])
                out += acc.combine(b, p.with_values([b.select(inside, value, identities[i])])).values
        return out

    # A loop over the rounds, FOLD_UNROLL at a time, not every round written out: at GPT-2
    # width a norm's three sums of eight rows over eleven rounds are 264 loads, which ptxas
    # would all hoist (the epilogue, not this fold, is what sets the kernel's registers).
    rounds = -(-plan.splits // plan.slices)
    start = [identities[i] for lane_partials in partials for i in range(len(lane_partials))]
    values = iter(loop(b, 0, rounds, fold, start, name="round", vectorize=False, unroll=FOLD_UNROLL))
    folded = [[p.with_values([next(values)]) for p in lane_partials] for lane_partials in partials]
    return _combine_slices(ke, plan, folded, slice_, column)


def _store_rows(ke: KernelEmitter, plan: ColumnPlan, coords: list[ir.Value], partials: list[list[Partial]],
                valid: ir.Value | None) -> None:
    """The kernel's row-level stores for each of this thread's rows: every row's loads (the
    optimizer state the sums update, as vectors) and values first, then the stores. Row by row,
    each row's loads would wait behind the previous row's stores, which may write the same
    places (in place), and the epilogue would take a memory latency per row."""
    k, b = ke.kernel, ke.b
    with when(b, valid):
        lanes = LaneGroup(ke, plan.vec, list(coords) + [None] * len(k.reduce))
        for em, lane_partials in zip(lanes.emitters, partials):
            em.rows = [p.result(b) for p in lane_partials]
        row_stores = [s for s in k.stores if s.level == "row"]
        lanes.preload([s.value for s in row_stores])
        lanes.store_all(row_stores)
    b.ret_void()
