"""Contractions on tensor cores: warp-level `mma.sync` (sm_80 on).

Applies where both operands of the kernel's float32-accumulated product are bfloat16 (or both
float16) values widened to float32 (the products are exact and the sums stay in float32, so the
result is the reference's up to the order of the additions), or float32 operands at a precision
other than "highest", which round to TF32 as on jax.jit's GPU backend (`Format`).

A block of `warps_m x warps_n` warps computes a BM x BN tile of one batch; each warp a
(BM / warps_m) x (BN / warps_n) piece as m16n8 fragments. Every step over K stages a BM x BK
tile of A and a BN x BK tile of B in shared memory: each thread evaluates the operand
expressions (loads, casts, any fused prologue) at the 16 bytes' worth of consecutive points of
a chunk and stores them as one vector. The staged layout follows the operand's memory: K fastest
when its loads advance with K (a row-major lhs), else M (or N) fastest, so that a warp's loads
are consecutive either way; `ldmatrix` (`.trans` for the second layout) then gives each lane its
16-bit fragments, and its TF32 fragments where K is fastest (others load word by word). So that
the rows a fragment load reads fall in distinct banks, the chunks ldmatrix reads move within
their 128-byte lines (`_Staged.place`), which keeps a copy's lines whole; rows loaded word by
word are padded by 16 bytes.

Where both operands are plain loads whose chunks are 16 aligned bytes (the usual case:
activations and weights), `cp.async` copies them straight from global into shared memory, with
no register on the way, through STAGES stages: while the warps multiply out one step, the copies
of the next STAGES - 1 are in flight, and a step costs one barrier. Any other operand (a fused
prologue: a cast, a scale) is evaluated into registers into two alternating stages, the next
step's loads issued before this step's multiplies and stored after them. Both live in dynamic
shared memory (more than the 48 KiB a static array may hold). Out-of-range points (M, N or K
not a multiple of the tile) stage as zero. The epilogue runs the kernel's stores (bias,
activation, cast, residual, an optimizer update) on each accumulator where it lies. Products
too small to fill the GPU, and kernels whose operands may be unaligned (a call kernel's body),
stay on the CUDA-core kernel (contraction.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from glue.backend_cuda.codegen.common import (PTR3, WARP, AccumulatorStores, Coordinates, KernelEmitter, LaneGroup,
                                              Vectorization, flat_index, moves_with)
from glue.backend_cuda.codegen.fastmath import pack_bf16x2
from glue.codegen.loops import loop, unflatten
from glue.codegen.types import F16, F32, I16, I32, I64, memory_type
from glue.errors import GlueError
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Expr, Kernel, Load, Op, loads_under
from glue.settings import config

CHUNK_BYTES = 16  # what a thread stages at once: one 16-byte shared store (or cp.async)
MIN_BLOCKS = 132  # about one block per multiprocessor of an H100/H200
STAGES = 4  # shared-memory stages of the cp.async pipeline: three steps of K in flight ...
BLOCK_SHARED = 112 * 1024  # ... or fewer, where that many would keep two blocks off a multiprocessor
# Below this many of the smallest tile, a product (an MLP step's 32 x 256 x 256) leaves most
# multiprocessors idle behind a long K loop: on the H200 a 4-layer MLP step took 43 us per step
# on tensor cores against 21 us on the CUDA-core kernel, whose tiles shrink to 8 x 8 for it.
MIN_MMA_BLOCKS = 32


@dataclass(frozen=True)
class MmaTile:
    """A block's tile (BM x BN, K steps of BK) and its warps' arrangement."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP

    @property
    def frags_m(self) -> int:
        return self.bm // self.warps_m // 16

    @property
    def frags_n(self) -> int:
        return self.bn // self.warps_n // 8

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/{self.warps_m}x{self.warps_n}"


