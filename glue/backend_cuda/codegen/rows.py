"""Row reductions on the GPU: a group of `T` threads (a power of two, up to a block) per row.

Each thread takes the row's 16-byte vector groups `lane, lane + T, lane + 2T, ...` (so a warp
reads consecutive memory), folds them into per-thread partials, and the group combines those
with warp shuffles and, past one warp, shared memory (`KernelEmitter.group_reduce`). Reductions
run in levels: a level folds the reductions that only use row values of earlier levels
(softmax: the max, then the sum of exponentials); row-level work between levels is computed
once per thread, not once per element.

- registers: when a thread's share of the row is at most `HOLD` elements, its element values
  are emitted once, straight-line, and stay in registers across every level and the final
  stores: one pass over memory however many reductions there are (softmax, layernorm,
  cross-entropy). Rows shorter than a warp share warps: `256 / T` rows per block.
- looping: longer rows are read once per level and once more for the element stores, in chunks
  of `TARGET` elements per thread. Passes alternate direction (forward, backward, forward...), so
  a pass starts on the chunks the previous one read last, which are the likeliest still in L2:
  with a block's row of 256 KB and two blocks on each of the 132 multiprocessors, the rows in
  flight outgrow the 50 MB L2, and a softmax over 65536-wide float32 rows goes from 66% to 75%
  of the copy bandwidth. Rows of more than `config.cuda_online_row_elements`, whose re-reads mostly miss L2,
  fold a softmax's max and sum of exponentials in one pass (`online.py`), in chunks of
  ONLINE_CHUNK elements per thread. A float sum (an online one too) folds each chunk from
  zero and joins it to the thread's total with a compensated sum, so that a thread's
  thousands of elements do not add up their rounding errors.

Out-of-range groups of a ragged last chunk read group 0 (always in bounds) and are left out of
the folds and the stores, so no load is ever out of bounds and no branch splits a warp before a
shuffle.
"""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import VECTOR_BYTES, KernelEmitter, LaneGroup, Partial, Vectorization, pow2_at_least, when
from glue.backend_cuda.codegen.online import OnlineSum, online_pairs, rescale
from glue.codegen import reductions
from glue.codegen.loops import loop, unflatten
from glue.codegen.scope import Analysis, hoist
from glue.codegen.types import I64
from glue.settings import config
from glue.scheduler.kernel_ir import Kernel, loads_under

HOLD = 32            # elements a thread may keep in registers
TARGET = 16          # elements per thread the register variant aims for
PRELOAD = 16         # up to this many elements per thread, every load is issued before the first fold
MAX_THREADS = 1024
# Copies of a long row's chunk loop that LLVM may unroll into before sm_90 (where it unrolls the
# loop whole, which measured fastest): sm_80's ptxas gives 1024-thread blocks 32 registers, and
# with every copy's loads scheduled ahead a 16-bit softmax spills.
OLD_ARCH_CHUNK_COPIES = 2
# Rows longer than this fold a max and its sum of exponentials in one pass. On the H200 a
# softmax over 65536-element rows is faster in three passes (float32 76% of the copy against
# 69.5% online, bfloat16 84% against 75%), over 131072 elements online (66% against 58%, 73.5%
# against 69%), and the gap grows with the row (262144-524288: 63-66% against 52-56%).
ONLINE_CHUNK = 8     # elements per thread per chunk of an online pass: all are live until the chunk's max
BLOCK = 256
# A light register-held row kernel whose threads each load fewer than SHORT_BYTES of the row (16-
# bit rows) keeps at least RESIDENT_THREADS resident per multiprocessor (of 2048): each block
# moves few bytes per trip through its reductions' barriers, so more blocks must be in flight.
RESIDENT_THREADS = 1536
SHORT_BYTES = 64
LIGHT_PARTIALS = 2  # partial values per thread (an argmax carries two) that still count as light


