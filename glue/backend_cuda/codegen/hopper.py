"""sm_90a's asynchronous machinery as inline PTX: mbarriers, TMA tile loads and bulk copies,
`wgmma` (A from shared memory or from registers), the shared-memory matrix descriptors `wgmma`
reads its operands through, and the warp-specialized block (a producer warpgroup, consumer
warpgroups) the warpgroup kernels (wgmma.py, flash_hopper.py) are built on.

LLVM 22 has intrinsics for some of these, not for `wgmma.mma_async` itself; writing all of them
as inline PTX keeps one spelling, the PTX ISA's, for the whole mainloop. Shared addresses are
the 32-bit offsets these instructions take (`shared_u32`).

A TMA load is described by a `TensorMap`: which kernel parameter's buffer it reads, and the
tensor's dims, strides and box as `cuTensorMapEncodeTiled` takes them. The kernel receives the
encoded map by value, a 128-byte `.param` it never copies (`nvvm.grid_constant`); the executor
encodes it from the buffer's address when it fills the launch's parameters
(`runtime/tensor_map.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from glue.backend_cuda.codegen.common import WARP, KernelEmitter, inline_asm
from glue.codegen.types import F32, I32, I64

SWIZZLE_BYTES = 128  # TMA writes and wgmma reads 128-byte rows, 16-byte chunks XORed by row % 8
SWIZZLE_ATOM = 8 * SWIZZLE_BYTES  # the 8 rows one swizzle pattern spans: tiles start aligned to it
WARPGROUP = 4 * WARP
CONSUMERS = 2             # consumer warpgroups of a warp-specialized block, after one producer
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 24, 240  # 128 x 24 + 256 x 240 <= 64K registers
LAUNCH_REGISTERS = 168    # a thread's at launch: 65536 / 384, rounded down to 8


@dataclass(frozen=True)
class TensorMap:
    """A tiled TMA view of one kernel parameter's buffer: `dims` (innermost first, elements),
    `strides` (bytes, of dims 1 on), `box` (the elements one load brings), from `offset` bytes
    past the parameter's address; `dtype` is the element's name ("bf16", "f16", "f32", or
    "tf32": float32 rounded to TF32 as it loads)."""

    param: int
    offset: int
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]


def shared_u32(b: ir.IRBuilder, pointer: ir.Value) -> ir.Value:
    """A shared-memory pointer as the 32-bit address PTX's shared instructions take."""
    return b.trunc(b.ptrtoint(pointer, I64), I32)


def mbarrier_init(b: ir.IRBuilder, barrier: ir.Value, arrivals: int) -> None:
    inline_asm(b, f"mbarrier.init.shared::cta.b64 [$0], {arrivals};", "r,~{memory}", [barrier])


def fence_barrier_init(b: ir.IRBuilder) -> None:
    """Make initialised barriers visible to the async proxy (TMA) before anyone uses them."""
    inline_asm(b, "fence.mbarrier_init.release.cluster;", "~{memory}", [])


def arrive_expect_bytes(b: ir.IRBuilder, barrier: ir.Value, nbytes: int) -> None:
    """Arrive on `barrier` and tell it `nbytes` more are coming from TMA loads."""
    inline_asm(b, f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {nbytes};", "r,~{memory}", [barrier])


def arrive(b: ir.IRBuilder, barrier: ir.Value) -> None:
    inline_asm(b, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", [barrier])


def wait_parity(b: ir.IRBuilder, barrier: ir.Value, parity: ir.Value) -> None:
    """Spin until the barrier's phase of `parity` (0 or 1, an i32) has completed."""
    test = ("{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; "
            "selp.u32 $0, 1, 0, done; }")
    fn = b.function
    spin, after = fn.append_basic_block("wait.spin"), fn.append_basic_block("wait.done")
    b.branch(spin)
    b.position_at_end(spin)
    done = inline_asm(b, test, "=r,r,r,~{memory}", [barrier, parity], I32)
    b.cbranch(b.icmp_unsigned("!=", done, ir.Constant(I32, 0)), after, spin)
    b.position_at_end(after)


def wait_for_count(b: ir.IRBuilder, counter: ir.Value, count: int) -> None:
    """Spin until the global i32 `counter` reads `count`, each read acquiring (at GPU scope)
    what the writers released before they counted."""
    fn = b.function
    spin, after = fn.append_basic_block("count.spin"), fn.append_basic_block("count.done")
    b.branch(spin)
    b.position_at_end(spin)
    seen = inline_asm(b, "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", [b.ptrtoint(counter, I64)], I32)
    b.cbranch(b.icmp_unsigned("==", seen, ir.Constant(I32, count)), after, spin)
    b.position_at_end(after)


def load_unless(b: ir.IRBuilder, address: ir.Value, keep: ir.Value, value: ir.Value) -> ir.Value:
    """`value` (an f32) where `keep` (an i1), else the global f32 at `address`, read by a
    predicated load: no branch, and nothing read where it is kept."""
    text = "{ .reg .pred keep; setp.ne.u32 keep, $2, 0; mov.b32 $0, $3; @!keep ld.global.f32 $0, [$1]; }"
    return inline_asm(b, text, "=f,l,r,f", [b.ptrtoint(address, I64), b.zext(keep, I32), value], F32)


def tma_load(b: ir.IRBuilder, target: ir.Value, tensor_map: ir.Value, coords: list[ir.Value],
             barrier: ir.Value) -> None:
    """Start a TMA load of the box at `coords` (i32, innermost first) of `tensor_map` (its
    parameter's generic address) into shared `target`, completing bytes on `barrier`."""
    rank = len(coords)
    places = ", ".join(f"${i + 2}" for i in range(rank))
    text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
            f"[$0], [$1, {{{places}}}], [${rank + 2}];")
    inline_asm(b, text, "r,l," + "r," * rank + "r,~{memory}", [target, b.ptrtoint(tensor_map, I64), *coords, barrier])


def bulk_load(b: ir.IRBuilder, target: ir.Value, source: ir.Value, nbytes: int, barrier: ir.Value) -> None:
    """Start a TMA copy of `nbytes` contiguous bytes (a multiple of 16) from global `source`
    (16-byte aligned) into shared `target`, completing bytes on `barrier`."""
    text = f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], {nbytes}, [$2];"
    inline_asm(b, text, "r,l,r,~{memory}", [target, b.ptrtoint(source, I64), barrier])