# Largest first: a product too small to give the large tile a block per multiprocessor takes
# the first tile that does (or the smallest).
# The large tile's 64 x 64 warp tiles read 8 fragments from shared memory per 32 mma (a 64 x 32
# warp tile reads 6 per 16): on the H200, 4096^3 bf16 ran at 303 TFLOP/s with it against 241 with
# 8 warps of 64 x 32, and the GPT-layer products 18-42% faster (benchmarks/RESULTS.md).
TILES = (MmaTile(128, 128, 32, 2, 2), MmaTile(128, 64, 32, 2, 2), MmaTile(64, 64, 32, 2, 2))
# Every tile the emitter can make (`config.cuda_mma_tile` may name one).
KNOWN_TILES = {str(t): t for t in TILES + (MmaTile(128, 128, 32, 2, 4), MmaTile(128, 256, 32, 2, 4),
                                            MmaTile(256, 128, 32, 4, 2), MmaTile(128, 128, 64, 2, 2))}


@dataclass(frozen=True)
class Format:
    """How operands reach the tensor cores: their staged width, the mma shape's depth and the
    intrinsic (bf16 and f16: m16n8k16 on 16-bit pairs; tf32: m16n8k8 on float32 words rounded
    to TF32's 10 mantissa bits when their fragments load)."""

    name: str
    element: ir.Type     # a staged element
    depth: int           # the mma's K
    intrinsic: str
    operand: ir.Type     # an A or B register of the intrinsic

    @property
    def chunk(self) -> int:
        """Elements a thread stages at once (16 bytes), and the padding of a staged row."""
        return CHUNK_BYTES // (self.element.width // 8)


FORMATS = {
    "bf16": Format("bf16", I16, 16, "llvm.nvvm.mma.m16n8k16.row.col.bf16", I32),
    "f16": Format("f16", I16, 16, "llvm.nvvm.mma.m16n8k16.row.col.f32.f32", ir.VectorType(F16, 2)),
    "tf32": Format("tf32", I32, 8, "llvm.nvvm.mma.m16n8k8.row.col.tf32", I32),
}


def operand_format(k: Kernel, a_expr: Expr, b_expr: Expr) -> Format | None:
    """The tensor-core format of a float32-accumulated product: both operands widened from the
    same 16-bit type, or float32 operands where the precision lets them round to TF32 (as
    jax.jit on the GPU: every precision but "highest"); None otherwise."""
    if k.reductions[0].dtype != dt.float32:
        return None
    a16, b16 = sixteen_bit_operand(a_expr), sixteen_bit_operand(b_expr)
    if a16 is not None and a16 == b16:
        return FORMATS["bf16" if a16 == dt.bfloat16 else "f16"]
    if a_expr.dtype == b_expr.dtype == dt.float32 and k.allows_tf32:
        return FORMATS["tf32"]
    return None


def sixteen_bit_operand(expr: Expr) -> dt.DType | None:
    """The 16-bit float type `expr` widens to float32 from, or None."""
    if isinstance(expr, Op) and expr.primitive == "convert_element_type" and expr.dtype == dt.float32:
        inner = expr.args[0].dtype
        if inner in (dt.bfloat16, dt.float16):
            return inner
    return None


@dataclass
class _Staged:
    """One operand's staged tile: the value staged, its extent (M or N), the tile's outer size
    (BM or BN), whether K is the fastest dim in shared memory, the elements of a chunk and,
    where a chunk is that many consecutive points of one domain dim, how that dim vectorises
    its loads."""

    value: Expr  # what is staged: the 16-bit value a widening cast reads, or the float32 operand
    size: int
    outer: int
    k_fastest: bool
    is_a: bool
    chunk: int
    # Fragments load by ldmatrix, one address a matrix: 16-bit ones, and TF32 ones where K is
    # fastest (a matrix of 8 rows of 4 words is the m16n8k8 fragment's layout). Its chunks then
    # move within their lines (`place`). The TF32 fragments of an M- or N-fastest operand load
    # word by word, and XORed addresses for each word outgrew a thread's registers (ptxas
    # spilled 692 bytes): their rows are padded instead.
    ldmatrix: bool
    lanes: Vectorization | None = None

    def row(self, bk: int) -> int:
        """Elements from one staged row to the next: padded by a chunk where chunks do not move
        (the 32 lanes' TF32 fragment words then fall in distinct banks)."""
        return (bk if self.k_fastest else self.outer) + (0 if self.ldmatrix else self.chunk)

    def place(self, b: ir.IRBuilder, slot: ir.Value, bk: int) -> ir.Value:
        """Where the staged element at `slot` of a stage lies. Swizzled: its 16-byte chunk moves
        within its 128-byte line by XOR with the row's index mod 8 (the line's, for rows of 64
        bytes, two a line), as TMA's 128-byte swizzle does for 128-byte rows. The eight rows an
        ldmatrix reads at one column then lie in eight distinct chunk positions, so in distinct
        banks, and the chunks a cp.async copies from one global line stay in one shared line:
        padded rows split nearly every line across two, and the copies took 11-15 shared
        wavefronts per warp instead of 4 (ncu, 4096^3 bf16 on an H100)."""
        if not self.ldmatrix:
            return slot
        row = b.udiv(slot, ir.Constant(I64, max(self.row(bk), 8 * self.chunk)))
        return b.xor(slot, b.mul(b.and_(row, ir.Constant(I64, 7)), ir.Constant(I64, self.chunk)))

    def elements(self, bk: int) -> int:
        return (self.outer if self.k_fastest else bk) * self.row(bk)


