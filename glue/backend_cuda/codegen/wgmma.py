"""Contractions on sm_90a's warpgroup tensor cores: TMA tile loads into a ring of shared-memory
stages, `wgmma.mma_async` reading them there, a producer warpgroup apart from the consumers.

Applies where both operands of a float32-accumulated product are bfloat16 (or both float16)
tensors read in place (`GemmSpec` views) whose rows or columns are contiguous and whose other
strides and start are 16-byte multiples, as TMA requires; and to float32 operands at every
precision but "highest" (TF32, as jax.jit on the GPU), where both are K-major: `wgmma` reads
TF32 tiles only that way. Anything else (a fused prologue, a gather, an odd stride, an
MN-major float32 operand) stays on the `mma.sync` kernel (mma.py).

A block of three warpgroups computes 128 x BN tiles (BN 256, or 192 or 128 where more tiles fill
the GPU better), one after another: the kernel is persistent, a block per multiprocessor.
Warpgroup 0 is the producer: it gives up registers
(`setmaxnreg.dec`) and one thread of it walks K in steps of 64, waiting for a stage of the ring
to be free (its `empty` mbarrier), announcing the bytes to come (`full`'s expected
transactions) and starting the TMA loads of A's 128 x 64 and B's BN x 64 tiles into it. TMA
writes 128-byte rows with the 128-byte swizzle (16-byte chunks XORed by row % 8), which spreads
every access `wgmma` makes over all banks, and fills whatever lies past the tensor's edge with
zeros, so M, N and K need not be multiples of the tile. Warpgroups 1 and 2 are the consumers,
64 rows each, with the registers the producer gave up: each waits for a stage's `full` barrier,
issues four m64nBNk16 `wgmma`s on it (their operands named by shared-memory descriptors), and
once the previous step's group has completed (`wgmma.wait_group 1`: one step stays in flight on
the tensor cores) frees that step's stage; meanwhile the producer goes on into the block's
next tile, so that its first stages load while the consumers run this tile's epilogue. The
epilogue (the kernel's stores: bias, activation, cast, residual, an optimizer update) runs on
each accumulator where it lies, neighbouring columns stored as one vector; where every store
is a plain 16-bit one, an interior tile's fragment quads trade words so that each lane stores
16 bytes of one row (`AccumulatorStores.store_tile`).

Operands are K-major (the contracting dim contiguous: a row-major lhs, the rhs of `x @ w.T`) or
MN-major (the other dim contiguous); TMA brings either as it lies and `wgmma` reads 16-bit
MN-major tiles transposed (its `tnsp` flags), so no transpose is ever materialised. A stage
holds 128 bytes of K per row: 64 16-bit values or 32 float32 ones (`WgmmaPlan.bk`), and one
`wgmma` takes 32 bytes of them (k16, or k8 for TF32). A K-major tile's rows are its K values;
an MN-major tile is 64-wide boxes of 64 M (or N) values, one 128-byte row per K. The
descriptors' byte offsets follow (PTX ISA, matrix descriptor): 8-row groups 1024 bytes apart;
an MN-major operand's 64-wide atoms a box (8 KiB) apart; each wgmma's step moves 32 bytes along
a K-major row, or 16 rows (2 KiB) down an MN-major tile.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from llvmlite import ir

from glue.backend_cuda.codegen import hopper as hp
from glue.backend_cuda.codegen.common import QUAD, WARP, AccumulatorStores, Coordinates, KernelEmitter, Place
from glue.backend_cuda.ptx import sm_number
from glue.codegen.loops import loop
from glue.codegen.types import F32, I32, I64
from glue.ir import dtypes as dt
from glue.scheduler.gemm import GemmSpec, View, gemm_spec
from glue.scheduler.kernel_ir import Kernel, Load, Op, subexpressions
from glue.settings import config

STEP_BYTES = 32           # the bytes of K (per row) one wgmma reads: k16 of 16-bit values, k8 of TF32
ATOM = 64                 # an MN-major box's width: 128 bytes of 16-bit values
BOX_BYTES = ATOM * hp.SWIZZLE_BYTES  # one 64 x 64 box of 16-bit values
CONSUMERS = hp.CONSUMERS  # consumer warpgroups, 64 rows of the tile each
WARPGROUP = hp.WARPGROUP
BM = 64 * CONSUMERS
WIDTHS = (256, 192, 128)  # tile widths (N), widest first
SHARED_LIMIT = 227 << 10  # dynamic shared memory a block may opt into on the H100/H200
MAX_STAGES = 6
SMS = 132                 # multiprocessors of an H100/H200: blocks of a wave
GROUP_M = 8               # tile rows a band of blocks walks before moving right (L2 reuse)
# Below this many 128 x 128 tiles (or splits of them) the product leaves multiprocessors idle
# behind a long K loop: the mma.sync kernel's smaller tiles serve it.
MIN_BLOCKS = SMS // 2
MIN_SPLIT_STEPS = 8       # steps of K a split of a tile keeps at least
MAX_SPLITS = 8
# A tile's cost beside its steps of K, in steps: filling the ring and the epilogue (FIXED); a
# split tile's partials written, and then read back by the tile's last split (per split)
FIXED_STEPS = 4
PARTIAL_STEPS = 2
# glue's own tilings of a product raced against each other (`raced_tilings`): the cost model's
# choice and those it finds within RACE_MARGIN of it, RACED_TILINGS at most, for products of
# RACE_FLOPS or more. Each is a kernel more to compile; below RACE_FLOPS (a 4096 x 512 x 256
# product) a launch's fixed cost hides what a tiling changes.
RACED_TILINGS = 3
RACE_MARGIN = 1.25
# A raced tiling's split partials may take up to this many times the working memory of the
# model's choice (none where the choice does not split): a GPT-width weight gradient's 128 x 128
# tiles split in 2 and its 128 x 192 tiles split in 4 tie in the model, and the second needs
# twice the partials. The stream's scratch region is sized before the race, for every variant:
# unbounded, racing splits grew a GPT-2-width step's from 2 to 60 MiB.
RACE_PARTIALS_GROWTH = 2
RACE_FLOPS = 1 << 30
# Past this many operations and loads an element, the epilogue runs as a loop over the
# accumulators (parked in local memory) instead of once per register pair: a fused AdamW update
# (23) unrolled over a 256-wide tile's 64 pairs made 100 KB of PTX that took ptxas 2.5-3 s.
LOOPED_EPILOGUE = 16
# A TF32 product this large whose operands `wgmma` cannot read in place first writes them
# K-major (`tf32_copies`): below it, the copies cost about what the warpgroup kernel saves
# over mma.sync's, which reads them as they lie.
COPY_FLOPS = 1 << 32
_TYPES = {dt.bfloat16: "bf16", dt.float16: "f16", dt.float32: "tf32"}  # the wgmma's operand type
# float32 operands load as "tf32": the copy engine rounds them to TF32 on the way into shared
# memory (to nearest), where wgmma would drop their low mantissa bits (a bias toward zero).
_TMA_TYPES = {"bf16": "bf16", "f16": "f16", "tf32": "tf32"}
_ITEMSIZE = {"bf16": 2, "f16": 2, "tf32": 4}


def _stage_k(dtype: str) -> int:
    """K per stage for operands of `dtype`: a 128-byte swizzled row."""
    return hp.SWIZZLE_BYTES // _ITEMSIZE[dtype]


@dataclass(frozen=True)
class Side:
    """One operand as the kernel loads it: whether K is its contiguous dim, its tensor map,
    whether it moves with the batch, and its tile's outer size (BM or BN)."""

    k_major: bool
    tensor_map: hp.TensorMap
    batched: bool
    outer: int

    @property
    def boxes(self) -> int:
        """TMA loads per stage: a K-major tile is one box, an MN-major one a box per 64."""
        return 1 if self.k_major else self.outer // ATOM

    @property
    def nbytes(self) -> int:
        """A stage's tile: 128 bytes of K for each of its outer rows."""
        return self.outer * hp.SWIZZLE_BYTES


