"""FlashAttention on sm_90a's warpgroup tensor cores, laid out as FlashAttention-3's: TMA
loads into a ring of shared-memory stages, a producer warpgroup apart from two consumer
warpgroups, and `wgmma` for every product, the probabilities (or their gradients) read as A
fragments from registers where they are computed. The three kernels are flash.py's (forward;
dq; dk, dv), with its results, softmax and block order.

Served: bfloat16 or float16 q, k, v of one head size, 64 or 128, either layout, grouped-query
heads, causal or not, forward and backward. flash.py
serves the rest (other head sizes, float32 on TF32, GPUs before Hopper).

Every kernel is a block of 3 warpgroups; a block's own rows (128: 64 per consumer) are loaded
once, and its producer thread streams the other operand's tiles into the next free stage
(`full` barriers for their bytes, `empty` once every consumer warp is done with a stage). TMA
writes 128-byte rows with the 128-byte swizzle (a head of 128 is two boxes of 64 columns) and
fills rows past T or S with zeros. An operand whose rows are the product's depth is read
MN-major (`wgmma`'s transpose flag), so nothing is ever transposed. A thread starts with 168
registers (`.maxnreg`), the producers give theirs up and the consumers take 240.

- forward: 128 queries over tiles of 128 keys. For tile j a consumer issues O += P_{j-1} V_{j-1}
  and S_j = Q K_j^T as one group, waits, frees tile j-1's stage and runs the online softmax of
  S_j (O rescaled for the new row maximum) on the CUDA cores while the other consumer's products
  hold the tensor cores. (Overlapping a warpgroup's own softmax with its P V, FlashAttention-3's
  other overlap, makes ptxas serialise every `wgmma` here: C7513.) S's accumulator fragments are
  P's A fragments as they lie (the m64nN accumulator of a warp is mma.sync's m16n8 fragment, once
  per 8 columns), rounded to 16 bits. Only a block's last tile is masked (the causal diagonal,
  keys past S), and its first where that is the last.
- dq: 128 queries over tiles of 64 keys: dQ += dS_{j-1} K_{j-1} with S_j = Q K_j^T and
  dP_j = dO V_j^T as one group, then P_j = exp(S_j scale - lse) and dS_j = P_j (dP_j - delta).
  The block first works out its rows' delta = rowsum(dO O) - d_lse, and writes it with the
  rows' lse (in log2 units) as a pair per query for dk, dv (`row_values_bytes`).
- dk, dv: 128 keys of a kv head over steps of 64 queries of each query head of the group (under
  the causal rule from the block's first key on): S^T = K Q^T and dP^T = V dO^T, then P^T and
  dS^T on the CUDA cores, then dV += P^T dO and dK += dS^T Q. The producer copies each step's
  512 bytes of query pairs into the stage with its tiles (a bulk copy), so the consumers read
  them from shared memory; only the steps on the causal diagonal and past T compare indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from glue.backend_cuda.codegen import hopper as hp
from glue.backend_cuda.codegen.common import WARP, KernelEmitter, Place
from glue.backend_cuda.codegen.fastmath import exp2_ftz
from glue.backend_cuda.codegen.flash import LOG2E, Flash, flash_spec, query_block, softmax_step, store_forward
from glue.backend_cuda.ptx import sm_number
from glue.codegen.loops import loop
from glue.codegen.types import F32, I32, I64, from_memory, memory_type
from glue.ir import Eqn
from glue.ir import dtypes as dt
from glue.scheduler.attention import Spec
from glue.settings import config

WARPGROUP, CONSUMERS = hp.WARPGROUP, hp.CONSUMERS  # (consumer warpgroups: 64 rows each)
BM = 64 * CONSUMERS       # a block's own rows: queries (forward) or keys (dkv)
BN = BM                   # keys of a forward tile (BM == BN: a causal block masks only its last tile)
DQ_KEYS = 64              # keys of a dq tile
DKV_QUERIES = 64          # queries of a dkv step
ROW_VALUES = 8            # bytes of a query's (lse in log2 units, delta) pair, which dq writes for dkv
ATOM = 64                 # columns of one 128-byte swizzled box of 16-bit elements
ROW_BYTES = hp.SWIZZLE_BYTES
HEADS = (64, 128)         # head sizes served
MAX_STAGES = 4
SHARED_LIMIT = 227 << 10  # dynamic shared memory a block may opt into on the H100/H200
_TYPES = {dt.bfloat16: "bf16", dt.float16: "f16"}
# each part's tensor maps: (operand, its index in the equation's inputs, rows a box brings)
_MAPS = {"forward": (("q", 0, BM), ("k", 1, BN), ("v", 2, BN)),
         "dq": (("q", 0, BM), ("k", 1, DQ_KEYS), ("v", 2, DQ_KEYS), ("dout", 5, BM)),
         "dkv": (("q", 0, DKV_QUERIES), ("k", 1, BM), ("v", 2, BM), ("dout", 5, DKV_QUERIES))}
# each part's shared memory: its own tiles (loaded once), and a stage's groups of tiles (each
# group under one `full` barrier), as {operand: rows}
_LAYOUTS = {"forward": ({"q": BM}, [{"k": BN}, {"v": BN}]),
            "dq": ({"q": BM, "dout": BM}, [{"k": DQ_KEYS}, {"v": DQ_KEYS}]),
            "dkv": ({"k": BM, "v": BM}, [{"q": DKV_QUERIES, "dout": DKV_QUERIES}])}
# each part's row values a stage brings beside its tiles (bytes): a dkv step's queries' pairs
_STAGE_ROW_VALUES = {"forward": 0, "dq": 0, "dkv": DKV_QUERIES * ROW_VALUES}


@dataclass(frozen=True)
class HopperFlashPlan:
    """Flash kernel `part` (forward | dq | dkv) of `spec` on warpgroups: `stages` stages, and
    the tensor maps of its operands (kernel map parameters in `_MAPS`'s order)."""

    spec: Spec
    part: str
    stages: int
    maps: tuple[hp.TensorMap, ...]

    @property
    def tensor_maps(self) -> tuple[hp.TensorMap, ...]:
        return self.maps

    def map_of(self, operand: str) -> int:
        return [name for name, _, _ in _MAPS[self.part]].index(operand)

    @property
    def boxes(self) -> int:
        """TMA loads of one tile: a box per 64 columns of the head."""
        return self.spec.h // ATOM

    def tile_bytes(self, rows: int) -> int:
        return self.boxes * rows * ROW_BYTES

    @property
    def types(self) -> str:
        """`wgmma`'s types: float32 accumulators of 16-bit operands."""
        name = _TYPES[self.spec.dtype]
        return f"f32.{name}.{name}"

    def __str__(self) -> str:
        spec, (_, groups) = self.spec, _LAYOUTS[self.part]
        walked = max(groups[0].values())  # the rows of the tiles it walks
        return (f"flash {self.part} {_TYPES[spec.dtype]} wgmma {BM}x{walked} h{spec.h} tma {self.stages} stages "
                f"warp-specialized {CONSUMERS}+1 warpgroups{' causal' if spec.causal else ''}")


def _rows_map(param: int, spec: Spec, heads: int, length: int, rows: int) -> hp.TensorMap:
    """TMA's view of a q/k/v-shaped operand: dims (head size, heads, length, batch) for BTNH,
    (head size, length, heads, batch) for BNTH, innermost first; a box is 64 columns of `rows`
    rows of one (batch, head)."""
    h, e = spec.h, 2
    if spec.layout == "BTNH":
        dims, box = (h, heads, length, spec.b), (ATOM, 1, rows, 1)
    else:
        dims, box = (h, length, heads, spec.b), (ATOM, rows, 1, 1)
    strides = (h * e, dims[1] * h * e, dims[1] * dims[2] * h * e)
    return hp.TensorMap(param, 0, _TYPES[spec.dtype], dims, strides, box)


def hopper_flash_plan(eqn: Eqn, part: str, places: tuple[Place, ...], inputs: tuple[Place, ...], arch: str,
                      aligned: bool) -> HopperFlashPlan | None:
    """The warpgroup kernel for flash kernel `part` of `eqn`, or None where flash.py's
    `mma.sync` kernel serves it (not sm_90a, float32, another head size)."""
    if part not in _MAPS or not (arch.endswith("a") and sm_number(arch) == 90 and aligned and config.cuda_wgmma):
        return None
    spec = flash_spec(eqn)
    if spec.dtype not in _TYPES or spec.h != spec.hv or spec.h not in HEADS:
        return None
    maps = []
    for name, i, rows in _MAPS[part]:
        heads, length = (spec.n, spec.t) if name in ("q", "dout") else (spec.kv, spec.s)
        maps.append(_rows_map(places.index(inputs[i]), spec, heads, length, rows))
    own, groups = _LAYOUTS[part]
    stage = sum(_bytes(spec, rows) for group in groups for rows in group.values()) + _STAGE_ROW_VALUES[part]
    free = SHARED_LIMIT - hp.SWIZZLE_ATOM - 256 - sum(_bytes(spec, rows) for rows in own.values())
    stages = min(MAX_STAGES, free // stage)
    return HopperFlashPlan(spec, part, stages, tuple(maps))


def _bytes(spec: Spec, rows: int) -> int:
    """A staged tile of `rows` rows."""
    return spec.h // ATOM * rows * ROW_BYTES


def _padded_queries(spec: Spec) -> int:
    """Queries of a (batch, head) in the row-value scratch: T rounded up to a dkv step, so that
    each step's pairs are one aligned run of bytes (those past T are zeros)."""
    return -(-spec.t // DKV_QUERIES) * DKV_QUERIES


def row_values_bytes(spec: Spec) -> int:
    """The backward's scratch: each query's (lse in log2 units, delta) pair, which the dq
    kernel works out and the dkv kernel's producer copies beside each step's tiles."""
    return spec.b * spec.n * _padded_queries(spec) * ROW_VALUES


def _row_value_pair(ke: KernelEmitter, spec: Spec, batch: ir.Value, head: ir.Value, query: ir.Value) -> ir.Value:
    """The address of query `query`'s pair in the row-value scratch (i64 indices)."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    b = ke.b
    at = b.add(b.mul(b.add(b.mul(batch, c(spec.n)), head), c(_padded_queries(spec))), query)
    return b.gep(ke.extra_ptrs[0], [b.mul(at, c(2))], inbounds=True, source_etype=F32)


class _Ring:
    """Shared memory, 1 KiB aligned (as the swizzle pattern needs): the block's own tiles,
    loaded once under one `own` mbarrier; then the stages, each some groups of tiles under a
    `full` mbarrier each, and freed by their `empty` mbarrier (an arrival per consumer warp);
    then each stage's row values (under its first group's barrier); then the mbarriers.
    Offsets are in bytes, addresses the 32-bit shared ones."""

    def __init__(self, ke: KernelEmitter, plan: HopperFlashPlan):
        self.b, self.stages = ke.b, plan.stages
        own, groups = _LAYOUTS[plan.part]
        self.at: dict[str, int] = {}  # a tile's offset: in the block's memory, or in a stage
        offset = 0
        for name, rows in own.items():
            self.at[name], offset = offset, offset + _bytes(plan.spec, rows)
        self.first_stage, self.stage_bytes, self.groups = offset, 0, len(groups)
        for group in groups:
            for name, rows in group.items():
                self.at[name], self.stage_bytes = self.stage_bytes, self.stage_bytes + _bytes(plan.spec, rows)
        self.row_values, self.row_value_bytes = self.first_stage + self.stages * self.stage_bytes, \
            _STAGE_ROW_VALUES[plan.part]
        self.barriers = self.row_values + self.stages * self.row_value_bytes
        self.memory = ke.dynamic_shared(self.barriers + hp.SWIZZLE_ATOM + 8 * (1 + self.stages * (self.groups + 1)))
        self.raw = hp.shared_u32(self.b, self.memory)
        self.base = self.b.and_(self.b.add(self.raw, self.c(hp.SWIZZLE_ATOM - 1)), self.c(-hp.SWIZZLE_ATOM))

    @staticmethod
    def c(value: int) -> ir.Value:
        return ir.Constant(I32, value)

    def init_barriers(self) -> None:
        hp.mbarrier_init(self.b, self.own_full, 1)
        for s in range(self.stages):
            for g in range(self.groups):
                hp.mbarrier_init(self.b, self.full(g, self.c(s)), 1)
            hp.mbarrier_init(self.b, self.empty(self.c(s)), CONSUMERS * WARPGROUP // WARP)

    @property
    def own_full(self) -> ir.Value:
        return self.b.add(self.base, self.c(self.barriers))

    def full(self, group: int, s: ir.Value) -> ir.Value:
        return self.b.add(self.base, self.b.add(self.c(self.barriers + 8 + 8 * group * self.stages),
                                                self.b.mul(s, self.c(8))))

    def empty(self, s: ir.Value) -> ir.Value:
        return self.full(self.groups, s)

    def own(self, name: str) -> ir.Value:
        return self.b.add(self.base, self.c(self.at[name]))

    def tile(self, name: str, s: ir.Value) -> ir.Value:
        """Stage `s`'s tile `name`."""
        return self.b.add(self.base, self.b.add(self.c(self.first_stage + self.at[name]),
                                                self.b.mul(s, self.c(self.stage_bytes))))

    def stage_row_values(self, s: ir.Value) -> ir.Value:
        """Stage `s`'s row values (a shared address)."""
        return self.b.add(self.base, self.b.add(self.c(self.row_values), self.b.mul(s, self.c(self.row_value_bytes))))

    def pointer(self, address: ir.Value) -> ir.Value:
        """A shared address as a pointer plain loads take."""
        return self.b.gep(self.memory, [self.b.zext(self.b.sub(address, self.raw), I64)], inbounds=True,
                          source_etype=ir.IntType(8))

    def position(self, i: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(stage, phase parity) of the block's i-th staged step."""
        i32 = self.b.trunc(i, I32)
        return self.b.urem(i32, self.c(self.stages)), self.b.and_(self.b.udiv(i32, self.c(self.stages)), self.c(1))


def emit_hopper_flash(ke: KernelEmitter, plan: HopperFlashPlan) -> tuple[int, int, str]:
    """Emit the kernel `plan` describes into `ke` (whose tensor-map parameters it reads); its
    grid, block and strategy."""
    b, spec = ke.b, plan.spec
    fl = Flash(ke, spec, b.sub(ke.thread_index(), ir.Constant(I64, WARPGROUP)))  # the consumers' rows
    ring = _Ring(ke, plan)
    if plan.part == "forward":
        block = query_block(fl, BM)
        produce, consume = _produce_queries, _consume_forward
        grid = spec.b * spec.n * -(-spec.t // BM)
    elif plan.part == "dq":
        block = _dq_block(fl)
        produce, consume = _produce_queries, _consume_dq
        grid = spec.b * spec.n * -(-spec.t // BM)
    else:
        block = _key_block(fl)
        produce, consume = _produce_dkv, _consume_dkv
        grid = spec.b * spec.kv * -(-spec.s // BM)
    hp.warp_specialized(ke, ring.init_barriers, lambda: produce(ke, plan, ring, *block),
                        lambda consumer: consume(fl, plan, ring, consumer, *block))
    b.ret_void()
    return grid, (CONSUMERS + 1) * WARPGROUP, str(plan)


def _load_rows(ke: KernelEmitter, plan: HopperFlashPlan, operand: str, rows: int, target: ir.Value,
               barrier: ir.Value, head: ir.Value, row: ir.Value, batch: ir.Value) -> None:
    """Start the TMA loads of `rows` rows row.. of one (batch, head) of a q/k/v-shaped operand
    into `target`, completing on `barrier`: a box per 64 columns, each `rows` x 128 bytes."""
    b = ke.b
    head32, row32, batch32 = (b.trunc(x, I32) for x in (head, row, batch))
    for box in range(plan.boxes):
        col = ir.Constant(I32, box * ATOM)
        coords = [col, head32, row32, batch32] if plan.spec.layout == "BTNH" else [col, row32, head32, batch32]
        hp.tma_load(b, b.add(target, ir.Constant(I32, box * rows * ROW_BYTES)), ke.map_args[plan.map_of(operand)],
                    coords, barrier)


def _free_stage(ring: _Ring, i: ir.Value, stages: int) -> None:
    """The producer waits until the consumers have freed step i's stage of its previous step."""
    b = ring.b
    s, parity = ring.position(i)
    with b.if_then(b.icmp_unsigned(">=", i, ir.Constant(I64, stages))):
        hp.wait_parity(b, ring.empty(s), b.xor(parity, ring.c(1)))


def _produce_queries(ke: KernelEmitter, plan: HopperFlashPlan, ring: _Ring, batch, head, kv_head, q0, n_tiles,
                     *_) -> None:
    """The producer thread of a block of queries (forward, dq): its own tiles (Q; Q and dO),
    then each key tile's K and V into the next stage once the consumers have freed it."""
    b = ke.b
    own, groups = _LAYOUTS[plan.part]
    hp.arrive_expect_bytes(b, ring.own_full, len(own) * plan.tile_bytes(BM))
    for name in own:
        _load_rows(ke, plan, name, BM, ring.own(name), ring.own_full, head, q0, batch)
    keys = groups[0]["k"]

    def step(b: ir.IRBuilder, j: ir.Value, _: list) -> list:
        _free_stage(ring, j, plan.stages)
        s, _ = ring.position(j)
        row = b.mul(j, ir.Constant(I64, keys))
        for g, name in enumerate(("k", "v")):
            hp.arrive_expect_bytes(b, ring.full(g, s), plan.tile_bytes(keys))
            _load_rows(ke, plan, name, keys, ring.tile(name, s), ring.full(g, s), kv_head, row, batch)
        return []

    loop(b, 0, n_tiles, step, [], name="produce", vectorize=False, unroll=1)


def _consume_forward(fl: Flash, plan: HopperFlashPlan, ring: _Ring, consumer: ir.Value, batch, head, kv_head, q0,
                     n_tiles) -> None:
    """A consumer warpgroup's 64 queries over every key tile (see the module docstring)."""
    b, spec = fl.b, plan.spec
    c32, c64 = ring.c, fl.c
    q_rows = b.add(ring.own("q"), b.mul(consumer, c32(64 * ROW_BYTES)))
    first_lane = b.icmp_unsigned("==", fl.lane, c64(0))
    # logits to log2 units: folded into the exponent's multiply-add where the scale is positive
    # (the running max of the raw logits is then the max in those units), else applied first
    folded = spec.scale > 0
    factor = spec.scale * LOG2E if folded else 1.0
    rows = [b.add(q0, fl.row_of(2 * half)) for half in range(2)]
    # Only a block's last key tile can hold logits that do not count (keys past S; under the
    # causal rule, after the block's first query: BM == BN), and its first where it is the last.
    masks = spec.causal or spec.s % BN != 0

    def issue_scores(s: ir.Value) -> list[ir.Value]:
        """Start S = Q K^T on stage `s` (one commit group)."""
        acc = _times_transposed(b, plan, q_rows, ring.tile("k", s), BN)
        hp.wgmma_commit(b)
        return acc

    def issue_values(p: list[ir.Value], o: list[ir.Value], s: ir.Value) -> list[ir.Value]:
        """Start O += P V on stage `s` (one commit group)."""
        o = _times_rows(b, plan, p, o, ring.tile("v", s), BN)
        hp.wgmma_commit(b)
        return o

    def softmax(acc: list[ir.Value], j: ir.Value, m: list[ir.Value], l: list[ir.Value], masked: bool):
        """The online softmax of tile j's scores: (P as A fragments, m, l, alpha)."""
        s = [acc[4 * f:4 * f + 4] for f in range(BN // 8)]
        if not folded:
            s = [[b.fmul(x, fl.f(spec.scale * LOG2E)) for x in regs] for regs in s]
        if masked:
            s = _masked(fl, s, rows, b.mul(j, c64(BN)))
        p, m, l, alpha = softmax_step(fl, s, m, l, factor)
        return _fragments(fl, [x for regs in p for x in regs]), m, l, alpha

    def free(s: ir.Value) -> None:
        with b.if_then(first_lane):
            hp.arrive(b, ring.empty(s))

    hp.wait_parity(b, ring.own_full, c32(0))
    s0, parity0 = ring.position(c64(0))
    hp.wait_parity(b, ring.full(0, s0), parity0)
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
        hp.wait_parity(b, ring.full(0, s), parity)
        hp.wait_parity(b, ring.full(1, before), before_parity)
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
    s_last, parity_last = ring.position(last)
    hp.wait_parity(b, ring.full(1, s_last), parity_last)
    o, p = _before_fence(b, o, p)
    o = issue_values(p, o, s_last)
    hp.wgmma_wait(b, 0)
    o = hp.hold(b, o)
    free(s_last)
    store_forward(fl, [o[4 * e:4 * e + 4] for e in range(spec.h // 8)], m, l, batch, head, q0)


def _dq_block(fl: Flash) -> tuple[ir.Value, ...]:
    """(batch, head, kv head, first query, key tiles, first masked key tile) of a dq block:
    128 queries over tiles of 64 keys, under the causal rule up to the block's last query."""
    b, spec, c = fl.b, fl.spec, fl.c
    batch, head, kv_head, q0, _ = query_block(fl, BM)
    tiles_k = -(-spec.s // DQ_KEYS)
    n_tiles, masked_from = c(tiles_k), c(tiles_k - 1 if spec.s % DQ_KEYS else tiles_k)
    if spec.causal:
        reach, diagonal = b.udiv(b.add(q0, c(BM)), c(DQ_KEYS)), b.udiv(q0, c(DQ_KEYS))
        n_tiles = b.select(b.icmp_unsigned("<", reach, n_tiles), reach, n_tiles)
        masked_from = b.select(b.icmp_unsigned("<", diagonal, masked_from), diagonal, masked_from)
    return batch, head, kv_head, q0, n_tiles, masked_from


def _row_deltas(fl: Flash, batch: ir.Value, head: ir.Value, q0: ir.Value, lse2: list[ir.Value]) -> list[ir.Value]:
    """delta = rowsum(dO * O) - d_lse of this thread's two rows (0 past T): the four lanes that
    hold a row each sum a quarter of it, 16 bytes a load; written with the rows' `lse2` (lse
    in log2 units) as the row-value pairs the dkv kernel reads (`row_values_bytes`)."""
    b, spec, c = fl.b, fl.spec, fl.c
    ke = fl.ke
    out_ptr, dout_ptr, dlse_ptr = ke.in_ptrs[3], ke.in_ptrs[5], ke.in_ptrs[6]
    (o_base, stride), (do_base, _) = (fl.rows_of(p, batch, head, spec.n, spec.t) for p in (out_ptr, dout_ptr))
    first = b.mul(b.add(b.mul(batch, c(spec.n)), head), c(spec.t))
    per_lane = spec.h // 4
    vector = ir.VectorType(memory_type(spec.dtype), 8)
    deltas = []
    for half in range(2):
        row = b.add(q0, fl.row_of(2 * half))
        ok = b.icmp_unsigned("<", row, c(spec.t))
        start = b.add(b.mul(b.select(ok, row, c(0)), c(stride)), b.mul(fl.quad, c(per_lane)))
        total = fl.f(0.0)
        for chunk in range(per_lane // 8):
            at = b.add(start, c(8 * chunk))
            o, do = (b.load(b.gep(base, [at], inbounds=True, source_etype=fl.element), typ=vector, align=16)
                     for base in (o_base, do_base))
            for e in range(8):
                index = ir.Constant(I32, e)
                x, y = (from_memory(b, b.extract_element(v, index), spec.dtype) for v in (o, do))
                total = b.fadd(total, b.fmul(x, y))
        total = b.fsub(fl.quad_sum(total), fl.load_row_value(dlse_ptr, first, row, spec.t))
        deltas.append(b.select(ok, total, fl.f(0.0)))
        pair = b.insert_element(b.insert_element(ir.Constant(ir.VectorType(F32, 2), None), lse2[half],
                                                 ir.Constant(I32, 0)), deltas[-1], ir.Constant(I32, 1))
        in_scratch = b.icmp_unsigned("<", row, c(_padded_queries(spec)))
        with b.if_then(b.and_(in_scratch, b.icmp_unsigned("==", fl.quad, c(0)))):
            b.store(pair, _row_value_pair(ke, spec, batch, head, row), align=ROW_VALUES)
    return deltas


def _consume_dq(fl: Flash, plan: HopperFlashPlan, ring: _Ring, consumer: ir.Value, batch, head, kv_head, q0,
                n_tiles, masked_from) -> None:
    """A consumer warpgroup's 64 queries over every key tile: for tile j, dQ += dS_{j-1} K_{j-1}
    (dS's fragments from registers, K read MN-major), S_j = Q K_j^T and dP_j = dO V_j^T as one
    group of `wgmma`s; then P_j = exp(S_j scale - lse) (masked) and dS_j = P_j (dP_j - delta)
    on the CUDA cores. dQ is scaled by the softmax scale at the end."""
    b, spec, ke = fl.b, plan.spec, fl.ke
    c32, c64 = ring.c, fl.c
    own_rows = b.mul(consumer, c32(64 * ROW_BYTES))
    first_lane = b.icmp_unsigned("==", fl.lane, c64(0))
    rows = [b.add(q0, fl.row_of(2 * half)) for half in range(2)]
    first = b.mul(b.add(b.mul(batch, c64(spec.n)), head), c64(spec.t))
    lse2 = [b.fmul(fl.load_row_value(ke.in_ptrs[4], first, row, spec.t), fl.f(LOG2E)) for row in rows]
    deltas = _row_deltas(fl, batch, head, q0, lse2)
    scale = fl.f(spec.scale * LOG2E)
    n_q = spec.h // 2
    masks = spec.causal or spec.s % DQ_KEYS != 0

    def issue_products(s: ir.Value) -> list[ir.Value]:
        """Start S = Q K^T and dP = dO V^T on stage `s` (64 x 64 each)."""
        return [x for own, other in (("q", "k"), ("dout", "v"))
                for x in _times_transposed(b, plan, b.add(ring.own(own), own_rows), ring.tile(other, s), DQ_KEYS)]

    def issue_dq(fragments: list[ir.Value], dq: list[ir.Value], s: ir.Value) -> list[ir.Value]:
        """Start dQ += dS K on stage `s`."""
        return _times_rows(b, plan, fragments, dq, ring.tile("k", s), DQ_KEYS)

    def gradients(j: ir.Value, products: list[ir.Value], masked: bool) -> list[ir.Value]:
        """dS_j's A fragments from S_j and dP_j."""
        ds = []
        for i in range(DQ_KEYS // 2):
            f, r = divmod(i, 4)
            p = exp2_ftz(b, b.fsub(b.fmul(products[i], scale), lse2[r // 2]))
            if masked:
                key = b.add(b.mul(j, c64(DQ_KEYS)), fl.col_of(f, r))
                ok = fl.keep(rows[r // 2], key, key, spec.s, DQ_KEYS)
                p = p if ok is None else b.select(ok, p, fl.f(0.0))
            ds.append(b.fmul(p, b.fsub(products[DQ_KEYS // 2 + i], deltas[r // 2])))
        return _fragments(fl, ds)

    def wait_tile(j: ir.Value) -> ir.Value:
        s, parity = ring.position(j)
        for g in range(2):
            hp.wait_parity(b, ring.full(g, s), parity)
        return s

    def free(s: ir.Value) -> None:
        with b.if_then(first_lane):
            hp.arrive(b, ring.empty(s))

    hp.wait_parity(b, ring.own_full, c32(0))
    s0 = wait_tile(c64(0))
    hp.wgmma_fence(b)
    products = issue_products(s0)
    hp.wgmma_commit(b)
    hp.wgmma_wait(b, 0)
    fragments = gradients(c64(0), hp.hold(b, products), masks)

    def tile(j: ir.Value, values: list[ir.Value], masked: bool) -> list[ir.Value]:
        dq, fragments = values[:n_q], values[n_q:]
        s = wait_tile(j)
        before, _ = ring.position(b.sub(j, c64(1)))
        dq, fragments = _before_fence(b, dq, fragments)
        dq = issue_dq(fragments, dq, before)
        products = issue_products(s)
        hp.wgmma_commit(b)
        hp.wgmma_wait(b, 0)
        held = hp.hold(b, dq + products + fragments)
        free(before)
        return held[:n_q] + gradients(j, held[n_q:n_q + DQ_KEYS], masked)

    values = [fl.f(0.0)] * n_q + fragments
    if masks:
        values = loop(b, 1, masked_from, lambda b, j, v: tile(j, v, False), values, name="kv", vectorize=False,
                      unroll=1)
        after = b.select(b.icmp_unsigned("<", masked_from, c64(1)), c64(1), masked_from)
        values = loop(b, after, n_tiles, lambda b, j, v: tile(j, v, True), values, name="kv_masked",
                      vectorize=False, unroll=1)
    else:
        values = loop(b, 1, n_tiles, lambda b, j, v: tile(j, v, False), values, name="kv", vectorize=False,
                      unroll=1)
    dq, fragments = values[:n_q], values[n_q:]
    last, _ = ring.position(b.sub(n_tiles, c64(1)))
    dq, fragments = _before_fence(b, dq, fragments)
    dq = issue_dq(fragments, dq, last)
    hp.wgmma_commit(b)
    hp.wgmma_wait(b, 0)
    dq = hp.hold(b, dq + fragments)[:n_q]
    free(last)
    dq_rows = fl.rows_of(ke.out_ptrs[0], batch, head, spec.n, spec.t)
    fl.store_rows([dq[4 * e:4 * e + 4] for e in range(spec.h // 8)], dq_rows, q0, spec.t, fl.f(spec.scale))


def _key_block(fl: Flash) -> tuple[ir.Value, ...]:
    """(batch, kv head, first key, first query tile, query tiles per head, steps) of a dkv
    block: its 128 keys meet every query head of their group, a step per 64 queries, under the
    causal rule from the tile of the block's first key on (the first key tiles, which meet the
    most queries, start first)."""
    b, spec, c = fl.b, fl.spec, fl.c
    tiles_q = -(-spec.t // DKV_QUERIES)
    bid = fl.ke.block_index()
    ktile, pair = b.udiv(bid, c(spec.b * spec.kv)), b.urem(bid, c(spec.b * spec.kv))
    first_q = b.mul(ktile, c(BM // DKV_QUERIES)) if spec.causal else c(0)
    seen = b.icmp_unsigned("<", first_q, c(tiles_q))
    per_head = b.select(seen, b.sub(c(tiles_q), first_q), c(1))
    steps = b.select(seen, b.mul(per_head, c(spec.group)), c(0))  # (none: no query sees the keys)
    return b.udiv(pair, c(spec.kv)), b.urem(pair, c(spec.kv)), b.mul(ktile, c(BM)), first_q, per_head, steps


def _query_step(b: ir.IRBuilder, spec: Spec, kv_head: ir.Value, first_q: ir.Value, per_head: ir.Value, i: ir.Value
                ) -> tuple[ir.Value, ir.Value]:
    """(query head, first query) of a dkv block's step i."""
    head = b.add(b.mul(kv_head, ir.Constant(I64, spec.group)), b.udiv(i, per_head))
    return head, b.mul(b.add(first_q, b.urem(i, per_head)), ir.Constant(I64, DKV_QUERIES))


def _produce_dkv(ke: KernelEmitter, plan: HopperFlashPlan, ring: _Ring, batch, kv_head, k0, first_q, per_head,
                 steps) -> None:
    """The producer thread: the block's K and V, then each step's Q and dO, and its queries'
    row values (one bulk copy), into the next stage once the consumers have freed it."""
    b, spec = ke.b, plan.spec
    hp.arrive_expect_bytes(b, ring.own_full, 2 * plan.tile_bytes(BM))
    for name in ("k", "v"):
        _load_rows(ke, plan, name, BM, ring.own(name), ring.own_full, kv_head, k0, batch)

    def step(b: ir.IRBuilder, i: ir.Value, _: list) -> list:
        _free_stage(ring, i, plan.stages)
        s, _ = ring.position(i)
        full = ring.full(0, s)
        head, q_start = _query_step(b, spec, kv_head, first_q, per_head, i)
        hp.arrive_expect_bytes(b, full, 2 * plan.tile_bytes(DKV_QUERIES) + ring.row_value_bytes)
        for name in ("q", "dout"):
            _load_rows(ke, plan, name, DKV_QUERIES, ring.tile(name, s), full, head, q_start, batch)
        hp.bulk_load(b, ring.stage_row_values(s), _row_value_pair(ke, spec, batch, head, q_start),
                     ring.row_value_bytes, full)
        return []

    loop(b, 0, steps, step, [], name="produce", vectorize=False, unroll=1)


def _consume_dkv(fl: Flash, plan: HopperFlashPlan, ring: _Ring, consumer: ir.Value, batch, kv_head, k0, first_q,
                 per_head, n_steps) -> None:
    """A consumer warpgroup's 64 keys over every step: S^T = K Q^T and dP^T = V dO^T in one
    group of `wgmma`s, then P^T = exp(S^T scale - lse) (masked), dS^T = P^T (dP^T - delta)
    on the CUDA cores, then dV += P^T dO and dK += dS^T Q with P^T and dS^T as A fragments
    from registers, Q and dO read MN-major; dK scaled by the softmax scale at the end.

    Only a head's first steps (the causal diagonal: queries of the block's own 128) and its
    last (queries past T) mask; the others run without the comparisons."""
    b, spec, ke = fl.b, plan.spec, fl.ke
    c32, c64 = ring.c, fl.c
    own_rows = b.mul(consumer, c32(64 * ROW_BYTES))
    first_lane = b.icmp_unsigned("==", fl.lane, c64(0))
    keys = [b.add(k0, fl.row_of(2 * half)) for half in range(2)]
    n_o = spec.h // 2
    scale = fl.f(spec.scale * LOG2E)
    pair_type = ir.VectorType(F32, 2)

    def issue_transposed(own: str, s: ir.Value, other: str) -> list[ir.Value]:
        """Start (own rows) x (stage tile `other`)^T: 64 x 64."""
        return _times_transposed(b, plan, b.add(ring.own(own), own_rows), ring.tile(other, s), DKV_QUERIES)

    def issue_rows(fragments: list[ir.Value], acc: list[ir.Value], s: ir.Value, other: str) -> list[ir.Value]:
        """Start acc += (64 x 64 A fragments) x (stage tile `other`, its 64 rows the depth)."""
        return _times_rows(b, plan, fragments, acc, ring.tile(other, s), DKV_QUERIES)

    def row_values(s: ir.Value) -> dict[tuple[int, int], list[ir.Value]]:
        """(lse in log2 units, delta) of this thread's 16 queries of stage `s`, by (fragment, register)."""
        pairs = ring.pointer(ring.stage_row_values(s))
        out = {}
        for f in range(DKV_QUERIES // 8):
            for r in range(2):
                at = b.gep(pairs, [b.mul(fl.col_of(f, r), c64(ROW_VALUES))], inbounds=True, source_etype=ir.IntType(8))
                pair = b.load(at, typ=pair_type, align=ROW_VALUES)
                out[f, r] = [b.extract_element(pair, ir.Constant(I32, e)) for e in range(2)]
        return out

    def step(i: ir.Value, q_start: ir.Value, values: list[ir.Value], masked: bool) -> list[ir.Value]:
        dk, dv = values[:n_o], values[n_o:]
        s, parity = ring.position(i)
        hp.wait_parity(b, ring.full(0, s), parity)
        hp.wgmma_fence(b)
        st, dpt = issue_transposed("k", s, "q"), issue_transposed("v", s, "dout")
        hp.wgmma_commit(b)
        hp.wgmma_wait(b, 0)
        per_query = row_values(s)
        held = hp.hold(b, st + dpt)
        st, dpt = held[:DKV_QUERIES // 2], held[DKV_QUERIES // 2:]
        keep = _step_mask(fl, q_start, keys) if masked else None
        p, ds = [], []
        for f in range(DKV_QUERIES // 8):
            for r in range(4):
                lse2, delta = per_query[f, r % 2]
                x = exp2_ftz(b, b.fsub(b.fmul(st[4 * f + r], scale), lse2))
                if keep:
                    x = b.select(keep(f, r), x, fl.f(0.0))
                p.append(x)
                ds.append(b.fmul(x, b.fsub(dpt[4 * f + r], delta)))
        p_frags = _fragments(fl, p)
        held, frags = _before_fence(b, dk + dv, p_frags + _fragments(fl, ds))
        dv = issue_rows(frags[:len(p_frags)], held[n_o:], s, "dout")
        dk = issue_rows(frags[len(p_frags):], held[:n_o], s, "q")
        hp.wgmma_commit(b)
        hp.wgmma_wait(b, 0)
        held = hp.hold(b, dk + dv + frags)
        with b.if_then(first_lane):
            hp.arrive(b, ring.empty(s))
        return held[:2 * n_o]

    # a head's steps [0, plain_from) meet the diagonal, [plain_to, per_head) run past T
    diagonal = BM // DKV_QUERIES if spec.causal else 0
    plain_from = b.select(b.icmp_unsigned("<", per_head, c64(diagonal)), per_head, c64(diagonal))
    plain_to = b.sub(per_head, c64(1)) if spec.t % DKV_QUERIES else per_head
    plain_to = b.select(b.icmp_unsigned("<", plain_to, plain_from), plain_from, plain_to)

    def steps(g: ir.Value, lo: ir.Value, hi: ir.Value, values: list[ir.Value], masked: bool) -> list[ir.Value]:
        """Steps lo..hi of the group's g-th query head."""
        return loop(b, lo, hi, lambda b, n, v: step(b.add(b.mul(g, per_head), n),
                                                    b.mul(b.add(first_q, n), c64(DKV_QUERIES)), v, masked),
                    values, name="q_masked" if masked else "q", vectorize=False, unroll=1)

    def head_steps(b: ir.IRBuilder, g: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        """The steps of the group's g-th query head."""
        if diagonal:
            values = steps(g, c64(0), plain_from, values, True)
        values = steps(g, plain_from, plain_to, values, False)
        if spec.t % DKV_QUERIES:
            values = steps(g, plain_to, per_head, values, True)
        return values

    hp.wait_parity(b, ring.own_full, c32(0))
    values = loop(b, 0, b.udiv(n_steps, per_head), head_steps, [fl.f(0.0)] * (2 * n_o), name="head",
                  vectorize=False, unroll=1)
    dk_ptr, dv_ptr = ke.out_ptrs[1:3]
    for acc, ptr, factor in ((values[:n_o], dk_ptr, spec.scale), (values[n_o:], dv_ptr, 1.0)):
        rows = fl.rows_of(ptr, batch, kv_head, spec.kv, spec.s)
        fl.store_rows([acc[4 * e:4 * e + 4] for e in range(spec.h // 8)], rows, k0, spec.s, fl.f(factor))


def _step_mask(fl: Flash, q_start: ir.Value, keys: list[ir.Value]) -> Callable[[int, int], ir.Value]:
    """Whether a dkv step's (query, key) of register r of fragment f counts (Flash.keep's rule),
    as one compare each against a constant: a query is q_start + 2 quad + 8 f + r % 2, so
    key <= query and query < T hold where the per-thread bases below clear 8 f + r % 2."""
    b, spec = fl.b, fl.spec
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    first = b.trunc(b.add(q_start, b.mul(fl.quad, fl.c(2))), I32)      # the thread's first query
    ahead = [b.sub(first, b.trunc(key, I32)) for key in keys]           # query - key at f = r = 0

    def keep(f: int, r: int) -> ir.Value:
        column = 8 * f + r % 2
        ok = b.icmp_signed("<", first, c(spec.t - column)) if spec.t % DKV_QUERIES else None
        if spec.causal:
            before = b.icmp_signed(">=", ahead[r // 2], c(-column))
            ok = before if ok is None else b.and_(ok, before)
        return ok  # (a step masks only under the causal rule or where T is ragged: never None)
    return keep


def _fragments(fl: Flash, values: list[ir.Value]) -> list[ir.Value]:
    """16-bit A fragments of 64 x N values held as m64nN accumulators (4 a column group of 8):
    for each 16 columns, the four words mma.sync's m16n8k16 A fragment holds."""
    out = []
    for kk in range(len(values) // 8):
        lo, hi = values[8 * kk:8 * kk + 4], values[8 * kk + 4:8 * kk + 8]
        out += [fl.pack(lo[0], lo[1]), fl.pack(lo[2], lo[3]), fl.pack(hi[0], hi[1]), fl.pack(hi[2], hi[3])]
    return out


def _times_transposed(b: ir.IRBuilder, plan: HopperFlashPlan, own: ir.Value, tile: ir.Value, rows: int
                      ) -> list[ir.Value]:
    """Issue (64 own rows, at shared `own` in boxes of BM rows) x (a staged tile of `rows`
    rows at `tile`)^T over the head, K-major both: a fresh 64 x `rows` accumulator."""
    acc: list[ir.Value] | int = rows // 2
    for j in range(plan.spec.h // 16):
        box, step = divmod(j, ATOM // 16)
        a = hp.matrix_descriptor(b, b.add(own, _Ring.c(box * BM * ROW_BYTES + 32 * step)), 16, 8 * ROW_BYTES)
        t = hp.matrix_descriptor(b, b.add(tile, _Ring.c(box * rows * ROW_BYTES + 32 * step)), 16, 8 * ROW_BYTES)
        acc = hp.wgmma(b, f"m64n{rows}k16", plan.types, a, t, acc, (0, 0))
    return acc


def _times_rows(b: ir.IRBuilder, plan: HopperFlashPlan, fragments: list[ir.Value], acc: list[ir.Value],
                tile: ir.Value, rows: int) -> list[ir.Value]:
    """Issue acc += (64 x `rows` A fragments from registers) x (a staged tile of `rows` rows at
    `tile`, its rows the depth: MN-major, 16 rows (2 KiB) a step)."""
    for kk in range(rows // 16):
        t = hp.matrix_descriptor(b, b.add(tile, _Ring.c(16 * ROW_BYTES * kk)), rows * ROW_BYTES, 8 * ROW_BYTES)
        acc = hp.wgmma_from_registers(b, f"m64n{plan.spec.h}k16", plan.types, fragments[4 * kk:4 * kk + 4], t, acc, 1)
    return acc


def _before_fence(b: ir.IRBuilder, acc: list[ir.Value], fragments: list[ir.Value]
                  ) -> tuple[list[ir.Value], list[ir.Value]]:
    """`wgmma.fence` with the accumulators and the A fragments of the products it starts in
    their registers before it: a register that an instruction other than `wgmma` writes inside
    the stage (a rescaling of O or a rounding of P the compiler sinks to where their values are
    first used; a copy of loop-carried fragments) serialises every `wgmma`."""
    acc, fragments = hp.hold(b, acc), hp.copied(b, fragments)
    hp.wgmma_fence(b)
    return acc, fragments


def _masked(fl: Flash, s: list[list[ir.Value]], rows: list[ir.Value], j0: ir.Value) -> list[list[ir.Value]]:
    """The scores of the tile whose keys start at j0 with the logits that do not count (keys
    past S, or after the query under the causal rule) at -inf."""
    b, inf = fl.b, fl.f(float("-inf"))
    masked = []
    for f, regs in enumerate(s):
        keys = [b.add(j0, fl.col_of(f, r)) for r in range(4)]
        oks = [fl.keep(rows[r // 2], keys[r], keys[r], fl.spec.s, BN) for r in range(4)]
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


__all__ = ["HopperFlashPlan", "emit_hopper_flash", "hopper_flash_plan", "row_values_bytes"]