def _k_fastest(ke: KernelEmitter, expr: Expr, outer_dims: list[int]) -> bool:
    """Whether the operand's loads advance with the innermost contracting dim (else with the
    innermost of its own free dims, or neither: K fastest then too)."""
    k = ke.kernel
    loads = loads_under([expr])
    flats = [flat_index(ld.index, ke.shapes[ld.input]) for ld in loads]
    if any(moves_with(f, k.rank - 1, ke.analysis) for f in flats):
        return True
    return not (outer_dims and any(moves_with(f, outer_dims[-1], ke.analysis) for f in flats))


def _lanes(ke: KernelEmitter, k_fastest: bool, outer_dims: list[int], chunk: int) -> Vectorization | None:
    """How the chunks of an operand load 16 bytes at once: where the staged fastest dim is a
    domain dim whose extent is a multiple of the chunk (so a chunk never straddles two of its
    rows, and lies wholly inside or outside the product), a lane per element along it; else
    None (point by point)."""
    k = ke.kernel
    v = k.rank - 1 if k_fastest else (outer_dims[-1] if outer_dims else None)
    extent = k.reduce[-1] if k_fastest else (k.parallel[v] if v is not None else 0)
    if v is None or extent % chunk:
        return None
    lanes = Vectorization(k, ke.analysis, v, extent)
    return lanes if lanes.width == chunk else None


def _staged_bits(b: ir.IRBuilder, value: ir.Value, expr: Expr, fmt: Format) -> ir.Value:
    """A float32 register holding a value of `expr` as the bits staged for `fmt`: float32's
    own (rounded to TF32 as fragments load); a 16-bit type's, where a loaded value is exact (its
    low bits are zero) and anything computed rounds to nearest even."""
    if fmt.name == "tf32":
        return b.bitcast(value, I32)
    if fmt.name == "f16":
        return b.bitcast(b.fptrunc(value, F16), I16)
    if isinstance(expr, Load):
        return b.trunc(b.lshr(b.bitcast(value, I32), ir.Constant(I32, 16)), I16)
    return b.trunc(pack_bf16x2(b, value, value), I16)  # mma.sync's sm_80 has the one-instruction rounding


def _copyable(s: _Staged) -> bool:
    """Whether the operand is one load whose chunks are 16 aligned consecutive bytes."""
    load = s.value
    return isinstance(load, Load) and not load.mask and s.lanes is not None and load in s.lanes.loads


def cp_async(ke: KernelEmitter, target: ir.Value, source: ir.Value, nbytes: ir.Value, size: int = 16) -> None:
    """Copy `size` bytes (16, or 4 or 8) from global to shared memory without a register (zeros
    past `nbytes`); both addresses aligned to `size`. 16 bytes bypass L1 (`.cg`); the smaller
    sizes have only the form that goes through it (`.ca`)."""
    name = f"llvm.nvvm.cp.async.{'cg' if size == 16 else 'ca'}.shared.global.{size}.s"
    fn = ke.module.globals.get(name) or ir.Function(
        ke.module, ir.FunctionType(ir.VoidType(), [PTR3, ir.PointerType(addrspace=1), I32]), name)
    ke.b.call(fn, [target, source, nbytes])


