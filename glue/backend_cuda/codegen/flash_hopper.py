"""FlashAttention's forward on sm_90a's warpgroup tensor cores, laid out as FlashAttention-3's:
TMA loads into a ring of shared-memory stages, a producer warpgroup apart from two consumer
warpgroups, and `wgmma` for both products, the second one reading the probabilities from
registers.

Served: bfloat16 or float16 q, k, v of one head size, 64 or 128, either layout, grouped-query
heads, causal or not (what flash.py serves otherwise, where this kernel does not apply: other
head sizes, float32 on TF32, the backward, GPUs before Hopper).

A block takes 128 queries of one (batch, head), 64 per consumer warpgroup, and walks tiles of
128 keys. Its producer thread loads the queries once and then each tile's K and V, each with
its own `full` barrier, into the next free stage (`empty`: every consumer warp has finished
with it); TMA writes 128-byte rows with the 128-byte swizzle (a head of 128 is two boxes of 64
columns) and fills rows past T or S with zeros. A consumer warpgroup issues, for tile j, O +=
P_{j-1} V_{j-1} and S_j = Q K_j^T as one group of `wgmma`s, waits for both, frees tile j-1's
stage, and runs the online softmax of S_j (O rescaled for the new row maximum) on the CUDA
cores; the two consumers' softmaxes run while the other's products hold the tensor cores.
(Overlapping a warpgroup's own softmax with its P V, FlashAttention-3's other overlap, makes
ptxas serialise every `wgmma` here: C7513.) S's accumulator fragments are P's A fragments as
they lie (the m64nN accumulator of a warp is mma.sync's m16n8 fragment, once per 8 columns),
rounded to 16 bits. K is read K-major (its rows are the keys, the head contiguous) and V MN-major (`wgmma`'s
transpose flag), so neither is ever transposed. Only the tiles on the causal diagonal or past
S are masked; the softmax, the results (O / l and the row logsumexp the backward reads) and the
block order (the latest query tiles first under the causal rule) are flash.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from glue.backend_cuda.codegen import hopper as hp
from glue.backend_cuda.codegen.common import WARP, KernelEmitter, Place
from glue.backend_cuda.codegen.flash import LOG2E, Flash, flash_spec, query_block, softmax_step, store_forward
from glue.backend_cuda.ptx import sm_number
from glue.codegen.loops import loop
from glue.codegen.types import F32, I32, I64
from glue.ir import Eqn
from glue.ir import dtypes as dt
from glue.scheduler.attention import Spec
from glue.settings import config

WARPGROUP = 4 * WARP
CONSUMERS = 2             # consumer warpgroups, 64 queries each
BM = 64 * CONSUMERS       # queries of a block
BN = BM                   # keys of a tile (equal, so that a causal block masks only its last tile)
ATOM = 64                 # columns of one 128-byte swizzled box of 16-bit elements
ROW_BYTES = hp.SWIZZLE_BYTES
HEADS = (64, 128)         # head sizes served
MAX_STAGES = 4
SHARED_LIMIT = 227 << 10  # dynamic shared memory a block may opt into on the H100/H200
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # 128 x 40 + 256 x 232 <= 64K registers
_TYPES = {dt.bfloat16: "bf16", dt.float16: "f16"}


@dataclass(frozen=True)
class HopperFlashPlan:
    """The forward of `spec` on warpgroups: `stages` stages of K and V, the tensor maps of q,
    k and v (kernel parameters 0, 1, 2 of its maps)."""

    spec: Spec
    stages: int
    q: hp.TensorMap
    k: hp.TensorMap
    v: hp.TensorMap

    @property
    def tensor_maps(self) -> tuple[hp.TensorMap, ...]:
        return self.q, self.k, self.v

    @property
    def boxes(self) -> int:
        """TMA loads of one tile: a box per 64 columns of the head."""
        return self.spec.h // ATOM

    @property
    def tile_bytes(self) -> int:
        """One staged tile of 128 rows (queries, or keys: BM == BN)."""
        return self.boxes * BM * ROW_BYTES

    def __str__(self) -> str:
        spec = self.spec
        return (f"flash forward {_TYPES[spec.dtype]} wgmma {BM}x{BN} h{spec.h} tma {self.stages} stages "
                f"warp-specialized {CONSUMERS}+1 warpgroups{' causal' if spec.causal else ''}")


def _rows_map(param: int, spec: Spec, heads: int, length: int) -> hp.TensorMap:
    """TMA's view of a q/k/v-shaped operand: dims (head size, heads, length, batch) for BTNH,
    (head size, length, heads, batch) for BNTH, innermost first; a box is 64 columns of 128
    rows of one (batch, head)."""
    h, e = spec.h, 2
    if spec.layout == "BTNH":
        dims, box = (h, heads, length, spec.b), (ATOM, 1, BM, 1)
    else:
        dims, box = (h, length, heads, spec.b), (ATOM, BM, 1, 1)
    strides = (h * e, dims[1] * h * e, dims[1] * dims[2] * h * e)
    return hp.TensorMap(param, 0, _TYPES[spec.dtype], dims, strides, box)


def hopper_flash_plan(eqn: Eqn, part: str, places: tuple[Place, ...], inputs: tuple[Place, ...], arch: str,
                      aligned: bool) -> HopperFlashPlan | None:
    """The warpgroup kernel for a flash kernel `part` of `eqn`, or None where flash.py's
    `mma.sync` kernel serves it (not sm_90a, the backward, float32, another head size)."""
    if part != "forward" or not (arch.endswith("a") and sm_number(arch) == 90 and aligned and config.cuda_wgmma):
        return None
    spec = flash_spec(eqn)
    if spec.dtype not in _TYPES or spec.h != spec.hv or spec.h not in HEADS:
        return None
    q, k, v = (places.index(p) for p in inputs[:3])
    tile = spec.h // ATOM * BM * ROW_BYTES
    stages = min(MAX_STAGES, (SHARED_LIMIT - hp.SWIZZLE_ATOM - 256 - tile) // (2 * tile))
    return HopperFlashPlan(spec, stages, _rows_map(q, spec, spec.n, spec.t), _rows_map(k, spec, spec.kv, spec.s),
                           _rows_map(v, spec, spec.kv, spec.s))


class _Ring:
    """Shared memory (1 KiB aligned, as the swizzle pattern needs): the query tile, the stages
    (each a K tile and a V tile), then the mbarriers: the queries' `full`, and per stage K's
    and V's `full` and the stage's `empty`."""

    def __init__(self, ke: KernelEmitter, plan: HopperFlashPlan):
        self.b, self.plan, self.stages = ke.b, plan, plan.stages
        tiles = (1 + 2 * plan.stages) * plan.tile_bytes
        base = ke.dynamic_shared(tiles + hp.SWIZZLE_ATOM + 8 * (1 + 3 * plan.stages))
        raw = hp.shared_u32(self.b, base)
        self.q = self.b.and_(self.b.add(raw, self.c(hp.SWIZZLE_ATOM - 1)), self.c(-hp.SWIZZLE_ATOM))
        self.q_full = self.b.add(self.q, self.c(tiles))

    @staticmethod
    def c(value: int) -> ir.Value:
        return ir.Constant(I32, value)

    def _barrier(self, which: int, s: ir.Value) -> ir.Value:
        return self.b.add(self.q_full, self.b.add(self.c(8 + 8 * which * self.stages), self.b.mul(s, self.c(8))))

    def k_full(self, s: ir.Value) -> ir.Value:
        return self._barrier(0, s)

    def v_full(self, s: ir.Value) -> ir.Value:
        return self._barrier(1, s)

    def empty(self, s: ir.Value) -> ir.Value:
        return self._barrier(2, s)

    def k(self, s: ir.Value) -> ir.Value:
        return self.b.add(self.q, self.b.mul(self.b.add(self.b.mul(s, self.c(2)), self.c(1)),
                                             self.c(self.plan.tile_bytes)))

    def v(self, s: ir.Value) -> ir.Value:
        return self.b.add(self.k(s), self.c(self.plan.tile_bytes))

    def position(self, j: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(stage, phase parity) of key tile `j`."""
        j32 = self.b.trunc(j, I32)
        return self.b.urem(j32, self.c(self.stages)), self.b.and_(self.b.udiv(j32, self.c(self.stages)), self.c(1))