@dataclass(frozen=True)
class WgmmaPlan:
    """What the kernel computes and how: a (batches x) m x n x depth product of `dtype`
    operands, a 128 x `width` tile, `stages` stages, and the two operands' loads."""

    dtype: str
    width: int
    stages: int
    a: Side
    b: Side
    batches: int
    m: int
    n: int
    depth: int
    batch_dims: tuple[int, ...]
    m_dims: tuple[int, ...]
    n_dims: tuple[int, ...]
    splits: int = 1

    @property
    def bk(self) -> int:
        """K per stage: a 128-byte row of the operand type."""
        return _stage_k(self.dtype)

    @property
    def k_step(self) -> int:
        """K of one wgmma."""
        return STEP_BYTES // _ITEMSIZE[self.dtype]

    @property
    def tiles(self) -> int:
        return self.batches * -(-self.m // BM) * -(-self.n // self.width)

    @property
    def steps(self) -> int:
        """Steps of K a tile takes (all its splits together)."""
        return -(-self.depth // self.bk)

    @property
    def partial_bytes(self) -> int:
        """The working memory the splits' partials take (0 unsplit)."""
        return 0 if self.splits == 1 else self.splits * self.tiles * BM * self.width * 4

    @property
    def counter_bytes(self) -> int:
        """Two counters per tile and consumer warp (0 unsplit): `_Splits`."""
        return 0 if self.splits == 1 else 2 * self.tiles * CONSUMERS * WARPGROUP // WARP * 4

    @property
    def tensor_maps(self) -> tuple[hp.TensorMap, ...]:
        return self.a.tensor_map, self.b.tensor_map

    @property
    def stage_bytes(self) -> int:
        return self.a.nbytes + self.b.nbytes

    def __str__(self) -> str:
        layouts = "".join("k" if s.k_major else "o" for s in (self.a, self.b))
        split = f" split-k {self.splits}" if self.splits > 1 else ""
        return (f"wgmma {self.dtype} {BM}x{self.width}x{self.bk} tma {self.stages} stages staged {layouts} "
                f"warp-specialized {CONSUMERS}+1 warpgroups persistent{split}")


def tilings(batches: int, m: int, n: int, depth: int, bk: int, may_split: bool) -> list[tuple[int, int]]:
    """The (tile width, splits of K) the kernel may take, the cost model's fastest first: the
    rounds of work units (a tile, or a split of one) the persistent blocks take, times a unit's
    time: its steps of K and its fixed cost (`FIXED_STEPS`; a split one also its partials), each
    step costing the tile's width plus a quarter of its height (the A tile it loads whatever
    the width). On a tie the fewest splits, then the widest. (A GPT-width product of N = 768 is
    96 blocks 256 wide, 73% of the multiprocessors, or 128 blocks 192 wide, 97%; its weight
    gradient, 768 x 768 over 4096 tokens, is 36 tiles 128 wide split in three: 108 units of 21
    or 22 steps instead of 36 of 64.)

    K splits only where the tiles are fewer than the multiprocessors, `may_split` (the kernel
    has working memory for the partials), into splits of K's steps as even as they come (their
    steps differ by one at most: `_Span`), each MIN_SPLIT_STEPS or more."""
    return sorted(_choices(batches, m, n, depth, bk, may_split), key=lambda c: _cost(batches, m, n, depth, bk, c))


def _choices(batches: int, m: int, n: int, depth: int, bk: int, may_split: bool) -> list[tuple[int, int]]:
    steps = -(-depth // bk)
    choices = []
    for width in WIDTHS:
        tiles = batches * -(-m // BM) * -(-n // width)
        choices.append((width, 1))
        if may_split and tiles < SMS:
            choices += [(width, s) for s in range(2, MAX_SPLITS + 1)
                        if steps // s >= MIN_SPLIT_STEPS]
    return choices


def _cost(batches: int, m: int, n: int, depth: int, bk: int, choice: tuple[int, int]) -> tuple[int, int]:
    """The cost model's time for a tiling (rounds of units, times a unit's steps, times the
    columns a step loads), then its splits: the tie-break."""
    width, splits = choice
    steps = -(-depth // bk)
    units = batches * -(-m // BM) * -(-n // width) * splits
    per_unit = -(-steps // splits) + FIXED_STEPS + (PARTIAL_STEPS * (splits + 1) if splits > 1 else 0)
    return -(-units // SMS) * per_unit * (width + BM // 4), splits


def _side(view: View, param: int, is_a: bool, outer_size: int, depth: int, batches: int,
          outer_tile: int) -> Side | None:
    """How TMA loads an operand view (A: rows M, cols K; B: rows K, cols N), or None where it
    cannot: neither dim contiguous, a stride or start off 16 bytes (the buffers themselves
    start 256-byte aligned: the allocator's blocks, the arena's places), a float32 operand
    MN-major (`wgmma` transposes only 16-bit tiles)."""
    outer_stride, k_stride = (view.row_stride, view.col_stride) if is_a else (view.col_stride, view.row_stride)
    if k_stride == 1:
        k_major, stride = True, outer_stride
    elif outer_stride == 1:
        k_major, stride = False, k_stride
    else:
        return None
    name, size = _TYPES[view.dtype], view.dtype.itemsize
    if not k_major and size != 2:
        return None
    batched = batches > 1 and view.batch_stride != 0
    dims = (depth, outer_size) if k_major else (outer_size, depth)
    row_bytes = size * stride
    batch_bytes = size * view.batch_stride if batched else row_bytes * dims[1]
    offset = size * view.offset
    if any(x % 16 or x <= 0 for x in (row_bytes, batch_bytes)) or offset % 16:
        return None
    bk = _stage_k(name)
    box = (bk, outer_tile, 1) if k_major else (ATOM, bk, 1)
    tensor_map = hp.TensorMap(param, offset, _TMA_TYPES[name], (*dims, batches if batched else 1),
                              (row_bytes, batch_bytes), box)
    return Side(k_major, tensor_map, batched, outer_tile)


def _enabled(arch: str) -> bool:
    """Whether warpgroup kernels may run: on sm_90a, unless the settings ask for mma.sync (off,
    or a named mma.sync tile)."""
    return arch.endswith("a") and sm_number(arch) == 90 and config.cuda_tensor_cores and config.cuda_wgmma \
        and not config.cuda_mma_tile


def tf32_copies(spec: GemmSpec | None, arch: str) -> tuple[str, ...]:
    """The operands ("a", "b") of a float32 product on TF32, of at least COPY_FLOPS, that are
    first written K-major (`glue.scheduler.gemm.operand_kernel`, then `product_of_written`) so
    that the warpgroup kernel can read them: those computed or MN-major. () where none is, or
    where the product does not take this kernel."""
    if spec is None or not _enabled(arch) or spec.operand_dtype != dt.float32 or spec.accumulator != dt.float32 \
            or not spec.kernel.allows_tf32 or spec.flops < COPY_FLOPS:
        return ()
    k_major = {"a": "row", "b": "col"}  # the layout of a K-major view of each
    return tuple(side for side, view in (("a", spec.a), ("b", spec.b)) if view is None or view.layout != k_major[side])


def wgmma_plan(kernel: Kernel, places: tuple[Place, ...], inputs: tuple[Place, ...], arch: str,
               aligned: bool, may_split: bool = False, tiling: tuple[int, int] | None = None) -> WgmmaPlan | None:
    """The warpgroup kernel for a contraction, or None where it does not apply (not sm_90a,
    operand types or layouts TMA cannot load, a product too small). `may_split`: the kernel
    may have working memory (`partial_bytes`, `counter_bytes`) to split K over blocks.
    `tiling` (width, splits) replaces the cost model's (`raced_tilings`)."""
    if not (aligned and _enabled(arch)):
        return None
    spec = gemm_spec(kernel)
    if spec is None or spec.a is None or spec.b is None or spec.accumulator != dt.float32:
        return None
    if spec.a.dtype != spec.b.dtype or spec.a.dtype not in _TYPES:
        return None
    if spec.a.dtype == dt.float32 and not kernel.allows_tf32:  # full float32: no tensor cores
        return None
    batches, m, n, depth = spec.shape
    width, splits = tilings(batches, m, n, depth, _stage_k(_TYPES[spec.a.dtype]), may_split)[0]
    if batches * -(-m // BM) * -(-n // 128) * splits < MIN_BLOCKS:
        return None
    if tiling is not None:
        width, splits = tiling[0], tiling[1] if may_split else 1
    sides = [_side(view, places.index(inputs[view.buffer]), is_a, size, depth, batches, outer)
             for view, is_a, size, outer in ((spec.a, True, m, BM), (spec.b, False, n, width))]
    if None in sides:
        return None
    a, b = sides
    stages = min(MAX_STAGES, (SHARED_LIMIT - hp.SWIZZLE_ATOM - 256) // (a.nbytes + b.nbytes))
    return WgmmaPlan(_TYPES[spec.a.dtype], width, stages, a, b, batches, m, n, depth, spec.batch, spec.m, spec.n,
                     splits)


def raced_tilings(kernel: Kernel, places: tuple[Place, ...], inputs: tuple[Place, ...], arch: str,
                  aligned: bool) -> list[tuple[int, int]]:
    """The tilings of a warpgroup contraction that the executor races beside the cost model's
    (`config.autotune`): the next cheapest, those the model puts within RACE_MARGIN of its
    choice, RACED_TILINGS in all at most; none for a product under RACE_FLOPS or one the kernel
    does not take, and none whose split partials would take more than RACE_PARTIALS_GROWTH
    times the working memory of the model's choice."""
    plan = wgmma_plan(kernel, places, inputs, arch, aligned, may_split=True)
    if plan is None or 2 * plan.batches * plan.m * plan.n * plan.depth < RACE_FLOPS:
        return []
    shape = (plan.batches, plan.m, plan.n, plan.depth, plan.bk)
    ranked = tilings(*shape, may_split=True)[:RACED_TILINGS]
    best = _cost(*shape, ranked[0])[0]
    return [(width, splits) for width, splits in ranked[1:]
            if _cost(*shape, (width, splits))[0] <= RACE_MARGIN * best
            and replace(plan, width=width, splits=splits).partial_bytes <= RACE_PARTIALS_GROWTH * plan.partial_bytes]


def tiling_name(tiling: tuple[int, int]) -> str:
    width, splits = tiling
    return f"{BM}x{width}" + (f" split-k {splits}" if splits > 1 else "")


class _Ring:
    """The stages in dynamic shared memory (1 KiB aligned: the swizzle pattern spans 8 rows of
    128 bytes) and their two mbarriers each: `full` (the stage's loads landed) and `empty`
    (its multiplies are done)."""

    def __init__(self, ke: KernelEmitter, plan: WgmmaPlan):
        self.b, self.plan, self.stages = ke.b, plan, plan.stages
        self.ring = plan.stages * plan.stage_bytes
        base = ke.dynamic_shared(self.ring + hp.SWIZZLE_ATOM + 16 * plan.stages)
        raw = hp.shared_u32(self.b, base)
        self.tiles = self.b.and_(self.b.add(raw, self._c(hp.SWIZZLE_ATOM - 1)), self._c(-hp.SWIZZLE_ATOM))

    @staticmethod
    def _c(v: int) -> ir.Value:
        return ir.Constant(I32, v)

    def _at(self, offset: int, s: ir.Value, size: int) -> ir.Value:
        return self.b.add(self.tiles, self.b.add(self._c(offset), self.b.mul(s, self._c(size))))

    def full(self, s: ir.Value) -> ir.Value:
        return self._at(self.ring, s, 8)

    def empty(self, s: ir.Value) -> ir.Value:
        return self._at(self.ring + 8 * self.stages, s, 8)

    def a_tile(self, s: ir.Value) -> ir.Value:
        return self._at(0, s, self.plan.stage_bytes)

    def b_tile(self, s: ir.Value) -> ir.Value:
        return self._at(self.plan.a.nbytes, s, self.plan.stage_bytes)

    def position(self, step: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(stage, phase parity) of the block's `step`-th step of K, counted over all its tiles."""
        s32 = self.b.trunc(step, I32)
        return self.b.urem(s32, self._c(self.stages)), self.b.and_(self.b.udiv(s32, self._c(self.stages)), self._c(1))


def emit_wgmma(ke: KernelEmitter, plan: WgmmaPlan) -> tuple[int, int, str]:
    """Emit the kernel `plan` describes into `ke` (whose tensor-map parameters it reads; its
    working memory `ke.extra_ptrs`, partials and counters, where K splits).

    The kernel is persistent: a block per multiprocessor (at most one per unit of work: a tile,
    or one split of a tile's K) takes units `block, block + grid, ...`, so that the producer
    streams the next unit's stages in while the consumers run this one's epilogue, and no block
    pays for filling the ring twice."""
    b = ke.b
    c32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    tiles_m, tiles_n = -(-plan.m // BM), -(-plan.n // plan.width)
    total = plan.tiles * plan.splits
    grid = min(total, SMS)
    ring = _Ring(ke, plan)
    parked = b.alloca(ir.ArrayType(F32, plan.width // 2)) if _epilogue_size(ke.kernel) > LOOPED_EPILOGUE else None

    tid = b.trunc(ke.thread_index(), I32)
    warpgroup = b.udiv(tid, c32(WARPGROUP))
    block = ke.block_index()
    mine = b.udiv(b.add(b.sub(c64(total), block), c64(grid - 1)), c64(grid))

    def unit(b: ir.IRBuilder, i: ir.Value) -> tuple[ir.Value, ...]:
        """(batch, first row, first column, tile, split) of this block's `i`-th unit: splits
        of K are the slowest-moving, so that the first wave holds every tile."""
        at = b.add(block, b.mul(i, c64(grid)))
        split, tile = b.udiv(at, c64(plan.tiles)), b.urem(at, c64(plan.tiles))
        batch, tile_m, tile_n = _tile_of(b, tile, plan.batches, tiles_m, tiles_n)
        return batch, b.mul(tile_m, c64(BM)), b.mul(tile_n, c64(plan.width)), tile, split

    def init_barriers() -> None:
        for tensor_map in ke.map_args:  # (the first loads then find them in the descriptor cache)
            hp.prefetch_tensor_map(b, tensor_map)
        for s in range(plan.stages):
            hp.mbarrier_init(b, ring.full(c32(s)), 1)
            hp.mbarrier_init(b, ring.empty(c32(s)), CONSUMERS * WARPGROUP // WARP)  # one arrival per consumer warp

    # Each loop over the block's units carries `before`: the steps of K it took on earlier ones,
    # which place every step in the ring (splits of one tile may differ by a step).
    def produce() -> None:
        def step(b: ir.IRBuilder, i: ir.Value, carried: list) -> list:
            before, = carried
            batch, m0, n0, _tile, split = unit(b, i)
            span = _Span(b, plan, split)
            _produce(ke, plan, ring, before, span, batch, m0, n0)
            return [b.add(before, span.steps)]
        loop(b, 0, mine, step, [c64(0)], name="tiles", vectorize=False, unroll=1)

    def consume(_: ir.Value) -> None:
        def step(b: ir.IRBuilder, i: ir.Value, carried: list) -> list:
            before, = carried
            batch, m0, n0, tile, split = unit(b, i)
            span = _Span(b, plan, split)
            accs = _consume(ke, plan, ring, before, span.steps, tid, warpgroup)
            if plan.splits == 1:
                _epilogue(ke, plan, accs, tid, warpgroup, batch, m0, n0, parked)
            else:
                splits = _Splits(ke, plan, tid, tile, split, accs)
                with b.if_then(splits.finishes()):
                    _epilogue(ke, plan, splits.sums(), tid, warpgroup, batch, m0, n0, parked)
            return [b.add(before, span.steps)]
        loop(b, 0, mine, step, [c64(0)], name="tiles", vectorize=False, unroll=1)

    hp.warp_specialized(ke, init_barriers, produce, consume)
    b.ret_void()
    return grid, (CONSUMERS + 1) * WARPGROUP, str(plan)


class _Span:
    """The steps of K of one split of a tile: split s of S takes steps [s T / S, (s + 1) T / S)
    of the tile's T, so that the splits differ by a step at most (constants where K does not
    split)."""

    def __init__(self, b: ir.IRBuilder, plan: WgmmaPlan, split: ir.Value):
        if plan.splits == 1:
            self.first, self.steps = ir.Constant(I64, 0), ir.Constant(I64, plan.steps)
            return
        first, after = (b.udiv(b.mul(at, ir.Constant(I64, plan.steps)), ir.Constant(I64, plan.splits))
                        for at in (split, b.add(split, ir.Constant(I64, 1))))
        self.first, self.steps = first, b.sub(after, first)


class _Splits:
    """A split of K's partials and counters (`ke.extra_ptrs`), a consumer warp at a time (its
    epilogue's stores trade registers across its lanes, so a warp decides as one). As a warp's
    mainloop on a unit ends, its lane 0 counts it in on `arrived` (a counter per tile and
    consumer warp) and tells the warp the count. The warp that arrives last finishes the tile;
    any other writes its accumulators to its split's partials, and lane 0 counts it in on
    `written` (a warp barrier, then a fence, releasing every lane's writes). The finisher writes
    nothing: lane 0 waits until `written` counts every other split (each has arrived, so is
    already writing: a short wait, and never on a block that has not started), acquiring their
    partials, and sets both counters back to zero for the next call; then the warp adds every
    split's sums in split order, its own from its registers, so the sum does not depend on
    which split finished last.

    Partial r of consumer thread t of a unit lies at ((split * tiles + tile) * R + r) * 256 + t
    (R accumulators a thread): a warp's 32 stores of one register are one 128-byte line."""

    THREADS = CONSUMERS * WARPGROUP
    WARPS = THREADS // WARP

    def __init__(self, ke: KernelEmitter, plan: WgmmaPlan, tid: ir.Value, tile: ir.Value, split: ir.Value,
                 accs: list[ir.Value]):
        self.ke, self.b, self.plan, self.tile, self.split, self.accs = ke, ke.b, plan, tile, split, accs
        b, c = self.b, self._c
        self.thread = b.zext(b.sub(tid, ir.Constant(I32, WARPGROUP)), I64)
        self.lane0 = b.icmp_unsigned("==", b.urem(self.thread, c(WARP)), c(0))
        at = b.add(b.mul(tile, c(self.WARPS)), b.udiv(self.thread, c(WARP)))
        self.arrived = b.gep(ke.extra_ptrs[1], [at], inbounds=True, source_etype=I32)
        self.written = b.gep(ke.extra_ptrs[1], [b.add(at, c(plan.tiles * self.WARPS))], inbounds=True,
                             source_etype=I32)

    @staticmethod
    def _c(v: int) -> ir.Value:
        return ir.Constant(I64, v)

    def _partial(self, split: ir.Value, r: int) -> ir.Value:
        b, c = self.b, self._c
        unit = b.add(b.mul(split, c(self.plan.tiles)), self.tile)
        slot = b.add(b.mul(b.add(b.mul(unit, c(len(self.accs))), c(r)), c(self.THREADS)), self.thread)
        return b.gep(self.ke.extra_ptrs[0], [slot], inbounds=True, source_etype=F32)

    def finishes(self) -> ir.Value:
        """Count the warp in; unless it arrived last, write its partials and count it in as
        written. Whether it finishes the tile (the same in every lane)."""
        b = self.b
        before = b.block
        with b.if_then(self.lane0):
            counted = b.atomic_rmw("add", self.arrived, ir.Constant(I32, 1), "monotonic")
            counted_in = b.block
        arrived = b.phi(I32)
        arrived.add_incoming(counted, counted_in)
        arrived.add_incoming(ir.Constant(I32, 0), before)
        last = b.icmp_unsigned("==", self.ke.lane0_value(arrived), ir.Constant(I32, self.plan.splits - 1))
        with b.if_then(b.not_(last)):
            for r, acc in enumerate(self.accs):
                b.store(acc, self._partial(self.split, r))
            self.ke.warp_sync()
            with b.if_then(self.lane0):
                self.ke.fence_gpu()
                b.atomic_rmw("add", self.written, ir.Constant(I32, 1), "monotonic")
        return last

    def sums(self) -> list[ir.Value]:
        """In the finishing warp: every split's sums added in split order."""
        b = self.b
        with b.if_then(self.lane0):
            hp.wait_for_count(b, self.written, self.plan.splits - 1)
            b.store(ir.Constant(I32, 0), self.arrived)
            b.store(ir.Constant(I32, 0), self.written)
        self.ke.warp_sync()  # (the other lanes read the partials after lane 0 acquired them)
        mine = [b.icmp_unsigned("==", self.split, self._c(s)) for s in range(self.plan.splits)]
        totals = []
        for r, acc in enumerate(self.accs):  # (register by register: each accumulator dies once added)
            terms = [hp.load_unless(b, self._partial(self._c(s), r), mine[s], acc) for s in range(self.plan.splits)]
            total = terms[0]
            for term in terms[1:]:
                total = b.fadd(total, term)
            totals.append(total)
        return totals


def _tile_of(b: ir.IRBuilder, block: ir.Value, batches: int, tiles_m: int, tiles_n: int
             ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(batch, tile row, tile column) of a tile index: bands of GROUP_M tile rows, each walked
    down its rows before moving a column right, so that the tiles in flight at once share A's
    and B's tiles in L2."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    per_batch = tiles_m * tiles_n
    batch, pid = b.udiv(block, c(per_batch)), b.urem(block, c(per_batch))
    band_blocks = GROUP_M * tiles_n
    first = b.mul(b.udiv(pid, c(band_blocks)), c(GROUP_M))
    rows = b.sub(c(tiles_m), first)
    rows = b.select(b.icmp_unsigned("<", rows, c(GROUP_M)), rows, c(GROUP_M))
    within = b.urem(pid, c(band_blocks))
    return batch, b.add(first, b.urem(within, rows)), b.udiv(within, rows)


def _coords(b: ir.IRBuilder, side: Side, outer: ir.Value, k0: ir.Value, batch: ir.Value) -> list[list[ir.Value]]:
    """The TMA coordinates (innermost first, i32) of each box of an operand's stage."""
    batch = b.trunc(batch, I32) if side.batched else ir.Constant(I32, 0)
    found = []
    for box in range(side.boxes):
        o = b.trunc(b.add(outer, ir.Constant(I64, box * ATOM)), I32)
        k = b.trunc(k0, I32)
        found.append([k, o, batch] if side.k_major else [o, k, batch])
    return found


def _produce(ke: KernelEmitter, plan: WgmmaPlan, ring: _Ring, before: ir.Value, span: _Span, batch, m0, n0
             ) -> None:
    """The producer thread on one unit (`before`: the block's steps on earlier units; `span`:
    the unit's steps of K): for each of its steps, wait for its stage to be free, then load A's
    and B's tiles into it."""
    b = ke.b

    def step(b: ir.IRBuilder, t: ir.Value, _: list) -> list:
        g = b.add(before, t)
        s, parity = ring.position(g)
        with b.if_then(b.icmp_unsigned(">=", g, ir.Constant(I64, plan.stages))):
            hp.wait_parity(b, ring.empty(s), b.xor(parity, ir.Constant(I32, 1)))  # the stage's previous use
        hp.arrive_expect_bytes(b, ring.full(s), plan.stage_bytes)
        k0 = b.mul(b.add(span.first, t), ir.Constant(I64, plan.bk))
        for side, outer, tile, map_arg in ((plan.a, m0, ring.a_tile(s), ke.map_args[0]),
                                           (plan.b, n0, ring.b_tile(s), ke.map_args[1])):
            for box, coords in enumerate(_coords(b, side, outer, k0, batch)):
                hp.tma_load(b, b.add(tile, ir.Constant(I32, box * BOX_BYTES)), map_arg, coords, ring.full(s))
        return []

    loop(b, 0, span.steps, step, [], name="produce", vectorize=False, unroll=1)


def _descriptor(b: ir.IRBuilder, side: Side, tile: ir.Value, j: int, k_step: int) -> ir.Value:
    """The matrix descriptor of the `j`-th wgmma's K (`k_step` of it) in an operand's stage at
    shared address `tile`."""
    if side.k_major:
        return hp.matrix_descriptor(b, b.add(tile, ir.Constant(I32, STEP_BYTES * j)), 16, 8 * hp.SWIZZLE_BYTES)
    return hp.matrix_descriptor(b, b.add(tile, ir.Constant(I32, k_step * hp.SWIZZLE_BYTES * j)), BOX_BYTES,
                                8 * hp.SWIZZLE_BYTES)


def _consume(ke: KernelEmitter, plan: WgmmaPlan, ring: _Ring, before: ir.Value, steps: ir.Value, tid, warpgroup
             ) -> list[ir.Value]:
    """A consumer warpgroup's mainloop on one unit (`before`: the block's steps on earlier
    units): its 64 x BN accumulators after the unit's `steps` steps of K, every stage freed."""
    b = ke.b
    c32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    rows = b.mul(b.sub(warpgroup, c32(1)), c32(64 * hp.SWIZZLE_BYTES))  # its 64 rows of A: 8 KiB on
    first_lane = b.icmp_unsigned("==", b.urem(tid, c32(WARP)), c32(0))
    shape, types = f"m64n{plan.width}k{plan.k_step}", f"f32.{plan.dtype}.{plan.dtype}"
    # (TF32's wgmma has no transpose flags: both its operands are K-major)
    transpose = None if plan.dtype == "tf32" else (int(not plan.a.k_major), int(not plan.b.k_major))

    def free(g: ir.Value) -> None:
        with b.if_then(first_lane):
            hp.arrive(b, ring.empty(ring.position(g)[0]))

    def step(b: ir.IRBuilder, t: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        g = b.add(before, t)
        s, parity = ring.position(g)
        hp.wait_parity(b, ring.full(s), parity)
        hp.wgmma_fence(b)
        a0, b0 = b.add(ring.a_tile(s), rows), ring.b_tile(s)
        for j in range(plan.bk // plan.k_step):
            accs = hp.wgmma(b, shape, types, _descriptor(b, plan.a, a0, j, plan.k_step),
                            _descriptor(b, plan.b, b0, j, plan.k_step), accs, transpose)
        hp.wgmma_commit(b)
        hp.wgmma_wait(b, 1)  # the previous step's multiplies are done: its stage is free
        with b.if_then(b.icmp_unsigned(">", t, ir.Constant(I64, 0))):
            free(b.sub(g, ir.Constant(I64, 1)))
        return accs

    zero = ir.Constant(F32, 0.0)
    accs = loop(b, 0, steps, step, [zero] * (plan.width // 2), name="kstep", vectorize=False, unroll=1)
    hp.wgmma_wait(b, 0)
    free(b.sub(b.add(before, steps), ir.Constant(I64, 1)))  # the last stage: the producer is on the next tile
    return accs


def _epilogue_size(kernel: Kernel) -> int:
    """The operations and loads the kernel's stores compute an element from."""
    return sum(isinstance(e, (Op, Load)) for e in subexpressions([s.value for s in kernel.stores]))


def _epilogue(ke: KernelEmitter, plan: WgmmaPlan, accs: list[ir.Value], tid, warpgroup, batch, m0, n0,
              parked: ir.Value | None) -> None:
    """The kernel's stores at each accumulator: register 4j + r of a thread holds row
    16 w + lane / 4 (+ 8 for r >= 2) of its warpgroup's 64, column 8 j + 2 (lane % 4) + r % 2
    (mma.sync's m16n8 fragment, once per 8 columns). Unrolled over the registers, or, where
    `parked` (a local array of them) is given, a loop over j reading them back from it."""
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    coordinates = Coordinates(ke, list(plan.m_dims), list(plan.n_dims), list(plan.batch_dims), batch)
    stores = AccumulatorStores(ke, coordinates, plan.m, plan.n)
    local = b.zext(b.urem(tid, ir.Constant(I32, WARPGROUP)), I64)
    warp, lane = b.udiv(local, c(WARP)), b.urem(local, c(WARP))
    row0 = b.add(m0, b.add(b.mul(b.zext(b.sub(warpgroup, ir.Constant(I32, 1)), I64), c(64)),
                           b.add(b.mul(warp, c(16)), b.udiv(lane, c(4)))))
    col0 = b.add(n0, b.mul(b.urem(lane, c(4)), c(2)))

    def pairs_at(b: ir.IRBuilder, j: ir.Value, registers: Callable[[int], list[ir.Value]]) -> None:
        for half in range(2):
            stores.store_pair(b.add(row0, c(8 * half)), b.add(col0, b.mul(j, c(8))), registers(half))

    if parked is None:
        inside = b.and_(b.icmp_unsigned("<=", b.add(m0, c(BM)), c(plan.m)),
                        b.icmp_unsigned("<=", b.add(n0, c(plan.width)), c(plan.n)))
        stores.store_tile(inside, b.trunc(b.urem(lane, c(QUAD)), I32), [row0, b.add(row0, c(8))],
                          [b.add(col0, c(8 * j)) for j in range(plan.width // 8)],
                          lambda half, j: accs[4 * j + 2 * half:4 * j + 2 * half + 2])
        return
    for r, acc in enumerate(accs):
        b.store(acc, b.gep(parked, [c(0), c(r)], inbounds=True))

    def body(b: ir.IRBuilder, j: ir.Value, _: list) -> list:
        def read_back(half: int) -> list[ir.Value]:
            at = b.add(b.mul(j, c(4)), c(2 * half))
            return [b.load(b.gep(parked, [c(0), b.add(at, c(r))], inbounds=True)) for r in range(2)]
        pairs_at(b, j, read_back)
        return []
    loop(b, 0, plan.width // 8, body, [], name="epilogue", vectorize=False, unroll=1)


__all__ = ["COPY_FLOPS", "WgmmaPlan", "emit_wgmma", "raced_tilings", "tf32_copies", "tiling_name", "tilings",
           "wgmma_plan"]