def prefetch_tensor_map(b: ir.IRBuilder, tensor_map: ir.Value) -> None:
    """Start fetching a TMA descriptor (its parameter's generic address) into the descriptor
    cache, so that the first load through it does not wait for the fetch."""
    inline_asm(b, "prefetch.tensormap [$0];", "l,~{memory}", [b.ptrtoint(tensor_map, I64)])


def set_max_registers(b: ir.IRBuilder, count: int, grow: bool) -> None:
    """Hand registers to the block's other warpgroups (`grow` False) or take them (True)."""
    inline_asm(b, f"setmaxnreg.{'inc' if grow else 'dec'}.sync.aligned.u32 {count};", "~{memory}", [])


def warp_specialized(ke: KernelEmitter, init_barriers: Callable[[], None], produce: Callable[[], None],
                     consume: Callable[[ir.Value], None]) -> None:
    """A block of a producer warpgroup and CONSUMERS consumer warpgroups: thread 0 initialises
    the mbarriers (`init_barriers`) and everyone waits for that and for the grids the kernel
    depends on; then thread 0 of warpgroup 0 runs `produce` with its warpgroup's registers
    given up, and the other warpgroups `consume(consumer)` (0, 1, ...) with them.

    Every thread starts with LAUNCH_REGISTERS (`.maxnreg`): the launch sizes the block's pool of
    registers by that count, a `setmaxnreg.inc` asking for more than the pool holds traps (an
    illegal instruction), and ptxas applies `setmaxnreg` only where it knows the count at entry."""
    b = ke.b
    c32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    ke.max_registers = LAUNCH_REGISTERS
    tid = b.trunc(ke.thread_index(), I32)
    warpgroup = b.udiv(tid, c32(WARPGROUP))
    with b.if_then(b.icmp_unsigned("==", tid, c32(0))):
        init_barriers()
        fence_barrier_init(b)
    ke.barrier()
    ke.await_producers()
    with b.if_else(b.icmp_unsigned("==", warpgroup, c32(0))) as (producer, consumer):
        with producer:
            set_max_registers(b, PRODUCER_REGISTERS, grow=False)
            with b.if_then(b.icmp_unsigned("==", tid, c32(0))):
                produce()
        with consumer:
            set_max_registers(b, CONSUMER_REGISTERS, grow=True)
            consume(b.sub(warpgroup, c32(1)))


def wgmma_fence(b: ir.IRBuilder) -> None:
    inline_asm(b, "wgmma.fence.sync.aligned;", "~{memory}", [])


def wgmma_commit(b: ir.IRBuilder) -> None:
    inline_asm(b, "wgmma.commit_group.sync.aligned;", "~{memory}", [])


def wgmma_wait(b: ir.IRBuilder, pending: int) -> None:
    """Wait until at most `pending` committed wgmma groups of this warpgroup are in flight."""
    inline_asm(b, f"wgmma.wait_group.sync.aligned {pending};", "~{memory}", [])


def matrix_descriptor(b: ir.IRBuilder, start: ir.Value, leading: int, stride: int) -> ir.Value:
    """The 64-bit descriptor of a 128-byte-swizzled operand tile at shared address `start` (i32):
    `leading` and `stride` are its byte offsets between core-matrix groups (see wgmma.py)."""
    address = b.and_(b.lshr(b.zext(start, I64), ir.Constant(I64, 4)), ir.Constant(I64, 0x3FFF))
    fixed = ((leading >> 4) << 16) | ((stride >> 4) << 32) | (1 << 62)
    return b.or_(address, ir.Constant(I64, fixed))