def reduction_levels(kernel: Kernel, analysis: Analysis, fused: dict[int, int] | None = None) -> list[list[int]]:
    """Reductions grouped by dependency depth: a level uses only row values of earlier ones.
    `fused` (a max -> the sum folded with it) puts each such sum in its max's level."""
    partner = {j: i for i, j in (fused or {}).items()}
    depth: dict[int, int] = {}
    for i, r in enumerate(kernel.reductions):
        depth[i] = depth[partner[i]] if i in partner else \
            1 + max((depth[j] for j in analysis.uses(r.value).rows), default=-1)
    return [[i for i in depth if depth[i] == d] for d in sorted(set(depth.values()))]


class _RowEmitter:
    def __init__(self, ke: KernelEmitter):
        self.ke, self.b, self.k = ke, ke.b, ke.kernel
        k = self.k
        self.rows = math.prod(k.parallel)
        self.vec = Vectorization(k, ke.analysis, k.rank - 1 if k.reduce and ke.aligned else None,
                                 k.reduce[-1] if k.reduce else 1)
        self.width = self.vec.width
        self.groups = math.prod(k.reduce) // self.width
        per_thread = max(1, TARGET // self.width)
        self.threads = min(MAX_THREADS, pow2_at_least(-(-self.groups // per_thread)))
        self.slots = -(-self.groups // self.threads)
        self.looping = self.slots * self.width > HOLD
        online = self.looping and self.groups * self.width > config.cuda_online_row_elements
        self.pairs = online_pairs(k, ke.analysis) if online else {}
        chunk = ONLINE_CHUNK if self.pairs else TARGET
        self.unroll = max(1, chunk // self.width)  # vector groups per thread per chunk when looping
        self.backward = True  # the direction of the last pass over a long row: the first goes forward
        self.rows_per_block = max(1, BLOCK // self.threads)
        self.reduce_dims = frozenset(range(len(k.parallel), k.rank))

    def build(self) -> tuple[int, int, str]:
        k, b, ke = self.k, self.b, self.ke
        T, B = self.threads, self.rows_per_block
        tid = ke.thread_index()
        self.lane = b.and_(tid, ir.Constant(I64, T - 1))
        self.member = b.lshr(tid, ir.Constant(I64, T.bit_length() - 1))
        row = b.add(b.mul(ke.block_index(), ir.Constant(I64, B)), self.member)
        self.row_ok = None
        if self.rows % B:
            self.row_ok = b.icmp_unsigned("<", row, ir.Constant(I64, self.rows))
            row = b.select(self.row_ok, row, ir.Constant(I64, 0))
        self.coords = unflatten(b, row, k.parallel) if k.parallel else []
        self.outer = ke.emitter(self.coords + [None] * len(k.reduce))
        self.outer.rows = [None] * len(k.reductions)
        slots = [] if self.looping else [self.slot(ir.Constant(I64, s * T), s * T + T <= self.groups)
                                         for s in range(self.slots)]
        # Loads of later levels and of the stores that differ per row (a cross-entropy's labels)
        # go out with the row's, so their latency overlaps the reductions instead of following
        # them: into registers when the thread's share is small, else into L2.
        pairs = self.pairs
        levels = reduction_levels(k, ke.analysis, pairs)
        later = [k.reductions[i].value for level in levels[1:] for i in level] + [s.value for s in k.stores]
        first_level = set(loads_under([k.reductions[i].value for i in (levels[0] if levels else [])]))
        for lanes, _, _ in slots:
            if self.slots * self.width <= PRELOAD:
                lanes.preload(later, self.per_row)
            else:
                lanes.prefetch(later, lambda ld: self.per_row(ld) and ld not in first_level)
        for level in levels:
            exprs = [k.reductions[i].value for i in level]
            hoist(self.outer, exprs, ke.analysis, self.reduce_dims, frozenset(level))
            level = [i for i in level if i not in pairs.values()]  # a fused sum rides on its max
            partials = [OnlineSum.start(k.reductions[i], k.reductions[pairs[i]]) if i in pairs
                        else Partial.start(k.reductions[i]) for i in level]
            if self.looping:
                partials = self.fold_looping(exprs, partials)
            else:
                for lanes, valid, first in slots:
                    partials = self.fold(lanes, valid, first, exprs, partials)
            partials = ke.group_reduce(partials, T, B, self.lane, self.member)
            for i, p in zip(level, partials):
                if i in pairs:
                    self.outer.rows[i], self.outer.rows[pairs[i]] = p.values
                else:
                    self.outer.rows[i] = p.result(b)
        self.element_stores(slots)
        row_stores = [s for s in k.stores if s.level == "row"]
        if row_stores:
            first_lane = b.icmp_unsigned("==", self.lane, ir.Constant(I64, 0))
            with when(b, self.both(first_lane, self.row_ok)):
                ke.store_all(self.outer, row_stores)
        b.ret_void()
        partials = sum(len(Partial.start(r).values) for r in k.reductions)
        short = self.slots * VECTOR_BYTES < SHORT_BYTES
        if not self.looping and short and partials <= LIGHT_PARTIALS and T * B <= RESIDENT_THREADS // 2:
            ke.min_blocks = RESIDENT_THREADS // (T * B)
        if self.looping:
            variant = f"looping{' online' if pairs else ''} x{self.unroll}"
        else:
            variant = f"registers {self.slots * self.width}/thread"
        return -(-self.rows // B), T * B, f"rows {variant} T={T} x{self.width}"

    def per_row(self, load) -> bool:
        """Whether a load is issued with the row's own: its address needs no row value, and it
        differs from row to row (a weight every row shares stays in cache and is loaded where
        it is used, rather than held in registers through the reductions)."""
        uses = self.ke.analysis.uses(load)
        return not uses.rows and any(d < len(self.k.parallel) for d in uses.dims)

    def both(self, a: ir.Value | None, c: ir.Value | None) -> ir.Value | None:
        """The conjunction of two optional conditions (None: always true)."""
        if a is None or c is None:
            return c if a is None else a
        return self.b.and_(a, c)

    def slot(self, base: ir.Value, always_valid: bool) -> tuple[LaneGroup, ir.Value | None, ir.Value]:
        """The vector group `base + lane` of this thread's row: its lanes, whether it lies in the
        row (None when it always does) and its first element's position in the row."""
        b = self.b
        group = b.add(base, self.lane)
        valid = None
        if not always_valid:
            valid = b.icmp_unsigned("<", group, ir.Constant(I64, self.groups))
            group = b.select(valid, group, ir.Constant(I64, 0))
        first = b.mul(group, ir.Constant(I64, self.width))
        lanes = LaneGroup(self.ke, self.vec, self.coords + unflatten(b, first, self.k.reduce), self.outer)
        return lanes, valid, first

    def refresh(self, lanes: LaneGroup) -> None:
        """Give a group's emitters the row values and row-level work computed since it began."""
        for em in lanes.emitters:
            em.memo.update(self.outer.memo)

    def fold(self, lanes: LaneGroup, valid, first, exprs, partials: list[Partial]) -> list[Partial]:
        b = self.b
        self.refresh(lanes)
        lanes.preload(exprs)
        for lane, em in enumerate(lanes.emitters):
            position = b.add(first, ir.Constant(I64, lane)) if lane else first
            partials = [p.add(b, em.value(p.reduction.value), position, valid) for p in partials]
        return partials

    def chunks(self, body, carried, reversible: bool = True):
        """Run `body(b, chunk, carried)` over the row's chunks, against the direction of the last
        pass where `reversible` (an arg-reduction needs positions in increasing order)."""
        count = -(-self.groups // (self.threads * self.unroll))
        backward = self.backward = reversible and not self.backward

        def ordered(b: ir.IRBuilder, c: ir.Value, values: list[ir.Value]):
            return body(b, b.sub(ir.Constant(I64, count - 1), c) if backward else c, values)

        copies = None if self.ke.sm >= 90 else OLD_ARCH_CHUNK_COPIES
        return loop(self.b, 0, count, ordered, carried, name="chunk", vectorize=False, unroll=copies)

    def fold_looping(self, exprs, partials: list[Partial]) -> list[Partial]:
        """Fold a long row chunk by chunk. A thread's share of a long row is thousands of
        elements, which one accumulator would add with an error growing with their number: a
        float sum (also an online sum of exponentials) folds each chunk from zero and adds it to
        the thread's running total with compensation (`reductions.compensated_add`)."""
        shapes = [len(p.values) for p in partials]
        summed = [i for i, p in enumerate(partials) if isinstance(p, OnlineSum)
                  or reductions.compensated(p.reduction.op, p.reduction.dtype)]

        def body(b: ir.IRBuilder, c: ir.Value, values: list[ir.Value]):
            it = iter(values)
            current = [p.with_values([next(it) for _ in range(n)]) for p, n in zip(partials, shapes)]
            errors = list(it)
            before = {i: current[i] for i in summed}
            for i in summed:
                current[i] = _restarted(current[i])
            base = b.mul(c, ir.Constant(I64, self.threads * self.unroll))
            groups = []
            for u in range(self.unroll):
                lanes, valid, first = self.slot(b.add(base, ir.Constant(I64, u * self.threads)), False)
                current = self.fold(lanes, valid, first, exprs, current)
                groups.append((lanes, valid))
            current = [p.add_chunk(b, self.k.reductions.index(p.reduction), groups)
                       if isinstance(p, OnlineSum) else p for p in current]
            for j, i in enumerate(summed):
                current[i], errors[j] = _add_chunk_total(b, before[i], errors[j], current[i])
            return [v for p in current for v in p.values] + errors

        reversible = not any(p.reduction.op.startswith("arg") for p in partials)
        zeros = [_sum_of(partials[i]).type(0.0) for i in summed]
        out = iter(self.chunks(body, [v for p in partials for v in p.values] + zeros, reversible))
        folded = [p.with_values([next(out) for _ in range(n)]) for p, n in zip(partials, shapes)]
        for i, error in zip(summed, out):
            p = folded[i]
            total = reductions.compensated_result(self.b, _sum_of(p), error)
            folded[i] = p.with_values(p.values[:-1] + (total,))
        return folded

    def element_stores(self, slots) -> None:
        stores = [s for s in self.k.stores if s.level == "element"]
        if not stores:
            return
        values = [s.value for s in stores]

        def emit(lanes: LaneGroup, valid: ir.Value | None) -> None:
            with when(self.b, self.both(valid, self.row_ok)):
                self.refresh(lanes)
                lanes.preload(values)
                lanes.store_all(stores)

        if not self.looping:
            for lanes, valid, _ in slots:
                emit(lanes, valid)
            return

        def body(b: ir.IRBuilder, c: ir.Value, _):
            base = b.mul(c, ir.Constant(I64, self.threads * self.unroll))
            for u in range(self.unroll):
                lanes, valid, _ = self.slot(b.add(base, ir.Constant(I64, u * self.threads)), False)
                emit(lanes, valid)
            return []

        self.chunks(body, [])


def _sum_of(p: Partial | OnlineSum) -> ir.Value:
    """The running sum of a float sum's partial, or of an online max-and-sum (its last value)."""
    return p.values[-1]


def _restarted(p: Partial | OnlineSum) -> Partial | OnlineSum:
    """`p` with its sum set back to zero (an online sum keeps its running max)."""
    return p.with_values(p.values[:-1] + (_sum_of(p).type(0.0),))


def _add_chunk_total(b: ir.IRBuilder, before: Partial | OnlineSum, error: ir.Value,
                     chunk: Partial | OnlineSum) -> tuple[Partial | OnlineSum, ir.Value]:
    """Join a chunk folded from zero (`chunk`) to the running total of `before` (with its
    rounding error so far): an online sum's running total and error are first rescaled to the
    chunk's new maximum, as `OnlineSum.add_chunk` rescales its sum."""
    total = _sum_of(before)
    if isinstance(chunk, OnlineSum):
        scale = rescale(b, before.values[0], chunk.values[0])
        total, error = b.fmul(total, scale), b.fmul(error, scale)
    total, error = reductions.compensated_add(b, total, error, _sum_of(chunk))
    return chunk.with_values(chunk.values[:-1] + (total,)), error


def emit_rows(ke: KernelEmitter) -> tuple[int, int, str]:
    """Emit a row-reduction kernel; returns (grid, block, strategy)."""
    ke.await_producers()
    return _RowEmitter(ke).build()
