"""FlashAttention on tensor cores (sm_80 on): the kernels the cuda backend runs an `attention`
equation as (one forward kernel) and an `attention_bwd` equation as (two kernels), none of
which ever holds the T x S scores outside registers. On sm_90a, flash_hopper.py's warpgroup
kernels take the place of these where they serve (16-bit heads of 64 and 128).

Served: q, k, v of one head size that is a multiple of 16 up to 128, in bfloat16 or float16,
or in float32 at a precision that lets the products round to TF32 (as jax.jit's do on the
GPU); either layout, grouped-query heads, causal or not, no bias and no mask operand (the
others run as the backend's attention policy says: glue/backend_cuda/__init__.py;
`why_not_flash` says why). A block of four warps takes 64 rows (each warp 16 of them, as
`mma.sync` fragments: m16n8k16 for 16 bits, m16n8k8 for TF32) and walks 64-row tiles of the
other operand through shared memory, copied by `cp.async` into two stages, so the next tile's
copies fly while this one multiplies; rows are padded by 16 bytes against bank conflicts.
Fragments load by `ldmatrix` (`.trans` where the operand's rows are the product's depth;
TF32's such fragments a word at a time, since `.trans` moves 16-bit elements); the TF32 A
fragments of the tile a block keeps (Q, dO; K, V) load at each use instead of staying in
registers, which would take twice as many as in 16 bits.

- forward (`part` "forward"): a block per 64 queries of one (batch, head); for each key tile
  S = Q K^T in registers, the online softmax (running row max and sum, in the log2 domain, the
  output rescaled as the max grows), then the probabilities, rounded to 16 bits, are the A
  fragments of P V straight from the accumulators (an m16n8 accumulator pair holds exactly an
  m16k16 A fragment). Causal blocks stop at the diagonal tile, and the latest query tiles,
  which read the most keys, start first. Writes the output and the row logsumexp.
- backward "dq": a block per 64 queries: delta = rowsum(dO * O) - d_lse for its rows (kept in
  the program's scratch for the second kernel), then per key tile P again from the saved
  logsumexp, dP = dO V^T, dS = P (dP - delta), and dQ += dS K.
- backward "dkv": a block per 64 keys of one kv head, over the query tiles of every query head
  of its group (causal: from the diagonal on): S^T = K Q^T, P^T, dV += P^T dO,
  dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
dQ and dK are scaled by the softmax scale at the end. Everything accumulates in float32.
"""
from __future__ import annotations

import math
from typing import Callable

from llvmlite import ir

from glue.backend_cuda.codegen.common import WARP, KernelEmitter
from glue.backend_cuda.codegen.fastmath import exp2_ftz, log2_ftz, pack_bf16x2
from glue.backend_cuda.codegen.mma import FORMATS, async_call, cp_async, ldmatrix_x4, mma_sync, to_tf32
from glue.codegen.loops import loop
from glue.codegen.types import F16, F32, I32, I64, from_memory, memory_type
from glue.ir import Eqn, Var
from glue.ir import dtypes as dt
from glue.ir.primitives import attention_dims
from glue.scheduler.attention import Spec

ROWS = 64                # a block's rows, and the rows of each tile it walks
WARPS = ROWS // 16       # each warp 16 rows (one m16 fragment)
THREADS = WARPS * WARP
LOG2E = 1.4426950408889634
PARTS = {"attention": ("forward",), "attention_bwd": ("dq", "dkv")}
STAGES = {"forward": 5, "dq": 6, "dkv": 6}  # staged tiles: the block's own, and two stages of two
FORMAT_OF = {dt.bfloat16: "bf16", dt.float16: "f16", dt.float32: "tf32"}


def shared_limit(sm: int) -> int:
    """Dynamic shared memory a block may opt in to on an sm_`sm` GPU."""
    if sm in (90, 100):
        return 227 << 10
    return 163 << 10 if sm in (80, 87) else 99 << 10


def _pitch(spec: Spec) -> int:
    """Elements of a staged row: the head and 16 bytes of padding (a 16-byte chunk)."""
    return spec.h + FORMATS[FORMAT_OF[spec.dtype]].chunk


def shared_bytes(spec: Spec, part: str) -> int:
    """A part's staged tiles, then the float32 row values (lse and delta of two stages; or
    delta) after them."""
    element = FORMATS[FORMAT_OF[spec.dtype]].element.width // 8
    return STAGES[part] * ROWS * _pitch(spec) * element + 4 * ROWS * (4 if part == "dkv" else 1)


def flash_spec(eqn: Eqn) -> Spec:
    """The dimensions and params of the attention a flash kernel computes."""
    return Spec.of(*(a.type for a in eqn.inputs[:3]), eqn.param_dict)