def to_tf32(ke: KernelEmitter, value: ir.Value) -> ir.Value:
    """A float32 rounded to TF32 (to nearest, ties away), as the 32-bit word an mma takes."""
    name = "llvm.nvvm.f2tf32.rna"
    fn = ke.module.globals.get(name) or ir.Function(ke.module, ir.FunctionType(I32, [F32]), name)
    return ke.b.call(fn, [value])


def async_call(ke: KernelEmitter, name: str, *immediate: int) -> None:
    """cp.async.commit_group, or cp.async.wait_group N."""
    fn = ke.module.globals.get(name) or ir.Function(ke.module, ir.FunctionType(ir.VoidType(), [I32] * len(immediate)),
                                                    name)
    ke.b.call(fn, [ir.Constant(I32, n) for n in immediate])


def ldmatrix_x4(ke: KernelEmitter, address: ir.Value, trans: bool) -> list[ir.Value]:
    """Four 8 x 8 matrices of 16-bit elements from shared memory, each lane's address naming one
    row (lanes 8j..8j+7: matrix j), as the four 32-bit fragment registers of this lane;
    `.trans` gives each matrix transposed."""
    name = f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.b16.p3"
    fn = ke.module.globals.get(name) or ir.Function(ke.module, ir.FunctionType(ir.LiteralStructType([I32] * 4), [PTR3]),
                                                    name)
    got = ke.b.call(fn, [address])
    return [ke.b.extract_value(got, i) for i in range(4)]


def mma_sync(ke: KernelEmitter, fmt: Format, a_regs: list[ir.Value], b_regs: list[ir.Value],
             acc: list[ir.Value]) -> list[ir.Value]:
    """One warp-wide `mma.sync` of `fmt`: the four A and two B fragment registers (32-bit words)
    added into the four float32 accumulators."""
    b = ke.b
    fn = ke.module.globals.get(fmt.intrinsic) or ir.Function(
        ke.module, ir.FunctionType(ir.LiteralStructType([F32] * 4), [fmt.operand] * 6 + [F32] * 4), fmt.intrinsic)
    regs = [r if fmt.operand == I32 else b.bitcast(r, fmt.operand) for r in a_regs + b_regs]
    got = b.call(fn, regs + acc)
    return [b.extract_value(got, i) for i in range(4)]