def wgmma(b: ir.IRBuilder, shape: str, types: str, a_desc: ir.Value, b_desc: ir.Value, acc: list[ir.Value] | int,
          transpose: tuple[int, int] | None) -> list[ir.Value]:
    """One `wgmma.mma_async` (`shape` e.g. m64n256k16, `types` e.g. f32.bf16.bf16) adding A x B
    into the float32 accumulators `acc`, or, given their count, into fresh ones (scale-d 0:
    nothing read, so no register is zeroed inside the pipeline stage, which would serialise
    it); `transpose` the MN-major flags of A and B (16-bit types only; None for tf32, which is
    K-major only). Returns the accumulators it will hold once the group completes (`wgmma_wait`)."""
    fresh = isinstance(acc, int)
    n = acc if fresh else len(acc)
    inputs = [] if fresh else list(acc)
    regs = ", ".join(f"${i}" for i in range(n))
    flags = "1, 1" + ("" if transpose is None else f", {transpose[0]}, {transpose[1]}")
    first = n + len(inputs)  # the descriptors' operand numbers: after the outputs and any tied inputs
    text = (f"wgmma.mma_async.sync.aligned.{shape}.{types} {{{regs}}}, ${first}, ${first + 1}, "
            f"{0 if fresh else 1}, {flags};")
    constraints = ",".join(["=f"] * n + [str(i) for i in range(len(inputs))] + ["l", "l"])
    asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([F32] * n), [F32] * len(inputs) + [I64, I64]), text,
                       constraints, side_effect=True)
    got = b.call(asm, [*inputs, a_desc, b_desc])
    return [b.extract_value(got, i) for i in range(n)]


def wgmma_from_registers(b: ir.IRBuilder, shape: str, types: str, a_regs: list[ir.Value], b_desc: ir.Value,
                         acc: list[ir.Value], transpose_b: int) -> list[ir.Value]:
    """`wgmma` with A in registers: four 32-bit words a thread holds of the warpgroup's 64 x 16
    A fragment (as `mma.sync`'s m16n8k16 A fragment, warp w holding rows 16 w..), so that
    values computed in registers (attention's probabilities) multiply without a trip through
    shared memory; B from its descriptor (`transpose_b`: MN-major)."""
    n = len(acc)
    regs = ", ".join(f"${i}" for i in range(n))
    a = ", ".join(f"${2 * n + i}" for i in range(4))  # (after the outputs and the tied accumulators)
    text = (f"wgmma.mma_async.sync.aligned.{shape}.{types} {{{regs}}}, {{{a}}}, ${2 * n + 4}, 1, 1, 1, {transpose_b};")
    constraints = ",".join(["=f"] * n + [str(i) for i in range(n)] + ["r"] * 4 + ["l"])
    asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([F32] * n), [F32] * n + [I32] * 4 + [I64]), text,
                       constraints, side_effect=True)
    got = b.call(asm, [*acc, *a_regs, b_desc])
    return [b.extract_value(got, i) for i in range(n)]


def hold(b: ir.IRBuilder, values: list[ir.Value]) -> list[ir.Value]:
    """The same values, passed through an empty instruction ordered with the other inline PTX:
    after a `wgmma_wait`, reading the accumulators (or reusing A's registers) through `hold`
    keeps the compiler from moving that work above the wait, which no data dependency orders."""
    if not values:
        return []
    n = len(values)
    code = {"float": "f", "i32": "r"}
    constraints = ",".join([f"={code[str(v.type)]}" for v in values] + [str(i) for i in range(n)])
    asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([v.type for v in values]), [v.type for v in values]),
                       "", constraints, side_effect=True)
    got = b.call(asm, values)
    return [b.extract_value(got, i) for i in range(n)]


def copied(b: ir.IRBuilder, values: list[ir.Value]) -> list[ir.Value]:
    """32-bit values moved into fresh registers here (ordered with the other inline PTX): A
    fragments a `wgmma` reads made before its `wgmma_fence`, where the compiler would otherwise
    copy loop-carried ones just before the `wgmma`, inside the stage (which serialises it)."""
    n = len(values)
    text = " ".join(f"mov.b32 ${i}, ${n + i};" for i in range(n))
    asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([I32] * n), [I32] * n), text,
                       ",".join(["=r"] * n + ["r"] * n), side_effect=True)
    got = b.call(asm, values)
    return [b.extract_value(got, i) for i in range(n)]


__all__ = ["SWIZZLE_ATOM", "SWIZZLE_BYTES", "TensorMap", "arrive", "arrive_expect_bytes", "bulk_load", "copied",
           "fence_barrier_init", "hold", "matrix_descriptor", "mbarrier_init", "set_max_registers", "shared_u32",
           "tma_load", "wait_parity", "warp_specialized", "wgmma", "wgmma_commit", "wgmma_fence",
           "wgmma_from_registers", "wgmma_wait"]