def emit_hopper_flash(ke: KernelEmitter, plan: HopperFlashPlan) -> tuple[int, int, str]:
    """Emit the forward kernel `plan` describes into `ke` (whose tensor-map parameters it
    reads); its grid, block and strategy."""
    b, spec = ke.b, plan.spec
    c32 = _Ring.c
    ring = _Ring(ke, plan)
    tid = ke.thread_index()
    tid32 = b.trunc(tid, I32)
    warpgroup = b.udiv(tid32, c32(WARPGROUP))
    fl = Flash(ke, spec, b.sub(tid, ir.Constant(I64, WARPGROUP)))  # the consumers' rows
    batch, head, kv_head, q0, n_tiles = query_block(fl, BM)
    with b.if_then(b.icmp_unsigned("==", tid32, c32(0))):
        hp.mbarrier_init(b, ring.q_full, 1)
        for s in range(plan.stages):
            hp.mbarrier_init(b, ring.k_full(c32(s)), 1)
            hp.mbarrier_init(b, ring.v_full(c32(s)), 1)
            hp.mbarrier_init(b, ring.empty(c32(s)), CONSUMERS * WARPGROUP // WARP)  # one arrival per consumer warp
        hp.fence_barrier_init(b)
    ke.barrier()
    ke.await_producers()
    with b.if_else(b.icmp_unsigned("==", warpgroup, c32(0))) as (producer, consumer):
        with producer:
            hp.set_max_registers(b, PRODUCER_REGISTERS, grow=False)
            with b.if_then(b.icmp_unsigned("==", tid32, c32(0))):
                _produce(ke, plan, ring, batch, head, kv_head, q0, n_tiles)
        with consumer:
            hp.set_max_registers(b, CONSUMER_REGISTERS, grow=True)
            _consume(fl, plan, ring, b.sub(warpgroup, c32(1)), batch, head, q0, n_tiles)
    b.ret_void()
    return spec.b * spec.n * -(-spec.t // BM), (CONSUMERS + 1) * WARPGROUP, str(plan)


def _load_tile(ke: KernelEmitter, plan: HopperFlashPlan, which: int, target: ir.Value, barrier: ir.Value,
               head: ir.Value, row: ir.Value, batch: ir.Value) -> None:
    """Announce a tile's bytes on `barrier` and start its TMA loads (`which`: q, k or v's map)
    of rows row.. of one (batch, head) into `target`."""
    b = ke.b
    hp.arrive_expect_bytes(b, barrier, plan.tile_bytes)
    head32, row32, batch32 = (b.trunc(x, I32) for x in (head, row, batch))
    for box in range(plan.boxes):
        col = ir.Constant(I32, box * ATOM)
        coords = [col, head32, row32, batch32] if plan.spec.layout == "BTNH" else [col, row32, head32, batch32]
        hp.tma_load(b, b.add(target, ir.Constant(I32, box * BM * ROW_BYTES)), ke.map_args[which], coords, barrier)


def _produce(ke: KernelEmitter, plan: HopperFlashPlan, ring: _Ring, batch, head, kv_head, q0, n_tiles) -> None:
    """The producer thread: the queries, then each key tile's K and V into the next stage once
    the consumers have freed it."""
    b = ke.b
    _load_tile(ke, plan, 0, ring.q, ring.q_full, head, q0, batch)

    def step(b: ir.IRBuilder, j: ir.Value, _: list) -> list:
        s, parity = ring.position(j)
        with b.if_then(b.icmp_unsigned(">=", j, ir.Constant(I64, plan.stages))):
            hp.wait_parity(b, ring.empty(s), b.xor(parity, ring.c(1)))  # the stage's previous tile
        row = b.mul(j, ir.Constant(I64, BN))
        _load_tile(ke, plan, 1, ring.k(s), ring.k_full(s), kv_head, row, batch)
        _load_tile(ke, plan, 2, ring.v(s), ring.v_full(s), kv_head, row, batch)
        return []

    loop(b, 0, n_tiles, step, [], name="produce", vectorize=False, unroll=1)


def _consume(fl: Flash, plan: HopperFlashPlan, ring: _Ring, consumer: ir.Value, batch, head, q0, n_tiles) -> None:
    """A consumer warpgroup's 64 queries over every key tile (see the module docstring)."""
    b, spec = fl.b, plan.spec
    c32, c64 = ring.c, fl.c
    types = f"f32.{_TYPES[spec.dtype]}.{_TYPES[spec.dtype]}"
    q_rows = b.add(ring.q, b.mul(consumer, c32(64 * ROW_BYTES)))
    first_lane = b.icmp_unsigned("==", fl.lane, c64(0))
    # logits to log2 units: folded into the exponent's multiply-add where the scale is positive
    factor = spec.scale * LOG2E if spec.scale > 0 else 1.0
    rows = [b.add(q0, fl.row_of(2 * half)) for half in range(2)]
    # Only a block's last key tile can hold logits that do not count (keys past S; under the
    # causal rule, after the block's first query: BM == BN), and its first where it is the last.
    masks = spec.causal or spec.s % BN != 0

    def issue_scores(s: ir.Value) -> list[ir.Value]:
        """Start S = Q K^T on stage `s` (one commit group)."""
        acc: list[ir.Value] | int = BN // 2
        for j in range(spec.h // 16):
            box, step = divmod(j, ATOM // 16)
            a = hp.matrix_descriptor(b, b.add(q_rows, c32(box * BM * ROW_BYTES + 32 * step)), 16, 8 * ROW_BYTES)
            k = hp.matrix_descriptor(b, b.add(ring.k(s), c32(box * BN * ROW_BYTES + 32 * step)), 16, 8 * ROW_BYTES)
            acc = hp.wgmma(b, f"m64n{BN}k16", types, a, k, acc, (0, 0))
        hp.wgmma_commit(b)
        return acc

    def issue_values(p: list[ir.Value], o: list[ir.Value], s: ir.Value) -> list[ir.Value]:
        """Start O += P V on stage `s` (one commit group): P's fragments from registers, V's
        rows the depth, 16 a step (2 KiB down its boxes)."""
        for kk in range(BN // 16):
            v = hp.matrix_descriptor(b, b.add(ring.v(s), c32(16 * ROW_BYTES * kk)), BN * ROW_BYTES, 8 * ROW_BYTES)
            o = hp.wgmma_from_registers(b, f"m64n{spec.h}k16", types, p[4 * kk:4 * kk + 4], v, o, 1)
        hp.wgmma_commit(b)
        return o

    def softmax(acc: list[ir.Value], j: ir.Value, m: list[ir.Value], l: list[ir.Value], masked: bool):
        """The online softmax of tile j's scores: (P as A fragments, m, l, alpha)."""
        s = [acc[4 * f:4 * f + 4] for f in range(BN // 8)]
        if factor == 1.0:
            s = [[b.fmul(x, fl.f(spec.scale * LOG2E)) for x in regs] for regs in s]
        if masked:
            s = _masked(fl, s, rows, b.mul(j, c64(BN)))
        p, m, l, alpha = softmax_step(fl, s, m, l, factor)
        fragments = []
        for kk in range(BN // 16):
            lo, hi = p[2 * kk], p[2 * kk + 1]
            fragments += [fl.pack(lo[0], lo[1]), fl.pack(lo[2], lo[3]), fl.pack(hi[0], hi[1]), fl.pack(hi[2], hi[3])]
        return fragments, m, l, alpha

    def free(s: ir.Value) -> None:
        with b.if_then(first_lane):
            hp.arrive(b, ring.empty(s))

    hp.wait_parity(b, ring.q_full, c32(0))
    s0, parity0 = ring.position(c64(0))
    hp.wait_parity(b, ring.k_full(s0), parity0)
    hp.wgmma_fence(b)
    scores = issue_scores(s0)
    hp.wgmma_wait(b, 0)
    inf = fl.f(float("-inf"))
    p, m, l, _ = softmax(hp.hold(b, scores), c64(0), [inf, inf], [fl.f(0.0)] * 2, masks)
    n_o = spec.h // 2

    def tile(j: ir.Value, values: list[ir.Value], masked: bool) -> list[ir.Value]:
        m, l, o, p = values[0:2], values[2:4], values[4:4 + n_o], values[4 + n_o:]
        s, parity = ring.position(j)
        before, before_parity = ring.position(b.sub(j, c64(1)))
        hp.wait_parity(b, ring.k_full(s), parity)
        hp.wait_parity(b, ring.v_full(before), before_parity)
        o, p = _before_fence(b, o, p)
        o = issue_values(p, o, before)
        scores = issue_scores(s)
        hp.wgmma_wait(b, 0)
        held = hp.hold(b, o + scores + p)  # (P_{j-1}'s registers stay untouched until here)
        free(before)
        o, scores = held[:n_o], held[n_o:n_o + BN // 2]
        p_next, m, l, alpha = softmax(scores, j, m, l, masked)
        o = [b.fmul(x, alpha[(i % 4) // 2]) for i, x in enumerate(o)]
        return m + l + o + p_next

    values = m + l + [fl.f(0.0)] * n_o + p
    last = b.sub(n_tiles, c64(1))
    values = loop(b, 1, last if masks else n_tiles, lambda b, j, values: tile(j, values, False), values,
                  name="kv", vectorize=False, unroll=1)
    if masks:  # the last tile, where it is not the first
        values = _when(b, b.icmp_unsigned(">", n_tiles, c64(1)), lambda: tile(last, values, True), values)
    m, l, o, p = values[0:2], values[2:4], values[4:4 + n_o], values[4 + n_o:]
    last, last_parity = ring.position(last)
    hp.wait_parity(b, ring.v_full(last), last_parity)
    o, p = _before_fence(b, o, p)
    o = issue_values(p, o, last)
    hp.wgmma_wait(b, 0)
    o = hp.hold(b, o)
    free(last)
    store_forward(fl, [o[4 * e:4 * e + 4] for e in range(spec.h // 8)], m, l, batch, head, q0)


def _before_fence(b: ir.IRBuilder, o: list[ir.Value], p: list[ir.Value]) -> tuple[list[ir.Value], list[ir.Value]]:
    """`wgmma.fence` with O and P's fragments in their registers before it: a register that an
    instruction other than `wgmma` writes inside the stage (the rescaling of O or the rounding
    of P, sunk to where their values are first used; a copy of loop-carried P) serialises
    every `wgmma`."""
    o, p = hp.hold(b, o), hp.copied(b, p)
    hp.wgmma_fence(b)
    return o, p


def _masked(fl: Flash, s: list[list[ir.Value]], rows: list[ir.Value], j0: ir.Value) -> list[list[ir.Value]]:
    """The scores of the tile whose keys start at j0 with the logits that do not count (keys
    past S, or after the query under the causal rule) at -inf."""
    b, inf = fl.b, fl.f(float("-inf"))
    masked = []
    for f, regs in enumerate(s):
        oks = [fl.keep(rows[r // 2], b.add(j0, fl.col_of(f, r)), fl.spec.s, BN) for r in range(4)]
        masked.append([x if ok is None else b.select(ok, x, inf) for x, ok in zip(regs, oks)])
    return masked


def _when(b: ir.IRBuilder, condition: ir.Value, then: Callable[[], list[ir.Value]], values: list[ir.Value]
          ) -> list[ir.Value]:
    """`then()`'s values where `condition` holds, else `values`."""
    before = b.block
    with b.if_then(condition):
        new = then()
        after_then = b.block
    merged = []
    for old, value in zip(values, new):
        phi = b.phi(old.type)
        phi.add_incoming(old, before)
        phi.add_incoming(value, after_then)
        merged.append(phi)
    return merged


__all__ = ["HopperFlashPlan", "emit_hopper_flash", "hopper_flash_plan"]