def _tile(batches: int, m_size: int, n_size: int) -> MmaTile | None:
    """The tile `config.cuda_mma_tile` names (whatever the product's size), else the largest
    that gives about a block per multiprocessor, else the smallest; None for a product of fewer
    than MIN_MMA_BLOCKS smallest tiles (the CUDA-core kernel shrinks its tiles for these)."""
    chosen = config.cuda_mma_tile
    if chosen:
        if chosen not in KNOWN_TILES:
            raise GlueError(f"cuda_mma_tile={chosen!r}: the tensor-core emitter knows {sorted(KNOWN_TILES)}")
        return KNOWN_TILES[chosen]
    blocks = [batches * -(-m_size // t.bm) * -(-n_size // t.bn) for t in TILES]
    if blocks[-1] < MIN_MMA_BLOCKS:
        return None
    return next((t for t, n in zip(TILES, blocks) if n >= MIN_BLOCKS), TILES[-1])


def emit_mma(ke: KernelEmitter, a_expr: Expr, b_expr: Expr, m_dims: list[int], n_dims: list[int],
             batch_dims: list[int]) -> tuple[int, int, str] | None:
    """Emit the tensor-core kernel; None where it does not apply (operand types, target)."""
    k = ke.kernel
    fmt = operand_format(k, a_expr, b_expr)
    if ke.sm < 80 or fmt is None or not k.reduce or not ke.aligned:  # (no contracting dim: an outer product)
        return None
    chunk, element = fmt.chunk, fmt.element
    extent = lambda dims: math.prod(k.parallel[d] for d in dims)  # noqa: E731
    m_size, n_size, batches, depth = extent(m_dims), extent(n_dims), extent(batch_dims), math.prod(k.reduce)
    tile = _tile(batches, m_size, n_size)
    if tile is None:
        return None
    b = ke.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    tiles_m, tiles_n = -(-m_size // tile.bm), -(-n_size // tile.bn)
    steps = -(-depth // tile.bk)
    staged = []
    for expr, size, outer, dims, is_a in ((a_expr, m_size, tile.bm, m_dims, True), (b_expr, n_size, tile.bn, n_dims, False)):
        k_fastest = _k_fastest(ke, expr, dims)
        value = expr.args[0] if element == I16 else expr
        staged.append(_Staged(value, size, outer, k_fastest, is_a, chunk, fmt.name != "tf32" or k_fastest,
                              _lanes(ke, k_fastest, dims, chunk)))
    a, bb = staged
    # Operands that are plain loads, 16 bytes a chunk, are copied straight into shared memory
    # (cp.async) through up to STAGES stages; others stage through registers into two.
    pipelined = all(_copyable(s) for s in (a, bb))
    if fmt.name == "tf32" and not pipelined and ke.sm < 90:
        return None  # ptxas for sm_80 spills the register-staged TF32 kernel (12 bytes at 40 registers)
    stage_bytes = element.width // 8 * sum(s.elements(tile.bk) for s in (a, bb))
    stages = max(min(STAGES, BLOCK_SHARED // stage_bytes), 2) if pipelined else 2
    sizes = [stages * s.elements(tile.bk) for s in (a, bb)]
    base = ke.dynamic_shared(element.width // 8 * sum(sizes))
    buffers = [base, b.gep(base, [c(sizes[0])], inbounds=True, source_etype=element)]

    batch, tile_m, tile_n = unflatten(b, ke.block_index(), [batches, tiles_m, tiles_n])
    coordinates = Coordinates(ke, m_dims, n_dims, batch_dims, batch)
    point = coordinates.point
    m0, n0 = b.mul(tile_m, c(tile.bm)), b.mul(tile_n, c(tile.bn))
    tid = ke.thread_index()
    lane, warp = b.urem(tid, c(WARP)), b.udiv(tid, c(WARP))
    warp_m = b.mul(b.udiv(warp, c(tile.warps_n)), c(tile.bm // tile.warps_m))
    warp_n = b.mul(b.urem(warp, c(tile.warps_n)), c(tile.bn // tile.warps_n))

    def checked_points(outer: ir.Value, kk: ir.Value, s: _Staged) -> list[ir.Value]:
        """The operand at the chunk's points from (outer, kk) on, 0 outside the product."""
        values = []
        for e in range(chunk):
            o, q = (outer, b.add(kk, c(e))) if s.k_fastest else (b.add(outer, c(e)), kk)
            ok = b.and_(b.icmp_unsigned("<", o, c(s.size)), b.icmp_unsigned("<", q, c(depth)))
            o, q = b.select(ok, o, c(0)), b.select(ok, q, c(0))
            em = ke.emitter(point(o, None, q) if s.is_a else point(None, o, q))
            values.append(b.select(ok, em.value(s.value), ir.Constant(F32, 0.0)))
        return values

    def chunks(k0: ir.Value, s: _Staged, stage: ir.Value, k_inside: bool = False):
        """This thread's chunks of the operand's tile at K offset `k0`: for each, its first
        point (outer, kk) in the product, whether it lies inside, and its slot in `stage`.
        `k_inside`: the step at `k0` lies wholly inside K. A bound the tiles divide, or one
        the caller vouches for, is not tested: the copies' addresses are then an induction of
        the K loop, not selects."""
        per_row = (tile.bk if s.k_fastest else s.outer) // chunk
        base = b.mul(stage, c(s.elements(tile.bk)))
        for q in range(s.outer * tile.bk // chunk // tile.threads):
            at = b.add(tid, c(q * tile.threads))
            row, first = b.udiv(at, c(per_row)), b.mul(b.urem(at, c(per_row)), c(chunk))
            slot = b.add(base, s.place(b, b.add(b.mul(row, c(s.row(tile.bk))), first), tile.bk))
            outer, kk = (row, first) if s.k_fastest else (first, row)
            outer, kk = b.add(m0 if s.is_a else n0, outer), b.add(k0, kk)
            ok = ir.Constant(ir.IntType(1), 1)
            if s.size % s.outer:
                ok = b.and_(ok, b.icmp_unsigned("<", outer, c(s.size)))
            if not k_inside:
                ok = b.and_(ok, b.icmp_unsigned("<", kk, c(depth)))
            yield outer, kk, ok, slot

    def first_point(s: _Staged, outer: ir.Value, kk: ir.Value, ok: ir.Value) -> list[ir.Value | None]:
        """The domain point of a chunk's first element (the product's first, outside it)."""
        outer, kk = b.select(ok, outer, c(0)), b.select(ok, kk, c(0))
        return point(outer, None, kk) if s.is_a else point(None, outer, kk)

    def load_step(k0: ir.Value, s: _Staged) -> list[tuple[ir.Value, ir.Value]]:
        """This thread's chunks of the operand's tile at K offset `k0`: (<8 x i16>, slot)."""
        inner = s.value
        found = []
        for outer, kk, ok, slot in chunks(k0, s, c(0)):
            if s.lanes is not None:  # the chunk's 8 points in one group: 16-byte loads where they can be
                group = LaneGroup(ke, s.lanes, first_point(s, outer, kk, ok))
                group.preload([inner])
                bits = [_staged_bits(b, v, inner, fmt) for v in group.values(inner)]
            else:  # point by point, each checked against the product's bounds
                bits = [_staged_bits(b, v, inner, fmt) for v in checked_points(outer, kk, s)]
            packed = ir.Constant(ir.VectorType(element, chunk), None)
            for e, value in enumerate(bits):
                packed = b.insert_element(packed, value, ir.Constant(I32, e))
            if s.lanes is not None:
                packed = b.select(ok, packed, ir.Constant(ir.VectorType(element, chunk), [0] * chunk))
            found.append((packed, slot))
        return found

    def store_step(values: list[tuple[ir.Value, ir.Value]], s: _Staged, buffer: ir.Value, stage: ir.Value) -> None:
        base = b.mul(stage, c(s.elements(tile.bk)))
        for packed, slot in values:
            b.store(packed, ke.shared_at(buffer, b.add(base, slot), element), align=16)

    def copy_step(k0: ir.Value, s: _Staged, buffer: ir.Value, stage: ir.Value, k_inside: bool) -> None:
        """Start copying the operand's tile at K offset `k0` into `stage` (cp.async, 16 bytes a
        chunk; a chunk outside the product reads nothing and fills zeros)."""
        load = s.value
        for outer, kk, ok, slot in chunks(k0, s, stage, k_inside):
            first = ke.emitter(first_point(s, outer, kk, ok))
            source = b.gep(ke.in_ptrs[load.input], [first.offset(load.index, ke.shapes[load.input])], inbounds=True,
                           source_etype=memory_type(load.dtype))
            cp_async(ke, ke.shared_at(buffer, slot, element), source, b.select(ok, ir.Constant(I32, 16), ir.Constant(I32, 0)))

    def ldmatrix(address: ir.Value, trans: bool) -> list[ir.Value]:
        regs = ldmatrix_x4(ke, address, trans)
        if fmt.name == "tf32":  # float32 words as staged: round them as fragments take them
            regs = [to_tf32(ke, b.bitcast(r, F32)) for r in regs]
        return regs

    group, pair = b.udiv(lane, c(4)), b.mul(b.urem(lane, c(4)), c(2))
    quarter = b.urem(lane, c(4))

    def word(buffer: ir.Value, base: ir.Value, s: _Staged, outer: ir.Value, kk: ir.Value) -> ir.Value:
        """The staged float32 at (outer, kk), rounded to TF32 (to nearest, ties away)."""
        slot = b.mul(outer, c(s.row(tile.bk))) if s.k_fastest else b.mul(kk, c(s.row(tile.bk)))
        slot = s.place(b, b.add(slot, kk if s.k_fastest else outer), tile.bk)
        return to_tf32(ke, b.load(ke.shared_at(buffer, b.add(base, slot), I32), typ=F32))

    def words_a(buffer: ir.Value, base: ir.Value, ks: int) -> list[list[ir.Value]]:
        """TF32 fragments of A (m16 x k8): a0 (group, quarter), a1 eight rows down, a2 and a3
        four columns on; one 32-bit shared load each (the 32 lanes hit 32 banks)."""
        found = []
        for f in range(tile.frags_m):
            m = b.add(warp_m, b.add(group, c(f * 16)))
            kk = b.add(c(ks), quarter)
            found.append([word(buffer, base, a, b.add(m, c(8 * (r % 2))), b.add(kk, c(4 * (r // 2))))
                          for r in range(4)])
        return found

    def words_b(buffer: ir.Value, base: ir.Value, ks: int) -> list[list[ir.Value]]:
        """TF32 fragments of B (k8 x n8): b0 (quarter, group), b1 four rows on."""
        return [[word(buffer, base, bb, b.add(warp_n, b.add(group, c(f * 8))), b.add(c(ks), b.add(quarter, c(4 * r))))
                 for r in range(2)] for f in range(tile.frags_n)]

    def fragments_a(buffer: ir.Value, base: ir.Value, ks: int) -> list[list[ir.Value]]:
        """Per m16 fragment of this warp: a0..a3 at K offset `ks` of the staged step."""
        r8, r16 = b.urem(lane, c(8)), b.urem(lane, c(16))
        high, mid = b.udiv(lane, c(16)), b.urem(b.udiv(lane, c(8)), c(2))
        found = []
        for f in range(tile.frags_m):
            m = b.add(warp_m, c(f * 16))
            if a.k_fastest:  # lane l: row m + l % 16, columns from ks + chunk (l / 16)
                slot = b.add(b.mul(b.add(m, r16), c(a.row(tile.bk))), b.add(c(ks), b.mul(high, c(chunk))))
            else:            # stored [k][m]: rows ks + l % 8 + 8 (l / 16), from m + 8 ((l / 8) % 2)
                kk = b.add(c(ks), b.add(r8, b.mul(high, c(8))))
                slot = b.add(b.mul(kk, c(a.row(tile.bk))), b.add(m, b.mul(mid, c(8))))
            found.append(ldmatrix(ke.shared_at(buffer, b.add(base, a.place(b, slot, tile.bk)), element), not a.k_fastest))
        return found

    def fragments_b(buffer: ir.Value, base: ir.Value, ks: int) -> list[list[ir.Value]]:
        """Per n8 fragment of this warp: b0, b1 (two fragments per ldmatrix)."""
        r8 = b.urem(lane, c(8))
        high, mid = b.udiv(lane, c(16)), b.urem(b.udiv(lane, c(8)), c(2))
        found = []
        for f in range(0, tile.frags_n, 2):
            n = b.add(warp_n, c(f * 8))
            if bb.k_fastest:  # stored [n][k]: rows n + l % 8 + 8 (l / 16), from ks + chunk ((l / 8) % 2)
                slot = b.add(b.mul(b.add(n, b.add(r8, b.mul(high, c(8)))), c(bb.row(tile.bk))),
                             b.add(c(ks), b.mul(mid, c(chunk))))
            else:             # stored [k][n]: rows ks + l % 8 + 8 ((l / 8) % 2), from n + 8 (l / 16)
                kk = b.add(c(ks), b.add(r8, b.mul(mid, c(8))))
                slot = b.add(b.mul(kk, c(bb.row(tile.bk))), b.add(n, b.mul(high, c(8))))
            regs = ldmatrix(ke.shared_at(buffer, b.add(base, bb.place(b, slot, tile.bk)), element), not bb.k_fastest)
            found += [regs[0:2], regs[2:4]]
        return found

    load_a = fragments_a if a.ldmatrix else words_a
    load_b = fragments_b if bb.ldmatrix else words_b

    def mma(a_regs: list[ir.Value], b_regs: list[ir.Value], acc: list[ir.Value]) -> list[ir.Value]:
        return mma_sync(ke, fmt, a_regs, b_regs, acc)

    def multiply(half: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        base_a, base_b = b.mul(half, c(a.elements(tile.bk))), b.mul(half, c(bb.elements(tile.bk)))
        accs = list(accs)
        for ks in range(0, tile.bk, fmt.depth):
            frag_a = load_a(buffers[0], base_a, ks)
            frag_b = load_b(buffers[1], base_b, ks)
            for i in range(tile.frags_m):
                for j in range(tile.frags_n):
                    at = 4 * (i * tile.frags_n + j)
                    accs[at:at + 4] = mma(frag_a[i], frag_b[j], accs[at:at + 4])
        return accs

    zero = ir.Constant(F32, 0.0)
    accs = [zero] * (4 * tile.frags_m * tile.frags_n)
    ke.await_producers()
    if pipelined:
        # Only steps that exist are copied, so a K the step divides is never tested: the loop
        # that copies ahead stops stages - 1 steps early, and the last steps only multiply.
        k_inside = depth % tile.bk == 0
        for stage in range(stages - 1):
            if stage < steps:
                for s, buffer in zip((a, bb), buffers):
                    copy_step(c(stage * tile.bk), s, buffer, c(stage), k_inside)
            async_call(ke, "llvm.nvvm.cp.async.commit.group")  # (empty past the last step: the count stays)

        def step(copies: bool):
            def body(b: ir.IRBuilder, t: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                async_call(ke, "llvm.nvvm.cp.async.wait.group", stages - 2)  # step t's copies landed ...
                ke.barrier()  # ... everyone's, and everyone is done with the stage refilled next
                if copies:
                    ahead = b.add(t, c(stages - 1))
                    for s, buffer in zip((a, bb), buffers):
                        copy_step(b.mul(ahead, c(tile.bk)), s, buffer, b.urem(ahead, c(stages)), k_inside)
                async_call(ke, "llvm.nvvm.cp.async.commit.group")
                return multiply(b.urem(t, c(stages)), accs)
            return body
        copying = max(steps - (stages - 1), 0)
        accs = loop(b, 0, copying, step(True), accs, name="kstep", vectorize=False, unroll=1)
        accs = loop(b, copying, steps, step(False), accs, name="klast", vectorize=False, unroll=1)
        # Each step waited for its own copies, so none is in flight here; the wait guards the
        # exit (a block's shared memory goes to the next block) should that order change.
        async_call(ke, "llvm.nvvm.cp.async.wait.group", 0)
    else:
        for s, buffer in zip((a, bb), buffers):
            store_step(load_step(c(0), s), s, buffer, c(0))
        ke.barrier()

        def step(b: ir.IRBuilder, t: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            following = b.mul(b.add(t, c(1)), c(tile.bk))
            ahead = [load_step(following, s) for s in (a, bb)]  # loads in flight during the multiplies
            half = b.urem(t, c(2))
            accs = multiply(half, accs)
            for values, s, buffer in zip(ahead, (a, bb), buffers):
                store_step(values, s, buffer, b.sub(c(1), half))
            ke.barrier()
            return accs
        accs = loop(b, 0, steps, step, accs, name="kstep", vectorize=False, unroll=1)

    stores = AccumulatorStores(ke, coordinates, m_size, n_size)
    # fragment (i, j): c0, c1 at row group, columns pair, pair + 1; c2, c3 eight rows down
    rows = [b.add(m0, b.add(warp_m, b.add(group, c(i * 16 + 8 * half)))) for i in range(tile.frags_m) for half in range(2)]
    columns = [b.add(n0, b.add(warp_n, b.add(pair, c(j * 8)))) for j in range(tile.frags_n)]
    inside = b.and_(b.icmp_unsigned("<=", b.add(m0, c(tile.bm)), c(m_size)),
                    b.icmp_unsigned("<=", b.add(n0, c(tile.bn)), c(n_size)))

    def sums(row: int, j: int) -> list[ir.Value]:
        at = 4 * ((row // 2) * tile.frags_n + j) + 2 * (row % 2)
        return accs[at:at + 2]
    stores.store_tile(inside, b.trunc(quarter, I32), rows, columns, sums)
    b.ret_void()
    layouts = "".join("k" if s.k_fastest else "o" for s in (a, bb))
    how = f"cp.async {stages} stages" if pipelined else "through registers"
    return (batches * tiles_m * tiles_n, tile.threads,
            f"mma {fmt.name} {tile.bm}x{tile.bn}x{tile.bk} warps {tile.warps_m}x{tile.warps_n} staged {layouts} {how}")
