"""Column reductions on the GPU: reductions whose rows (the kernel's parallel points) are the
contiguous dim of their data, and whose reduced dims are strided — a norm's weight gradient or
a bias gradient, summed over the tokens of each feature (with the optimizer update it feeds).

The row strategy (rows.py) would give each row a group of threads reading it at a stride: a
warp's loads touch 32 lines for 4 bytes of each. Here a thread owns `width` consecutive rows
(one 16-byte vector of the narrowest contiguous operand, so a warp's loads are consecutive
memory) and folds a run of the reduced points into registers, UNROLL points' loads issued before
the first is folded. A block holds `per_block` such row groups (a tile), each folded by
`slices` threads over consecutive runs of the points; the slices' partials meet by warp
butterflies and then, one value a warp, in shared memory. The reduced points also split over
`splits` blocks so that the whole GPU works, and the splits of a tile meet in one of two ways:

- On sm_90 and later, where the tile's splits fit a cluster (8 blocks) and the grid fits the
  part of a wave that clusters pack, they are a cluster's blocks: every block but the first sends its partials into the first
  block's shared memory (`st.async`), counted by an mbarrier there, and returns; the first
  block folds them and runs the kernel's row-level stores (the epilogue). Nothing goes through
  global memory, and nothing waits for the global stores in flight, as a GPU-scope release
  would (a releasing cluster barrier compiles to MEMBAR.GPU: ncu put a quarter of the warp
  samples of a small step's norm gradients on it and on the barrier's wait).
- Otherwise each block writes its partials to the stream's scratch region, and the last block
  of a tile to finish — counted with an atomic increment on a zeroed counter, after a fence that
  makes the partials visible — folds every split's partials (slice s takes splits s, s + slices,
  ..., in order, then the slices meet again), runs the epilogue and sets the counter back to
  zero for the next call or graph replay. Narrow tiles keep the partials the last block reads
  small (a norm's nine reductions over 768 rows in one tile of 256 splits were 14 MB for one
  block to read).

The order of every fold is fixed, so the result does not depend on which block finished first.

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

from glue.backend_cuda.codegen.common import (MAX_LANES, WARP, KernelEmitter, LaneGroup, Partial, Vectorization,
                                              flat_index, moves_in_runs, moves_with, pow2_at_least, when)
from glue.backend_cuda.ptx import sm_number
from glue.codegen.loops import loop, unflatten
from glue.codegen.scope import Analysis
from glue.codegen.types import I32, I64
from glue.scheduler.kernel_ir import Kernel, Load, subexpressions

BLOCK = 256
GROUPS_PER_BLOCK = 32  # a warp's row groups: its loads of one point are 32 consecutive vectors
ROWS_PER_THREAD = 4    # reduced points a thread folds, at least, before its partials are written
UNROLL = 4             # points whose loads a thread issues before it folds the first of them
SMS = 132              # an H200's multiprocessors
# A thread's live values per row group (width x (reductions + row-level stores)) from which
# ptxas gives the kernel more than 128 registers, so one 256-thread block per multiprocessor:
# such a grid is one wave of SMS blocks, a lighter one two waves of two.
HEAVY_VALUES = 64
FOLD_UNROLL = 4        # rounds of the splits' partials the last block loads at once
SLOT_BYTES = 8         # a partial's slot in scratch holds any register type up to 64 bits
FOLD_SHARED_BYTES = 16 << 10  # shared memory the slices' partials of every reduction may take at once
CLUSTER = 8            # blocks a cluster at most: what every sm_90 GPU schedules (16 must opt in)
SECTOR = 32            # bytes: a narrower tile would read part of each 32-byte sector of a row
FULL = 0.45            # of a wave of blocks, from which a cluster plan takes no narrower tiles
# Of a wave's slots, those clusters fill: a cluster starts only where one processor cluster (GPC)
# has room for all its blocks, so they pack a wave raggedly. ncu on the H100 found room for 30
# clusters of 8 at two blocks a multiprocessor, 240 of 264 slots; the qkv bias gradient's 36
# clusters of 7 at GPT-2 width (252 blocks) ran in two waves: 110 us, the same plan by the last
# block 88 in that call.
PACKED = 0.9


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
    split over `splits` blocks per tile; on sm_90 and later, where `cluster` is set, the splits
    of a tile are a cluster's blocks and meet in distributed shared memory, else they meet in
    global scratch and the tile's last block to finish folds them."""

    def __init__(self, kernel: Kernel, analysis: Analysis, arch: str):
        values = len(kernel.reductions) + sum(s.level == "row" for s in kernel.stores)
        self.vec = Vectorization(kernel, analysis, len(kernel.parallel) - 1, kernel.parallel[-1],
                                 _lanes_for(values))
        self.width = self.vec.width
        self.rows = math.prod(kernel.parallel)
        self.points = math.prod(kernel.reduce)
        self.groups = self.rows // self.width
        self.reductions = len(kernel.reductions)
        self.resident = 1 if self.width * values >= HEAVY_VALUES else 2
        self.cluster = 0
        self._tile(min(GROUPS_PER_BLOCK, pow2_at_least(self.groups)), self.points)
        if sm_number(arch) >= 90 and self.splits > 1:
            self._cluster_tiles()
        self.per_split = -(-self.points // self.splits)
        self.per_slice = -(-self.per_split // self.slices)

    def _tile(self, per_block: int, most_splits: int) -> None:
        """Tiles of `per_block` row groups, split over as many blocks as make whole waves (a
        last partial wave would take a whole block's time for a few blocks), `most_splits` at most."""
        self.per_block = per_block
        self.slices = BLOCK // per_block
        self.tiles = -(-self.groups // per_block)
        most = max(1, self.points // (ROWS_PER_THREAD * self.slices))
        self.splits = max(1, min(most, most_splits, self.resident * SMS // self.tiles))

    def _cluster_tiles(self) -> None:
        """Tiles split over at most a cluster's blocks: the widest that give the grid FULL of a
        wave (wide tiles read long runs of each row), else the widest of those giving it the
        most blocks, no narrower than a sector for a row group's rows. Taken where the tiles
        still split, the grid has a block for every multiprocessor (or as many as the
        global-scratch plan) and fits the part of a wave clusters pack (PACKED)."""
        global_blocks, global_per_block = self.tiles * self.splits, self.per_block
        itemsize = min((ld.dtype.itemsize for ld in self.vec.loads), default=4)
        narrowest = pow2_at_least(-(-SECTOR // (self.width * itemsize)))
        wave = self.resident * SMS
        best, per_block = (0, 0), global_per_block
        while True:
            self._tile(per_block, CLUSTER)
            best = max(best, (self.tiles * self.splits, per_block))
            if self.tiles * self.splits >= FULL * wave or per_block <= narrowest:
                break
            per_block //= 2
        blocks, per_block = best
        self._tile(per_block, CLUSTER)
        if self.splits > 1 and min(global_blocks, SMS) <= blocks <= PACKED * wave:
            self.cluster = self.splits
        else:
            self._tile(global_per_block, self.points)

    @property
    def scratch_bytes(self) -> int:
        """The partials every split writes to global scratch: one slot per split, reduction and row."""
        return 0 if self.splits == 1 or self.cluster else self.splits * self.reductions * self.rows * SLOT_BYTES

    @property
    def counter_bytes(self) -> int:
        return 0 if self.splits == 1 or self.cluster else 4 * self.tiles


def emit_columns(ke: KernelEmitter, plan: ColumnPlan) -> tuple[int, int, str]:
    """Emit the kernel; `ke.extra_ptrs` are (partials scratch, counters) when it splits."""
    k, b = ke.kernel, ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    if plan.resident > 1:
        # the wave of two blocks a multiprocessor the grid is sized for: without the floor the
        # driver's compiler may take more than half the registers (161 for a norm's weight
        # gradients at GPT-2 width, one block a multiprocessor and two waves: 33 us for 60 MiB)
        ke.min_blocks = plan.resident
    block_id, tid = ke.block_index(), ke.thread_index()
    if plan.cluster:  # a tile's splits are consecutive blocks, a cluster
        tile, split = b.udiv(block_id, c(plan.splits)), b.urem(block_id, c(plan.splits))
    else:  # a split's tiles are: blocks running together read whole rows of the points
        split, tile = b.udiv(block_id, c(plan.tiles)), b.urem(block_id, c(plan.tiles))
    meeting = None
    if plan.cluster:
        ke.cluster = plan.cluster
        meeting = _ClusterMeeting(ke, plan, split)
    ke.await_producers()
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

    def body(b: ir.IRBuilder, step: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        # UNROLL points, every value of each computed (its loads issued) before the first fold
        # and store, so that a thread's loads of several points are in flight at once: a split
        # is only a few points long, and one point at a time its time is that many memory
        # latencies. In program order, an element store written in place over an input held
        # the next point's loads behind it (LLVM cannot tell the two points' elements apart).
        start = b.add(lo, b.mul(step, c(UNROLL)))
        points = []
        for u in range(UNROLL):
            r = b.add(start, c(u))
            inside = b.icmp_unsigned("<", r, hi)
            lanes = LaneGroup(ke, plan.vec, coords + unflatten(b, b.select(inside, r, lo), k.reduce))
            lanes.preload([red.value for red in k.reductions] + [s.value for s in element_stores])
            terms = [[em.value(red.value) for red in k.reductions] for em in lanes.emitters]
            for s in element_stores:  # computed here, not first inside the store's branch
                lanes.values(s.value)
            points.append((r, inside, lanes, terms))
        acc = _unpack(values, k, plan.width, shapes)
        for r, inside, lanes, terms in points:
            acc = [[p.add(b, term, r, inside) for p, term in zip(lane_acc, lane_terms)]
                   for lane_acc, lane_terms in zip(acc, terms)]
            with when(b, b.and_(inside, valid) if valid is not None else inside):
                lanes.store_all(element_stores)
        return [v for lane_acc in acc for p in lane_acc for v in p.values]

    carried = [v for lane in starts for p in lane for v in p.values]
    steps = b.udiv(b.add(b.sub(hi, lo), c(UNROLL - 1)), c(UNROLL))
    folded = loop(b, 0, steps, body, carried, name="point", vectorize=False, unroll=1)
    partials = _combine_slices(ke, plan, _unpack(folded, k, plan.width, shapes), slice_, column)
    first_slice = b.icmp_unsigned("==", slice_, c(0))
    writer = b.and_(valid, first_slice) if valid is not None else first_slice
    if meeting is not None:
        meeting.send(partials, first_slice, column)
        # What the epilogue loads moves into L2 while the first block waits for the others
        # (loads issued here, ptxas moved past the wait: nothing orders them before it).
        LaneGroup(ke, plan.vec, _epilogue_dims(ke, coords)).prefetch(
            [s.value for s in k.stores if s.level == "row"], lambda ld: not ke.analysis.uses(ld).rows)
        partials = meeting.gather(partials, slice_, column)
    elif plan.splits > 1:
        partials = _combine_splits(ke, plan, partials, split, tile, group, writer, slice_, column)
    _store_rows(ke, plan, coords, partials, writer)
    strategy = f"columns x{plan.width} slices {plan.slices} splits {plan.splits}"
    if plan.cluster:
        strategy += " (a cluster combines)"
    elif plan.splits > 1:
        strategy += " (last block combines)"
    return plan.tiles * plan.splits, BLOCK, strategy


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
    """Every thread's partials folded with those of the other slices of its row group: by
    butterflies over the lanes of a warp that hold the group's slices (`per_block` lanes apart),
    then the warps' results through shared memory, in warp order. Every slice of a group ends
    with the same result, and the order of the folds is fixed."""
    if plan.slices == 1:
        return partials
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    in_warp = max(1, WARP // plan.per_block)  # slices of a group in one warp
    mask = plan.per_block
    while mask < WARP:
        partials = [[p.combine(b, p.shuffled(ke, mask)) for p in lane_partials] for lane_partials in partials]
        mask *= 2
    warps = plan.slices // in_warp
    if warps == 1:
        return partials
    warp = b.udiv(slice_, c(in_warp))
    first_lane = b.icmp_unsigned("==", b.urem(slice_, c(in_warp)), c(0))
    size = plan.width * warps * plan.per_block
    types = [p.values[0].type for p in partials[0]]
    # All reductions meet at once where their arrays fit FOLD_SHARED_BYTES (two barriers), else
    # one after another in arrays reused by type (two barriers each).
    together = sum(size * _type_bytes(ty) for ty in types) <= FOLD_SHARED_BYTES
    rounds = [list(range(plan.reductions))] if together else [[i] for i in range(plan.reductions)]
    arrays: dict[tuple[str, int], ir.Value] = {}  # by type and place in a round, reused round after round

    def at(array: ir.Value, lane: int, w: ir.Value, ty: ir.Type) -> ir.Value:
        # [lane][warp][column]: a warp's columns are consecutive words, no bank conflicts
        index = b.add(b.mul(b.add(b.mul(c(lane), c(warps)), w), c(plan.per_block)), column)
        return ke.shared_at(array, index, ty)

    combined: list[list[Partial]] = [list(lane_partials) for lane_partials in partials]
    for n, members in enumerate(rounds):
        if n:
            ke.barrier()  # every thread has read the previous round's partials
        placed = []
        for place, i in enumerate(members):
            key = (str(types[i]), place)
            if key not in arrays:
                arrays[key] = ke.shared(types[i], size)
            placed.append((i, arrays[key]))
        with b.if_then(first_lane):
            for i, array in placed:
                for lane, lane_partials in enumerate(partials):
                    b.store(lane_partials[i].values[0], at(array, lane, warp, types[i]))
        ke.barrier()
        for i, array in placed:
            ty = types[i]
            for lane, lane_partials in enumerate(partials):
                acc = lane_partials[i].with_values([b.load(at(array, lane, c(0), ty), typ=ty)])
                for w in range(1, warps):
                    acc = acc.combine(b, lane_partials[i].with_values([b.load(at(array, lane, c(w), ty), typ=ty)]))
                combined[lane][i] = acc
    ke.barrier()  # the shared arrays may be used again (the splits' meeting)
    return combined


def _type_bytes(ty: ir.Type) -> int:
    return 8 if isinstance(ty, ir.DoubleType) else 4 if isinstance(ty, ir.FloatType) else max(1, ty.width // 8)


def _wire_type(ty: ir.Type) -> ir.IntType:
    """The integer a partial of type `ty` travels as between blocks (`send` moves 32 or 64 bits)."""
    return I64 if isinstance(ty, ir.DoubleType) or isinstance(ty, ir.IntType) and ty.width == 64 else I32


def _to_wire(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    wire = _wire_type(value.type)
    if isinstance(value.type, ir.IntType):
        return value if value.type.width == wire.width else b.zext(value, wire)
    return b.bitcast(value, wire)


def _from_wire(b: ir.IRBuilder, word: ir.Value, ty: ir.Type) -> ir.Value:
    if isinstance(ty, ir.IntType):
        return word if ty.width == word.type.width else b.trunc(word, ty)
    return b.bitcast(word, ty)


class _ClusterMeeting:
    """Where the splits of a tile, a cluster's blocks, meet: the first block's shared memory
    holds a slot for each block's partials ([block][lane][column], one array a reduction) and
    an mbarrier whose phase completes once the other blocks have sent theirs. Set up before
    the kernel waits for its producers (it touches no global memory), so that the cluster's
    barrier, which makes the mbarrier's initialisation visible to the others before they send,
    overlaps the previous kernel."""

    def __init__(self, ke: KernelEmitter, plan: ColumnPlan, rank: ir.Value):
        b = ke.b
        self.ke, self.plan, self.rank = ke, plan, rank
        self.types = [_wire_type(Partial.start(r).values[0].type) for r in ke.kernel.reductions]
        self.slots = [ke.shared(ty, plan.cluster * plan.width * plan.per_block) for ty in self.types]
        self.barrier = ke.shared_at(ke.shared(I64, 1), ir.Constant(I64, 0), I64)
        sent = (plan.cluster - 1) * plan.width * plan.per_block * sum(ty.width // 8 for ty in self.types)
        self.first_block = b.icmp_unsigned("==", rank, ir.Constant(I64, 0))
        first_thread = b.icmp_unsigned("==", ke.thread_index(), ir.Constant(I64, 0))
        with b.if_then(b.and_(first_thread, self.first_block)):
            ke.mbarrier_init(self.barrier, 1)
            ke.expect_bytes(self.barrier, sent)
        ke.cluster_barrier()

    def slot(self, reduction: int, block: ir.Value, lane: int, column: ir.Value) -> ir.Value:
        b, c = self.ke.b, lambda v: ir.Constant(I64, v)  # noqa: E731
        index = b.add(b.mul(b.add(b.mul(block, c(self.plan.width)), c(lane)), c(self.plan.per_block)), column)
        return self.ke.shared_at(self.slots[reduction], index, self.types[reduction])

    def send(self, partials: list[list[Partial]], first_slice: ir.Value, column: ir.Value) -> None:
        """The first slice of each row group puts the block's partials in its slots in the
        first block: sent from the others, which then return."""
        ke, b = self.ke, self.ke.b
        zero = ir.Constant(I64, 0)
        with b.if_then(first_slice):
            with b.if_else(self.first_block) as (here, there):
                with here:
                    for lane, lane_partials in enumerate(partials):
                        for i, p in enumerate(lane_partials):
                            b.store(_to_wire(b, p.values[0]), self.slot(i, zero, lane, column))
                with there:
                    barrier = ke.in_cluster_block(self.barrier, zero)
                    for lane, lane_partials in enumerate(partials):
                        for i, p in enumerate(lane_partials):
                            target = ke.in_cluster_block(self.slot(i, self.rank, lane, column), zero)
                            ke.send(target, _to_wire(b, p.values[0]), barrier)
        others, first = b.append_basic_block("sent"), b.append_basic_block("first_block")
        b.cbranch(self.first_block, first, others)
        b.position_at_end(others)
        b.ret_void()
        b.position_at_end(first)

    def gather(self, partials: list[list[Partial]], slice_: ir.Value, column: ir.Value) -> list[list[Partial]]:
        """In the first block, once every block's partials are in its slots: slice s reads
        block s's, and the slices meet (`_combine_slices`)."""
        ke, b, plan = self.ke, self.ke.b, self.plan
        zero = ir.Constant(I64, 0)
        ke.barrier()  # the first block's own partials, in its slots
        ke.wait_phase(self.barrier, 0)
        inside = b.icmp_unsigned("<", slice_, ir.Constant(I64, plan.cluster))
        block = b.select(inside, slice_, zero)  # slices past the cluster's blocks read block 0's and drop them
        gathered = []
        for lane, lane_partials in enumerate(partials):
            lane_gathered = []
            for i, p in enumerate(lane_partials):
                word = b.load(self.slot(i, block, lane, column), typ=self.types[i])
                value = _from_wire(b, word, p.values[0].type)
                lane_gathered.append(p.with_values([b.select(inside, value, Partial.start(p.reduction).values[0])]))
            gathered.append(lane_gathered)
        return _combine_slices(ke, plan, gathered, slice_, column)


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


def _epilogue_dims(ke: KernelEmitter, coords: list[ir.Value]) -> list[ir.Value | None]:
    """A row-level store's point: the thread's first row, no reduced point."""
    return list(coords) + [None] * len(ke.kernel.reduce)


def _store_rows(ke: KernelEmitter, plan: ColumnPlan, coords: list[ir.Value], partials: list[list[Partial]],
                valid: ir.Value | None) -> None:
    """The kernel's row-level stores for each of this thread's rows: every row's loads (the
    optimizer state the sums update, as vectors) and values first, then the stores. Row by row,
    each row's loads would wait behind the previous row's stores, which may write the same
    places (in place), and the epilogue would take a memory latency per row."""
    k, b = ke.kernel, ke.b
    with when(b, valid):
        lanes = LaneGroup(ke, plan.vec, _epilogue_dims(ke, coords))
        for em, lane_partials in zip(lanes.emitters, partials):
            em.rows = [p.result(b) for p in lane_partials]
        row_stores = [s for s in k.stores if s.level == "row"]
        lanes.preload([s.value for s in row_stores])
        lanes.store_all(row_stores)
    b.ret_void()