def _grid(spec: Spec, part: str) -> int:
    """Blocks of a part: one per 64 queries of a (batch, head), or per 64 keys of a kv head."""
    rows = spec.s if part == "dkv" else spec.t
    heads = spec.kv if part == "dkv" else spec.n
    return spec.b * heads * -(-rows // ROWS)


def why_not_flash(eqn: Eqn, sm: int) -> str | None:
    """Why the flash kernels do not serve `eqn` on an sm_`sm` GPU (None: they do)."""
    p = eqn.param_dict
    q, k, v = (a.type for a in eqn.inputs[:3])
    if sm < 80:
        return f"tensor cores need sm_80, not sm_{sm}"
    if q.dtype not in FORMAT_OF:
        return f"the flash kernels take bfloat16, float16 or float32, not {q.dtype}"
    if q.dtype == dt.float32 and p.get("precision", "highest") == "highest":
        return 'float32 at precision "highest" needs exact products; the flash kernels round float32 to TF32'
    if p["has_bias"] or p["has_mask"]:
        return "the flash kernels take no bias or mask operand (only the causal rule)"
    _, _, _, h, _, _, hv = attention_dims(q, k, v, p["layout"])
    if h != hv or h % 16 or not 16 <= h <= 128:
        return f"the flash kernels take one head size, a multiple of 16 up to 128, not {h} and {hv}"
    if not all(isinstance(a, Var) for a in eqn.inputs):
        return "an operand is a literal"
    spec = flash_spec(eqn)
    need = max(shared_bytes(spec, part) for part in PARTS[eqn.primitive])
    if need > shared_limit(sm):
        return f"its tiles take {need} bytes of shared memory, more than sm_{sm}'s {shared_limit(sm)}"
    return None


def flash_note(eqn: Eqn) -> str:
    """The "fusion" stage's line for an equation the flash kernels run."""
    spec = flash_spec(eqn)
    kernels = "one flash kernel" if eqn.primitive == "attention" else "two flash kernels (dq; dk, dv)"
    return (f"{eqn.primitive} (B={spec.b} N={spec.n} T={spec.t} S={spec.s} H={spec.h}"
            f"{' causal' if spec.causal else ''}) runs as {kernels}, {ROWS} x {ROWS} tiles on tensor cores, "
            f"no {spec.t} x {spec.s} buffer")


class Flash:
    """What the three kernels share: indices, staged tiles, fragments, packing."""

    def __init__(self, ke: KernelEmitter, spec: Spec, tid: ir.Value | None = None):
        """`tid`: the thread's index among the warps that hold the block's rows (its index in
        the block unless given), warp w holding rows 16 w.. of them."""
        self.ke, self.spec, self.b = ke, spec, ke.b
        self.fmt = FORMATS[FORMAT_OF[spec.dtype]]
        self.tf32 = self.fmt.name == "tf32"
        self.element = self.fmt.element  # of staged tiles and of the operands' rows: I16, or I32
        self.pitch = _pitch(spec)
        self.tile = ROWS * self.pitch  # elements of one staged tile
        self.tid = ke.thread_index() if tid is None else tid
        self.lane, self.warp = self.b.urem(self.tid, self.c(WARP)), self.b.udiv(self.tid, self.c(WARP))
        self.group, self.quad = self.b.udiv(self.lane, self.c(4)), self.b.urem(self.lane, self.c(4))

    @staticmethod
    def c(value: int) -> ir.Constant:
        return ir.Constant(I64, value)

    @staticmethod
    def f(value: float) -> ir.Constant:
        return ir.Constant(F32, value)

    # --- memory ------------------------------------------------------------------------------
    def rows_of(self, ptr: ir.Value, batch: ir.Value, head: ir.Value, heads: int, length: int):
        """(base pointer, row stride) of one (batch, head)'s rows of a q/k/v-shaped operand."""
        b, h = self.b, self.spec.h
        if self.spec.layout == "BTNH":
            first, stride = b.add(b.mul(b.mul(batch, self.c(length)), self.c(heads)), head), heads * h
            first = b.mul(first, self.c(h))
        else:
            first, stride = b.mul(b.mul(b.add(b.mul(batch, self.c(heads)), head), self.c(length)), self.c(h)), h
        return b.gep(ptr, [first], inbounds=True, source_etype=self.element), stride

    def copy_tile(self, rows: tuple, row0: ir.Value, length: int, target: ir.Value) -> None:
        """Start copying rows row0.. row0 + ROWS - 1 (zeros past `length`) into `target`."""
        b, h = self.b, self.spec.h
        base, stride = rows
        per_row = h // self.fmt.chunk
        for i in range(ROWS * per_row // THREADS):
            chunk = b.add(self.tid, self.c(i * THREADS))
            row, col = b.udiv(chunk, self.c(per_row)), b.mul(b.urem(chunk, self.c(per_row)), self.c(self.fmt.chunk))
            at = b.add(row0, row)
            ok = b.icmp_unsigned("<", at, self.c(length))
            source = b.gep(base, [b.add(b.mul(b.select(ok, at, self.c(0)), self.c(stride)), col)], inbounds=True,
                           source_etype=self.element)
            slot = b.add(b.mul(row, self.c(self.pitch)), col)
            cp_async(self.ke, self.at(target, slot), source,
                     b.select(ok, ir.Constant(I32, 16), ir.Constant(I32, 0)))

    def commit(self) -> None:
        async_call(self.ke, "llvm.nvvm.cp.async.commit.group")

    def landed(self) -> None:
        """Every copy issued so far is in shared memory, everyone's, and every warp is past the
        previous step (whose stage the next copies refill)."""
        async_call(self.ke, "llvm.nvvm.cp.async.wait.group", 0)
        self.ke.barrier()

    def at(self, stage: ir.Value, offset: ir.Value) -> ir.Value:
        return self.ke.shared_at(stage, offset, self.element)

    def word(self, tile: ir.Value, row: ir.Value, col: ir.Value) -> ir.Value:
        """The staged float32 at (row, col) of a tile as a TF32 operand, rounded to nearest: as
        it lies, the tensor cores would read only its top 19 bits, and dropping the rest
        shrinks every product toward zero (a bias a training loss shows)."""
        value = self.b.load(self.at(tile, self.b.add(self.b.mul(row, self.c(self.pitch)), col)), typ=F32)
        return to_tf32(self.ke, value)

    def matrices(self, tile: ir.Value, row: ir.Value, col: ir.Value) -> list[ir.Value]:
        """`ldmatrix` x4 from (row, col) of a tile (this lane's row address), as TF32 operands
        rounded to nearest (`word`)."""
        words = ldmatrix_x4(self.ke, self.at(tile, self.b.add(self.b.mul(row, self.c(self.pitch)), col)), False)
        return [to_tf32(self.ke, self.b.bitcast(w, F32)) for w in words]

    # --- fragments ---------------------------------------------------------------------------
    def a_fragments(self, tile: ir.Value) -> list[list[ir.Value]] | ir.Value:
        """This warp's 16 rows of a staged tile as A fragments, one per 16 columns; for TF32
        the tile itself, whose fragments `times_rows` loads where it uses them."""
        if self.tf32:
            return tile
        b, l = self.b, self.lane
        row = b.add(b.mul(self.warp, self.c(16)), b.urem(l, self.c(16)))
        out = []
        for ks in range(self.spec.h // 16):
            col = b.add(self.c(16 * ks), b.mul(b.udiv(l, self.c(16)), self.c(8)))
            out.append(ldmatrix_x4(self.ke, self.at(tile, b.add(b.mul(row, self.c(self.pitch)), col)), False))
        return out

    def times_rows(self, a: list[list[ir.Value]] | ir.Value, tile: ir.Value) -> list[list[ir.Value]]:
        """A (16 x H, as `a_fragments`) times the staged tile's 64 rows transposed: 16 x 64, as
        eight m16n8 accumulators (the tile's rows are B's columns, its columns the depth)."""
        b, l = self.b, self.lane
        acc = [[self.f(0.0)] * 4 for _ in range(ROWS // 8)]
        if self.tf32:
            return self._times_rows_tf32(a, tile, acc)
        for ks in range(self.spec.h // 16):
            for fp in range(0, ROWS // 8, 2):
                row = b.add(self.c(8 * fp), b.add(b.urem(l, self.c(8)), b.mul(b.udiv(l, self.c(16)), self.c(8))))
                col = b.add(self.c(16 * ks), b.mul(b.urem(b.udiv(l, self.c(8)), self.c(2)), self.c(8)))
                regs = ldmatrix_x4(self.ke, self.at(tile, b.add(b.mul(row, self.c(self.pitch)), col)), False)
                acc[fp] = mma_sync(self.ke, self.fmt, a[ks], regs[0:2], acc[fp])
                acc[fp + 1] = mma_sync(self.ke, self.fmt, a[ks], regs[2:4], acc[fp + 1])
        return acc

    def _times_rows_tf32(self, a_tile: ir.Value, tile: ir.Value, acc: list[list[ir.Value]]) -> list[list[ir.Value]]:
        """`times_rows` on m16n8k8. An 8 x 8 matrix of 16-bit elements that `ldmatrix` moves
        is 8 rows of 4 float32 words, lane l getting word l % 4 of row l / 4: the TF32
        fragment of A's a0 (row group, depth quad) and of B's b0 (column group, depth quad)
        alike, so both operands load as 16-bit ones do, four matrices an instruction: A's
        rows 0-7 and 8-15 at depths 0-3 and 4-7; B's depths 0-3 and 4-7 of two 8-key groups."""
        b, l = self.b, self.lane
        a_row = b.add(b.mul(self.warp, self.c(16)), b.urem(l, self.c(16)))
        key = b.add(b.urem(l, self.c(8)), b.mul(b.udiv(l, self.c(16)), self.c(8)))
        for ks in range(self.spec.h // 8):
            a = self.matrices(a_tile, a_row, b.add(self.c(8 * ks), b.mul(b.udiv(l, self.c(16)), self.c(4))))
            depth = b.add(self.c(8 * ks), b.mul(b.urem(b.udiv(l, self.c(8)), self.c(2)), self.c(4)))
            for f in range(0, ROWS // 8, 2):
                regs = self.matrices(tile, b.add(self.c(8 * f), key), depth)
                acc[f] = mma_sync(self.ke, self.fmt, a, regs[0:2], acc[f])
                acc[f + 1] = mma_sync(self.ke, self.fmt, a, regs[2:4], acc[f + 1])
        return acc

    def times_tile(self, p: list[list[ir.Value]], tile: ir.Value, acc: list[list[ir.Value]]) -> list[list[ir.Value]]:
        """acc (16 x H, as H/8 accumulators) + P (16 x 64 accumulators, as `times_rows` gives)
        times the staged tile (64 rows, the depth, by H)."""
        b, l = self.b, self.lane
        acc = list(acc)
        if self.tf32:
            return self._times_tile_tf32(p, tile, acc)
        for kk in range(ROWS // 16):
            a = [self.pack(p[2 * kk][0], p[2 * kk][1]), self.pack(p[2 * kk][2], p[2 * kk][3]),
                 self.pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), self.pack(p[2 * kk + 1][2], p[2 * kk + 1][3])]
            row = b.add(self.c(16 * kk), b.add(b.urem(l, self.c(8)), b.mul(b.urem(b.udiv(l, self.c(8)), self.c(2)),
                                                                                self.c(8))))
            for e in range(0, self.spec.h // 8, 2):
                col = b.add(self.c(8 * e), b.mul(b.udiv(l, self.c(16)), self.c(8)))
                regs = ldmatrix_x4(self.ke, self.at(tile, b.add(b.mul(row, self.c(self.pitch)), col)), True)
                acc[e] = mma_sync(self.ke, self.fmt, a, regs[0:2], acc[e])
                acc[e + 1] = mma_sync(self.ke, self.fmt, a, regs[2:4], acc[e + 1])
        return acc

    def _times_tile_tf32(self, p: list[list[ir.Value]], tile: ir.Value,
                         acc: list[list[ir.Value]]) -> list[list[ir.Value]]:
        """`times_tile` on m16n8k8, each accumulator fragment of P (8 keys) an A fragment as it
        stands: A's depth index quad is taken for key 2 quad and quad + 4 for key 2 quad + 1,
        the two keys the lane holds (a sum does not mind the order of its terms), and B's rows
        are read in the same order."""
        b = self.b
        for kk in range(ROWS // 8):
            regs = p[kk]
            a = [to_tf32(self.ke, regs[r]) for r in (0, 2, 1, 3)]
            key = b.add(self.c(8 * kk), b.mul(self.quad, self.c(2)))
            for e in range(self.spec.h // 8):
                col = b.add(self.c(8 * e), self.group)
                pair = [self.word(tile, b.add(key, self.c(r)), col) for r in range(2)]
                acc[e] = mma_sync(self.ke, self.fmt, a, pair, acc[e])
        return acc

    def pack(self, low: ir.Value, high: ir.Value) -> ir.Value:
        """Two floats rounded to the 16-bit type, in one 32-bit word (`low` in the low half)."""
        b = self.b
        if self.fmt.name == "bf16":
            return pack_bf16x2(b, low, high)
        pair = ir.Constant(ir.VectorType(F16, 2), None)
        pair = b.insert_element(pair, b.fptrunc(low, F16), ir.Constant(I32, 0))
        pair = b.insert_element(pair, b.fptrunc(high, F16), ir.Constant(I32, 1))
        return b.bitcast(pair, I32)

    def row_of(self, r: int) -> ir.Value:
        """Of this warp's 16 rows, the one accumulator register r (0..3) of this lane is in."""
        return self.b.add(self.b.mul(self.warp, self.c(16)), self.b.add(self.group, self.c(8 * (r // 2))))

    def col_of(self, frag: int, r: int) -> ir.Value:
        """The column of accumulator register r of m16n8 fragment `frag`."""
        return self.b.add(self.c(8 * frag + r % 2), self.b.mul(self.quad, self.c(2)))

    def quad_sum(self, value: ir.Value) -> ir.Value:
        """Summed over the four lanes that hold one row."""
        for mask in (1, 2):
            value = self.b.fadd(value, self.ke.shuffle_xor(value, mask))
        return value

    def quad_max(self, value: ir.Value) -> ir.Value:
        for mask in (1, 2):
            other = self.ke.shuffle_xor(value, mask)
            value = self.b.select(self.b.fcmp_ordered(">", other, value), other, value)
        return value

    def keep(self, query: ir.Value, key: ir.Value, walked: ir.Value, length: int, tile: int = ROWS
             ) -> ir.Value | None:
        """Whether the logit of (query, key) counts: `walked` (the query or the key, whichever
        the kernel walks in tiles of `tile`, which may run past its `length`) inside `length`,
        and under the causal rule key <= query (None: always)."""
        b = self.b
        ok = b.icmp_unsigned("<", walked, self.c(length)) if length % tile else None
        if self.spec.causal:
            before = b.icmp_unsigned("<=", key, query)
            ok = before if ok is None else b.and_(ok, before)
        return ok

    def store_rows(self, acc: list[list[ir.Value]], rows: tuple, row0: ir.Value, length: int,
                   factor: ir.Value | list[ir.Value]) -> None:
        """Store 16 x H accumulators (times `factor`, one per register pair's row, or one for
        all) as this warp's rows row0 + ... of an operand, those inside `length`."""
        b = self.b
        base, stride = rows
        for half in range(2):
            row = b.add(row0, self.row_of(2 * half))
            scale = factor[half] if isinstance(factor, list) else factor
            with b.if_then(b.icmp_unsigned("<", row, self.c(length))):
                for e, regs in enumerate(acc):
                    low, high = b.fmul(regs[2 * half], scale), b.fmul(regs[2 * half + 1], scale)
                    at = b.gep(base, [b.add(b.mul(row, self.c(stride)), self.col_of(e, 0))], inbounds=True,
                               source_etype=self.element)
                    if self.tf32:
                        pair = b.insert_element(ir.Constant(ir.VectorType(F32, 2), None), low, ir.Constant(I32, 0))
                        b.store(b.insert_element(pair, high, ir.Constant(I32, 1)), at, align=8)
                    else:
                        b.store(self.pack(low, high), at, align=4)

    def load_row_value(self, ptr: ir.Value, first: ir.Value, row: ir.Value, length: int) -> ir.Value:
        """A float32 per row (lse, delta, d_lse) at ptr[first + row], 0 past `length`."""
        b = self.b
        ok = b.icmp_unsigned("<", row, self.c(length))
        got = b.load(b.gep(ptr, [b.add(first, b.select(ok, row, self.c(0)))], inbounds=True, source_etype=F32), typ=F32)
        return b.select(ok, got, self.f(0.0))


def emit_flash(ke: KernelEmitter, spec: Spec, part: str) -> tuple[int, int, str]:
    """Emit one flash kernel (`part`: forward | dq | dkv); its grid, block and strategy."""
    fl = Flash(ke, spec)
    stages = STAGES[part]
    smem = ke.dynamic_shared(shared_bytes(spec, part))
    tiles = [fl.at(smem, fl.c(i * fl.tile)) for i in range(stages)]
    floats = fl.at(smem, fl.c(stages * fl.tile))  # float32 row values after the tiles
    {"forward": _forward, "dq": _dq, "dkv": _dkv}[part](fl, tiles, floats)
    ke.b.ret_void()
    return _grid(spec, part), THREADS, f"flash {part} {fl.fmt.name} {ROWS}x{ROWS} h{spec.h}{' causal' if spec.causal else ''}"


def query_block(fl: Flash, rows: int = ROWS) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value]:
    """(batch, head, kv head, first query, key tiles to read) of a block of `rows` queries
    walking key tiles of as many rows; under the causal rule the latest query tiles (the most
    keys) come first."""
    b, spec, c = fl.b, fl.spec, fl.c
    tiles_q, tiles_k = -(-spec.t // rows), -(-spec.s // rows)
    bid = fl.ke.block_index()
    pair = b.urem(bid, c(spec.b * spec.n))
    tile = b.sub(c(tiles_q - 1), b.udiv(bid, c(spec.b * spec.n)))
    batch, head = b.udiv(pair, c(spec.n)), b.urem(pair, c(spec.n))
    n_tiles = c(tiles_k)
    if spec.causal:
        plus = b.add(tile, c(1))
        n_tiles = b.select(b.icmp_unsigned("<", plus, n_tiles), plus, n_tiles)
    return batch, head, b.udiv(head, c(spec.group)), b.mul(tile, c(rows)), n_tiles


def _key_tiles(fl: Flash, n_tiles: ir.Value, kv_rows: list[tuple], kv_tiles: list[ir.Value],
               carried: list[ir.Value], step: Callable) -> list[ir.Value]:
    """Walk the key tiles, two stages of K and V (tiles 2..5 of `kv_tiles`), the first already
    copied: `step(j, k_tile, v_tile, carried)` gives the carried values' next ones."""
    b, c = fl.b, fl.c

    def body(b: ir.IRBuilder, j: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        fl.landed()
        following = b.add(j, c(1))
        stage = b.urem(j, c(2))
        with b.if_then(b.icmp_unsigned("<", following, n_tiles)):
            ahead = b.sub(c(1), stage)
            for rows, pair in zip(kv_rows, (kv_tiles[0:2], kv_tiles[2:4])):
                fl.copy_tile(rows, b.mul(following, c(ROWS)), fl.spec.s,
                             _staged(fl, pair, ahead))
            fl.commit()
        k_tile, v_tile = _staged(fl, kv_tiles[0:2], stage), _staged(fl, kv_tiles[2:4], stage)
        return step(j, k_tile, v_tile, values)

    return loop(b, 0, n_tiles, body, carried, name="kv", vectorize=False, unroll=1)


def _staged(fl: Flash, pair: list[ir.Value], stage: ir.Value) -> ir.Value:
    """Stage `stage` (0 or 1, at run time) of a double-buffered tile."""
    return fl.b.select(fl.b.icmp_unsigned("==", stage, fl.c(0)), pair[0], pair[1])


def _forward(fl: Flash, tiles: list[ir.Value], floats: ir.Value) -> None:
    ke, b, spec, c = fl.ke, fl.b, fl.spec, fl.c
    q_ptr, k_ptr, v_ptr = ke.in_ptrs[:3]
    batch, head, kv_head, q0, n_tiles = query_block(fl)
    q_rows = fl.rows_of(q_ptr, batch, head, spec.n, spec.t)
    kv_rows = [fl.rows_of(p, batch, kv_head, spec.kv, spec.s) for p in (k_ptr, v_ptr)]
    ke.await_producers()
    fl.copy_tile(q_rows, q0, spec.t, tiles[0])
    for rows, tile in zip(kv_rows, (tiles[1], tiles[3])):
        fl.copy_tile(rows, c(0), spec.s, tile)
    fl.commit()
    fl.landed()
    qf = fl.a_fragments(tiles[0])
    scale = spec.scale * LOG2E
    rows = [b.add(q0, fl.row_of(2 * half)) for half in range(2)]
    inf = fl.f(-math.inf)
    n_out = spec.h // 8

    def step(j: ir.Value, k_tile: ir.Value, v_tile: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        m_old, l_old, o = values[0:2], values[2:4], [values[4 + 4 * e:8 + 4 * e] for e in range(n_out)]
        s = fl.times_rows(qf, k_tile)
        j0 = b.mul(j, c(ROWS))
        for f, regs in enumerate(s):
            for r in range(4):
                x = b.fmul(regs[r], fl.f(scale))
                key = b.add(j0, fl.col_of(f, r))
                ok = fl.keep(rows[r // 2], key, key, spec.s)
                regs[r] = x if ok is None else b.select(ok, x, inf)
        p, m_new, l_new, alpha = softmax_step(fl, s, m_old, l_old, 1.0)
        o = [[b.fmul(regs[r], alpha[r // 2]) for r in range(4)] for regs in o]
        o = fl.times_tile(p, v_tile, o)
        return m_new + l_new + [x for regs in o for x in regs]

    start = [inf, inf, fl.f(0.0), fl.f(0.0)] + [fl.f(0.0)] * (4 * n_out)
    values = _key_tiles(fl, n_tiles, kv_rows, tiles[1:5], start, step)
    store_forward(fl, [values[4 + 4 * e:8 + 4 * e] for e in range(n_out)], values[0:2], values[2:4], batch, head, q0)


def softmax_step(fl: Flash, s: list[list[ir.Value]], m_old: list[ir.Value], l_old: list[ir.Value], factor: float
                 ) -> tuple[list[list[ir.Value]], list[ir.Value], list[ir.Value], list[ir.Value]]:
    """One key tile of the online softmax over this thread's two rows. `s`: the tile's logits
    as m16n8 accumulators (masked ones -inf), which `factor` (> 0) takes to log2 units; m: the
    rows' running max in those units, l: this thread's part of their running sums. Gives the
    probabilities exp2(factor s - m), the new m and l, and alpha = exp2(m_old - m), by which
    what was summed so far shrinks."""
    b = fl.b
    inf = fl.f(-math.inf)
    m_new, usable, alpha = [], [], []
    for half in range(2):
        values = [regs[r] for regs in s for r in (2 * half, 2 * half + 1)]
        while len(values) > 1:  # a tree, not a chain: its compares issue side by side
            pairs = zip(values[0::2], values[1::2])
            values = [b.select(b.fcmp_ordered(">", x, y), x, y) for x, y in pairs] + values[len(values) // 2 * 2:]
        tile_max = b.fmul(fl.quad_max(values[0]), fl.f(factor))
        m = b.select(b.fcmp_ordered(">", tile_max, m_old[half]), tile_max, m_old[half])
        usable.append(b.select(b.fcmp_ordered("==", m, inf), fl.f(0.0), m))  # a row with nothing yet
        m_new.append(m)
        alpha.append(exp2_ftz(b, b.fsub(m_old[half], usable[half])))
    sums = [fl.f(0.0), fl.f(0.0)]
    p = []
    for regs in s:
        p.append([exp2_ftz(b, b.fsub(b.fmul(regs[r], fl.f(factor)), usable[r // 2])) for r in range(4)])
        for r in range(4):
            sums[r // 2] = b.fadd(sums[r // 2], p[-1][r])
    l_new = [b.fadd(b.fmul(l_old[h], alpha[h]), sums[h]) for h in range(2)]
    return p, m_new, l_new, alpha


def store_forward(fl: Flash, o: list[list[ir.Value]], m: list[ir.Value], l_parts: list[ir.Value],
                  batch: ir.Value, head: ir.Value, q0: ir.Value) -> None:
    """The forward's results for this thread's rows: O / l (16 x H accumulators, as
    `times_tile` gives) and the logsumexp (m in log2 units, l this thread's part of the sum)."""
    b, spec, c = fl.b, fl.spec, fl.c
    out_ptr, lse_ptr = fl.ke.out_ptrs
    l = [fl.quad_sum(x) for x in l_parts]
    one = fl.f(1.0)
    fl.store_rows(o, fl.rows_of(out_ptr, batch, head, spec.n, spec.t), q0, spec.t, [b.fdiv(one, x) for x in l])
    first = b.mul(b.add(b.mul(batch, c(spec.n)), head), c(spec.t))
    for half in range(2):
        row = b.add(q0, fl.row_of(2 * half))
        lse = b.fmul(b.fadd(m[half], log2_ftz(b, l[half])), fl.f(1 / LOG2E))
        with b.if_then(b.and_(b.icmp_unsigned("==", fl.quad, c(0)), b.icmp_unsigned("<", row, c(spec.t)))):
            b.store(lse, b.gep(lse_ptr, [b.add(first, row)], inbounds=True, source_etype=F32))


def _softmax_grad(fl: Flash, s: list[list[ir.Value]], dp: list[list[ir.Value]], lse2: Callable, delta: Callable,
                  keep: Callable) -> tuple[list[list[ir.Value]], list[list[ir.Value]]]:
    """P = exp2(S scale log2(e) - lse log2(e)) where the logit counts (else 0), and
    dS = P (dP - delta), register by register; `lse2`, `delta`, `keep` of (fragment, register)."""
    b = fl.b
    scale = fl.f(fl.spec.scale * LOG2E)
    p_out, ds_out = [], []
    for f, (s_regs, dp_regs) in enumerate(zip(s, dp)):
        p_regs, ds_regs = [], []
        for r in range(4):
            p = exp2_ftz(fl.b, b.fsub(b.fmul(s_regs[r], scale), lse2(f, r)))
            ok = keep(f, r)
            if ok is not None:
                p = b.select(ok, p, fl.f(0.0))
            p_regs.append(p)
            ds_regs.append(b.fmul(p, b.fsub(dp_regs[r], delta(f, r))))
        p_out.append(p_regs)
        ds_out.append(ds_regs)
    return p_out, ds_out


def _dq(fl: Flash, tiles: list[ir.Value], floats: ir.Value) -> None:
    ke, b, spec, c = fl.ke, fl.b, fl.spec, fl.c
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, dout_ptr, dlse_ptr = ke.in_ptrs[:7]
    dq_ptr, (delta_ptr,) = ke.out_ptrs[0], ke.extra_ptrs
    batch, head, kv_head, q0, n_tiles = query_block(fl)
    q_rows, do_rows = (fl.rows_of(p, batch, head, spec.n, spec.t) for p in (q_ptr, dout_ptr))
    kv_rows = [fl.rows_of(p, batch, kv_head, spec.kv, spec.s) for p in (k_ptr, v_ptr)]
    first = b.mul(b.add(b.mul(batch, c(spec.n)), head), c(spec.t))
    ke.await_producers()
    fl.copy_tile(q_rows, q0, spec.t, tiles[0])
    fl.copy_tile(do_rows, q0, spec.t, tiles[5])
    for rows, tile in zip(kv_rows, (tiles[1], tiles[3])):
        fl.copy_tile(rows, c(0), spec.s, tile)
    fl.commit()
    # delta = rowsum(dO * O) - d_lse: two threads a row, half the head each
    row = b.udiv(fl.tid, c(2))
    at = b.add(q0, row)
    ok = b.icmp_unsigned("<", at, c(spec.t))
    o_base, o_stride = fl.rows_of(out_ptr, batch, head, spec.n, spec.t)
    do_base, _ = do_rows
    offset = b.add(b.mul(b.select(ok, at, c(0)), c(o_stride)), b.mul(b.urem(fl.tid, c(2)), c(spec.h // 2)))
    total = fl.f(0.0)
    for d in range(spec.h // 2):
        where = b.add(offset, c(d))
        o, do = (from_memory(b, b.load(b.gep(base, [where], inbounds=True, source_etype=fl.element),
                                       typ=memory_type(spec.dtype)), spec.dtype) for base in (o_base, do_base))
        total = b.fadd(total, b.fmul(o, do))
    total = b.fadd(total, ke.shuffle_xor(total, 1))
    delta = b.fsub(total, fl.load_row_value(dlse_ptr, first, at, spec.t))
    with b.if_then(b.icmp_unsigned("==", b.urem(fl.tid, c(2)), c(0))):
        b.store(delta, b.gep(floats, [row], inbounds=True, source_etype=F32))
        with b.if_then(ok):
            b.store(delta, b.gep(delta_ptr, [b.add(first, at)], inbounds=True, source_etype=F32))
    fl.landed()
    qf, dof = fl.a_fragments(tiles[0]), fl.a_fragments(tiles[5])
    mine = [fl.row_of(2 * half) for half in range(2)]
    rows = [b.add(q0, r) for r in mine]
    lse2 = [b.fmul(fl.load_row_value(lse_ptr, first, r, spec.t), fl.f(LOG2E)) for r in rows]
    deltas = [b.load(b.gep(floats, [r], inbounds=True, source_etype=F32), typ=F32) for r in mine]
    n_out = spec.h // 8

    def step(j: ir.Value, k_tile: ir.Value, v_tile: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        acc = [values[4 * e:4 * e + 4] for e in range(n_out)]
        j0 = b.mul(j, c(ROWS))
        s, dp = fl.times_rows(qf, k_tile), fl.times_rows(dof, v_tile)

        def keep(f: int, r: int) -> ir.Value | None:
            key = b.add(j0, fl.col_of(f, r))
            return fl.keep(rows[r // 2], key, key, spec.s)

        _, ds = _softmax_grad(fl, s, dp, lambda f, r: lse2[r // 2], lambda f, r: deltas[r // 2], keep)
        acc = fl.times_tile(ds, k_tile, acc)
        return [x for regs in acc for x in regs]

    values = _key_tiles(fl, n_tiles, kv_rows, tiles[1:5], [fl.f(0.0)] * (4 * n_out), step)
    acc = [values[4 * e:4 * e + 4] for e in range(n_out)]
    fl.store_rows(acc, fl.rows_of(dq_ptr, batch, head, spec.n, spec.t), q0, spec.t, fl.f(spec.scale))


def _dkv(fl: Flash, tiles: list[ir.Value], floats: ir.Value) -> None:
    ke, b, spec, c = fl.ke, fl.b, fl.spec, fl.c
    q_ptr, k_ptr, v_ptr, _, lse_ptr, dout_ptr, _ = ke.in_ptrs[:7]
    dk_ptr, dv_ptr = ke.out_ptrs[1:3]
    (delta_ptr,) = ke.extra_ptrs
    tiles_q = -(-spec.t // ROWS)
    bid = ke.block_index()
    ktile = b.udiv(bid, c(spec.b * spec.kv))  # the first key tiles see the most queries (causal)
    pair = b.urem(bid, c(spec.b * spec.kv))
    batch, kv_head = b.udiv(pair, c(spec.kv)), b.urem(pair, c(spec.kv))
    k0 = b.mul(ktile, c(ROWS))
    kv_rows = [fl.rows_of(p, batch, kv_head, spec.kv, spec.s) for p in (k_ptr, v_ptr)]
    first_q = ktile if spec.causal else c(0)  # causal: no query before the key tile sees it
    seen = b.icmp_unsigned("<", first_q, c(tiles_q))
    per_head = b.select(seen, b.sub(c(tiles_q), first_q), c(1))  # (1 where no query sees the keys)
    total = b.select(seen, b.mul(per_head, c(spec.group)), c(0))

    def fetch(it: ir.Value, stage: ir.Value) -> None:
        """Copy step `it`'s query tile (Q, dO) and its rows' lse and delta into `stage`."""
        head = b.add(b.mul(kv_head, c(spec.group)), b.udiv(it, per_head))
        q_start = b.mul(b.add(first_q, b.urem(it, per_head)), c(ROWS))
        for p, pair_of in ((q_ptr, tiles[2:4]), (dout_ptr, tiles[4:6])):
            fl.copy_tile(fl.rows_of(p, batch, head, spec.n, spec.t), q_start, spec.t, _staged(fl, pair_of, stage))
        # thread i < 64 copies the lse of the tile's row i, thread 64 + i its delta, a float each
        # (a row's floats need not start 16-byte aligned), so that no warp waits on them
        first = b.mul(b.add(b.mul(batch, c(spec.n)), head), c(spec.t))
        at = b.add(q_start, b.urem(fl.tid, c(ROWS)))
        ok = b.icmp_unsigned("<", at, c(spec.t))
        source = b.select(b.icmp_unsigned("<", fl.tid, c(ROWS)), lse_ptr, delta_ptr)
        source = b.gep(source, [b.add(first, b.select(ok, at, c(0)))], inbounds=True, source_etype=F32)
        cp_async(ke, b.gep(floats, [b.add(b.mul(stage, c(2 * ROWS)), fl.tid)], inbounds=True, source_etype=F32),
                 source, b.select(ok, ir.Constant(I32, 4), ir.Constant(I32, 0)), size=4)

    ke.await_producers()
    for rows, tile in zip(kv_rows, tiles[0:2]):
        fl.copy_tile(rows, k0, spec.s, tile)
    fetch(c(0), c(0))
    fl.commit()
    fl.landed()
    kf, vf = fl.a_fragments(tiles[0]), fl.a_fragments(tiles[1])
    keys = [b.add(k0, fl.row_of(2 * half)) for half in range(2)]
    n_out = spec.h // 8

    def body(b: ir.IRBuilder, it: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
        fl.landed()
        following = b.add(it, c(1))
        stage = b.urem(it, c(2))
        with b.if_then(b.icmp_unsigned("<", following, total)):
            fetch(following, b.sub(c(1), stage))
            fl.commit()
        q_tile, do_tile = _staged(fl, tiles[2:4], stage), _staged(fl, tiles[4:6], stage)
        lse_at = b.gep(floats, [b.mul(stage, c(2 * ROWS))], inbounds=True, source_etype=F32)  # the stage's rows
        delta_at = b.gep(lse_at, [c(ROWS)], inbounds=True, source_etype=F32)
        q_start = b.mul(b.add(first_q, b.urem(it, per_head)), c(ROWS))
        dk, dv = [values[4 * e:4 * e + 4] for e in range(n_out)], [values[4 * (n_out + e):4 * (n_out + e) + 4]
                                                                    for e in range(n_out)]

        def column(array: ir.Value) -> Callable:
            return lambda f, r: b.load(b.gep(array, [fl.col_of(f, r)], inbounds=True, source_etype=F32), typ=F32)

        def keep(f: int, r: int) -> ir.Value | None:
            query = b.add(q_start, fl.col_of(f, r))
            return fl.keep(query, keys[r // 2], query, spec.t)

        st, dpt = fl.times_rows(kf, q_tile), fl.times_rows(vf, do_tile)
        lse = column(lse_at)
        pt, dst = _softmax_grad(fl, st, dpt, lambda f, r: b.fmul(lse(f, r), fl.f(LOG2E)), column(delta_at), keep)
        dv = fl.times_tile(pt, do_tile, dv)
        dk = fl.times_tile(dst, q_tile, dk)
        return [x for regs in dk + dv for x in regs]

    values = loop(b, 0, total, body, [fl.f(0.0)] * (8 * n_out), name="q", vectorize=False, unroll=1)
    dk = [values[4 * e:4 * e + 4] for e in range(n_out)]
    dv = [values[4 * (n_out + e):4 * (n_out + e) + 4] for e in range(n_out)]
    fl.store_rows(dk, fl.rows_of(dk_ptr, batch, kv_head, spec.kv, spec.s), k0, spec.s, fl.f(spec.scale))
    fl.store_rows(dv, fl.rows_of(dv_ptr, batch, kv_head, spec.kv, spec.s), k0, spec.s, fl.f(1.0))


__all__ = ["PARTS", "emit_flash", "flash_note", "flash_spec", "why_not_flash"]
