"""What every NVPTX kernel is built from: the kernel function and its buffer parameters, thread
and block indices, shared memory, barriers, warp shuffles, block-wide reductions, and groups of
lanes that load and store 16 bytes at a time.

A kernel gets one `ptr addrspace(1)` parameter per distinct buffer location it touches (an
output written in place over an input is one parameter), each `noalias` and 16-byte aligned:
every buffer comes from the caching allocator or the arena, both 256-byte aligned. Where a value
lives is a `Place`; the executor turns places into device addresses at each call.

Vector access: a `LaneGroup` evaluates one expression at `width` domain points that differ only
in the vector dim `v` (lanes 0..width-1). Loads and stores whose flat offset moves by exactly one
element per lane, with every other term a multiple of `width`, become one vector access of the
whole group (16 bytes for f32 x4 or bf16 x8); every other access stays per lane. bfloat16 moves
as 32-bit pairs: a shift or a mask widens each half, and on sm_80 and later one
`cvt.rn.bf16x2.f32` rounds and packs two results.

Dependent launch (sm_90 on): before its first access to memory another kernel may write, every
kernel runs `griddepcontrol.wait` (wait until the grids this one depends on have finished and
their writes are visible) and then `griddepcontrol.launch_dependents` (let the next kernel of
the stream be scheduled now). A kernel launched with programmatic stream serialization (see the
executor) is then placed on the multiprocessors while its predecessor still runs, so its launch
latency, and any loads of constant inputs issued before the wait (a contraction's weights),
overlap that kernel's work; launched without it, the wait does nothing.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from llvmlite import ir

from glue.backend_cuda.codegen.fastmath import GpuEmitter, pack_bf16x2
from glue.backend_cuda.ptx import DEFAULT_ARCH, sm_number
from glue.codegen import reductions
from glue.codegen.buffers import BufferAccess
from glue.codegen.expr import ExprEmitter, convert
from glue.codegen.loops import unflatten
from glue.ir.core import strides
from glue.codegen.scope import Analysis, hoist
from glue.codegen.types import F32, I1, I8, I16, I32, I64, from_memory, memory_type, to_memory
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import (Dim, Div, Expr, Index, Kernel, Load, Mod, Reduction, Store, loads_under,
                                      subexpressions)

PTR0 = ir.PointerType()
PTR1 = ir.PointerType(addrspace=1)
PTR3 = ir.PointerType(addrspace=3)
PTR7 = ir.PointerType(addrspace=7)  # another block's shared memory in the cluster (`shared::cluster`)
VOID = ir.VoidType()
WARP = 32
SEQUENTIAL_WARPS = 8  # warps' partials a thread folds one by one (two 16-byte shared loads of floats)
VECTOR_BYTES = 16
MAX_LANES = 8
TENSOR_MAP_ARG = "tensor_map"  # a TMA descriptor parameter's name, numbered: `.param .align 64 .b8 [128]`


@dataclass(frozen=True)
class Place:
    """Where a kernel operand's memory starts: kind is argument | output | arena | scratch |
    counters; `slot` is the argument or output position (for scratch: the stream whose scratch
    region it is; counters are one zeroed region per program); `offset` is in bytes."""

    kind: str
    slot: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a program: a 1-d grid of `grid` blocks of `block` threads, one pointer
    argument per place in `params`; `copy` = (destination, source, bytes) is copied first."""

    symbol: str
    kernel: Kernel
    grid: int
    block: int
    params: tuple[Place, ...]
    strategy: str
    copy: tuple[Place, Place, int] | None = None
    dependent: bool = False   # waits for its producers itself: may launch before they finish
    min_blocks: int = 0       # blocks that must fit on a multiprocessor (0: no floor)
    group: int = -1           # the plan kernel this launch computes (a kernel may take several)
    variant: str = "codegen"  # "codegen", "library" or "library kmajor": one of a contraction's runs
    library: Any = None       # for a library launch: what it computes (codegen.LibraryGemm)
    call: Any = None          # for a call kernel: its plan (glue.scheduler.calls.CallPlan); the
                              # params are its inputs' places, then its outputs'
    shared_bytes: int = 0     # dynamic shared memory the kernel is launched with
    tensor_maps: tuple = ()   # TMA descriptors (hopper.TensorMap) passed after the pointers

    @property
    def name(self) -> str:
        return self.symbol

    @property
    def kind(self) -> str:
        return self.kernel.kind


def flat_index(index: Sequence[Index], shape: Sequence[int]) -> Index:
    """The element offset of `index` in a row-major buffer of `shape`, as an index expression."""
    flat = Index()
    for i, s in zip(index, strides(shape)):
        flat = flat + i * s
    return flat


def moves_with(flat: Index, v: int, analysis: Analysis) -> bool:
    """Whether `flat` advances by exactly one element per step of domain dim `v`, with `v`
    nowhere else in it (not inside a division, clamp or data-dependent index)."""
    if dict(flat.terms).get(Dim(v)) != 1:
        return False
    return all(atom == Dim(v) or v not in analysis.index_uses(Index.of(atom)).dims for atom, _ in flat.terms)


def moves_in_runs(flat: Index, v: int, n: int, analysis: Analysis) -> bool:
    """Whether `flat` advances by exactly one element per step of domain dim `v` over every
    run of `n` steps that starts at a multiple of n (`moves_with` is every n). A reshape that
    splits `v`'s dim reads it as `v % m` and `v // m`, which over such runs move by one or stay
    put where n divides m and the index's other terms: a warp reading the 32 points of a run
    reads consecutive memory, though a vector may not span two runs."""
    movers = 0
    for atom, coeff in flat.terms:
        if atom == Dim(v) or isinstance(atom, Mod) and _splits(atom, v, n, analysis):
            movers += 1
            if coeff != 1:
                return False
        elif not _steady(atom, v, n, analysis):
            return False
    return movers == 1


def _splits(atom: Div | Mod, v: int, n: int, analysis: Analysis) -> bool:
    """Whether `atom` divides `v` plus terms that stay put over the runs and are multiples of
    n, by a multiple of n: its dividend then moves by one within a block of the divisor."""
    inner = atom.index
    if atom.divisor % n or inner.const % n or dict(inner.terms).get(Dim(v)) != 1:
        return False
    return all(c % n == 0 and _steady(a, v, n, analysis) for a, c in inner.terms if a != Dim(v))


def _steady(atom: Any, v: int, n: int, analysis: Analysis) -> bool:
    """Whether `atom` keeps its value over every run of n steps of `v` from a multiple of n."""
    if v not in analysis.index_uses(Index.of(atom)).dims:
        return True
    if isinstance(atom, Div) and _splits(atom, v, n, analysis):
        return True
    return isinstance(atom, (Div, Mod)) and Dim(v) not in dict(atom.index.terms) and \
        all(_steady(a, v, n, analysis) for a, _ in atom.index.terms)


def aligned_to(flat: Index, v: int, width: int, analysis: Analysis) -> bool:
    """Whether every part of `flat` other than what moves with dim `v` (itself, or its split
    by a multiple of `width`: see `moves_in_runs`) is a multiple of `width` elements."""
    return flat.const % width == 0 and all(
        c % width == 0 for atom, c in flat.terms
        if atom != Dim(v) and not (isinstance(atom, Mod) and _splits(atom, v, width, analysis)))


def when(b: ir.IRBuilder, condition: ir.Value | None):
    """`b.if_then(condition)`, or no branch at all when the condition is None (always true)."""
    return contextlib.nullcontext() if condition is None else b.if_then(condition)


def inline_asm(b: ir.IRBuilder, text: str, constraints: str, args: list[ir.Value], result: ir.Type = VOID) -> ir.Value:
    """Call inline PTX `text` on `args` (it has side effects: LLVM neither drops nor moves it)."""
    asm = ir.InlineAsm(ir.FunctionType(result, [a.type for a in args]), text, constraints, side_effect=True)
    return b.call(asm, args)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


class KernelEmitter(BufferAccess):
    """One kernel function being emitted into a module."""

    def __init__(self, module: ir.Module, kernel: Kernel, symbol: str, inputs: Sequence[Place],
                 outputs: Sequence[Place], arch: str = DEFAULT_ARCH, written: frozenset[Place] = frozenset(),
                 extra: Sequence[Place] = (), aligned: bool = True, tensor_maps: int = 0):
        """`written`: every place some kernel of the program writes; the program's arguments
        outside it hold the same values from the call's start to its end. `extra`: places of
        the kernel's own working memory (scratch, counters), after its operands (`extra_ptrs`).
        `aligned` False: an operand may start at any element, so nothing moves 16 bytes at once.
        `tensor_maps`: TMA descriptors it takes by value after its pointers (`map_args`, see
        hopper.py)."""
        self.aligned = aligned
        self.module = module
        self.arch = arch
        self.constant_inputs = frozenset(i for i, p in enumerate(inputs) if p.kind == "argument" and p not in written)
        self.awaited = False
        self.min_blocks = 0  # set by an emitter that wants a floor on resident blocks
        # set by an emitter whose warpgroups trade registers (`setmaxnreg`): they come from the
        # block's pool, which the launch sizes by this count, and ptxas applies `setmaxnreg`
        # only where it knows the count at entry
        self.max_registers = 0
        self.dynamic_shared_bytes = 0  # set by `dynamic_shared`: launched with that much
        self.cluster = 0  # set by an emitter whose blocks meet in clusters of this many (sm_90 on)
        self.kernel = kernel
        self.symbol = symbol
        self.places = tuple(dict.fromkeys(list(inputs) + list(outputs) + list(extra)))
        params = [PTR1] * len(self.places) + [PTR0] * tensor_maps
        self.fn = ir.Function(module, ir.FunctionType(VOID, params), symbol)
        self.fn.calling_convention = "ptx_kernel"
        for arg in self.fn.args[:len(self.places)]:
            arg.add_attribute("noalias")
            if aligned:
                arg.attributes.align = VECTOR_BYTES
        self.map_args = self.fn.args[len(self.places):]
        for i, arg in enumerate(self.map_args):
            arg.name = f"{TENSOR_MAP_ARG}{i}"
        self.in_ptrs = [self.fn.args[self.places.index(p)] for p in inputs]
        self.out_ptrs = [self.fn.args[self.places.index(p)] for p in outputs]
        self.extra_ptrs = [self.fn.args[self.places.index(p)] for p in extra]
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.shapes = [buf.type.shape for buf in kernel.inputs]
        self.analysis = Analysis()
        self._shared = 0

    # --- indices -----------------------------------------------------------------------------
    def sreg(self, name: str) -> ir.Value:
        full = f"llvm.nvvm.read.ptx.sreg.{name}"
        fn = self.module.globals.get(full) or ir.Function(self.module, ir.FunctionType(I32, []), full)
        return self.b.zext(self.b.call(fn, []), I64)

    def thread_index(self) -> ir.Value:
        return self.sreg("tid.x")

    def block_index(self) -> ir.Value:
        return self.sreg("ctaid.x")

    # --- memory ------------------------------------------------------------------------------
    def emitter(self, dims: Sequence[ir.Value | None], outer: ExprEmitter | None = None) -> GpuEmitter:
        em = GpuEmitter(self.b, dims, self.shapes, self.load)
        em.analysis = self.analysis
        em.packs_bf16 = self.packs_bf16
        if outer is not None:
            em.memo = dict(outer.memo)
            em.rows = outer.rows
        return em

    def store(self, em: GpuEmitter, store: Store) -> None:
        """A plain (mode "set") store of one point."""
        dtype = self.kernel.outputs[store.output].type.dtype
        value = convert(self.b, em.stored(store.value, dtype), store.value.dtype, dtype)
        if dtype == dt.bfloat16 and self.packs_bf16:  # one `cvt` rounds, not the integer form's seven
            bits = self.b.trunc(pack_bf16x2(self.b, value, value), memory_type(dtype))
        else:
            bits = to_memory(self.b, value, dtype)
        self.b.store(bits, self.output_address(em, store))

    def store_all(self, em: GpuEmitter, stores: Sequence[Store]) -> None:
        """Plain stores of one point, every value computed before the first store: an output
        written in place over an input shares its parameter, so a value computed after an
        earlier store would read that store back (a fused AdamW writes the new moment where
        the old second moment was, and then reads the second moment)."""
        for s in stores:
            em.stored(s.value, self.kernel.outputs[s.output].type.dtype)
        for s in stores:
            self.store(em, s)

    def shared(self, ty: ir.Type, count: int) -> ir.Value:
        """A fresh shared-memory array of `count` elements of `ty`."""
        array = ir.ArrayType(ty, max(count, 1))
        g = ir.GlobalVariable(self.module, array, f"{self.symbol}_smem{self._shared}", addrspace=3)
        self._shared += 1
        g.linkage = "internal"
        g.initializer = ir.Constant(array, ir.Undefined)
        g.align = VECTOR_BYTES
        # llvmlite types globals with typed pointers; as an opaque `ptr addrspace(3)` GEPs on it
        # take an element type and print as LLVM 22 expects.
        g.type = PTR3
        return g

    def dynamic_shared(self, nbytes: int) -> ir.Value:
        """The kernel's dynamic shared memory, `nbytes` of it (more than the 48 KiB static
        shared memory may hold; the launch asks for it)."""
        g = ir.GlobalVariable(self.module, ir.ArrayType(I8, 0), f"{self.symbol}_dynamic_smem", addrspace=3)
        g.linkage = "external"
        g.align = VECTOR_BYTES
        g.type = PTR3
        self.dynamic_shared_bytes = nbytes
        return g

    def shared_at(self, array: ir.Value, index: ir.Value, ty: ir.Type) -> ir.Value:
        return self.b.gep(array, [index], inbounds=True, source_etype=ty)

    @property
    def sm(self) -> int:
        """The target's compute capability as a number (sm_90a -> 90)."""
        return sm_number(self.arch)

    @property
    def packs_bf16(self) -> bool:
        """Whether the target rounds two floats to bfloat16 in one instruction (sm_80 on)."""
        return self.sm >= 80

    def await_producers(self) -> None:
        """On sm_90 and later, wait for the grids this kernel depends on and then release the
        stream's next kernel (see the module docstring). Emitters call it before touching any
        memory but constant inputs; a kernel that never does is launched plainly."""
        if self.sm < 90:
            return
        inline_asm(self.b, "griddepcontrol.wait; griddepcontrol.launch_dependents;", "~{memory}", [])
        self.awaited = True

    def reads_only_constants(self, expr: Expr) -> bool:
        """Whether every load under `expr` reads a constant input (an argument no kernel of the
        program writes), so it may be issued before `await_producers`."""
        return all(ld.input in self.constant_inputs for ld in loads_under([expr]))

    def prefetch_l2(self, address: ir.Value) -> None:
        """Start moving the line holding `address` into L2, without waiting or using a register."""
        inline_asm(self.b, "prefetch.global.L2 [$0];", "l", [address])

    def fence_gpu(self) -> None:
        """Order this thread's memory accesses, and those a barrier of its block ordered before
        it, against what follows, at GPU scope (release and acquire): what a block writes
        before counting itself in on a counter, and reads after finding the count complete."""
        inline_asm(self.b, "fence.acq_rel.gpu;", "~{memory}", [])

    def cluster_barrier(self) -> None:
        """Wait for every thread of the block's cluster (`cluster` blocks, the emitter's to set).
        The arrival is relaxed: it orders no memory (a release would wait for every global store
        in flight, MEMBAR.GPU), so what blocks exchange goes through `send` and an mbarrier."""
        inline_asm(self.b, "barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned;", "~{memory}", [])

    def in_cluster_block(self, address: ir.Value, rank: ir.Value) -> ir.Value:
        """Where `address`, in this block's shared memory, lies in that of the cluster's block
        `rank` (a pointer `send` writes through: distributed shared memory)."""
        name = "llvm.nvvm.mapa.shared.cluster"
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(PTR7, [PTR3, I32]), name)
        return self.b.call(fn, [address, self.b.trunc(rank, I32)])

    # An mbarrier counting bytes that other blocks of the cluster send. Addresses are pointers
    # ("l"), not the 32-bit shared offsets hopper.py's TMA pipelines pass, so that the CPU
    # emulator, which runs the same IR on host pointers, can follow them.
    def mbarrier_init(self, barrier: ir.Value, arrivals: int) -> None:
        """Initialise `barrier` (8 shared bytes) for `arrivals` arrivals a phase, and make that
        visible to the cluster's asynchronous writes (`fence.mbarrier_init`)."""
        inline_asm(self.b, "mbarrier.init.shared::cta.b64 [$0], $1; fence.mbarrier_init.release.cluster;",
                  "l,r,~{memory}", [barrier, ir.Constant(I32, arrivals)])

    def expect_bytes(self, barrier: ir.Value, nbytes: int) -> None:
        """Arrive on `barrier`, its phase to complete once `nbytes` more have been sent to it."""
        inline_asm(self.b, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "l,r,~{memory}",
                  [barrier, ir.Constant(I32, nbytes)])

    def wait_phase(self, barrier: ir.Value, parity: int) -> None:
        """Spin until the phase of `barrier` of `parity` (0 or 1) has completed; what was sent to
        complete it is then visible to this thread."""
        fn = self.b.function
        spin, after = fn.append_basic_block("phase.spin"), fn.append_basic_block("phase.done")
        self.b.branch(spin)
        self.b.position_at_end(spin)
        done = inline_asm(self.b, "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; "
                         "selp.u32 $0, 1, 0, done; }", "=r,l,r,~{memory}", [barrier, ir.Constant(I32, parity)], I32)
        self.b.cbranch(self.b.icmp_unsigned("!=", done, ir.Constant(I32, 0)), after, spin)
        self.b.position_at_end(after)

    def send(self, target: ir.Value, value: ir.Value, barrier: ir.Value) -> None:
        """Write `value` (an i32 or i64) at `target` in another block's shared memory, counting
        its bytes on that block's `barrier` (both from `in_cluster_block`), without waiting."""
        bits = value.type.width
        inline_asm(self.b, f"st.async.shared::cluster.mbarrier::complete_tx::bytes.b{bits} [$0], $1, [$2];",
                  f"l,{'r' if bits == 32 else 'l'},l,~{{memory}}", [target, value, barrier])

    def barrier(self) -> None:
        name = "llvm.nvvm.barrier0"
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(VOID, []), name)
        self.b.call(fn, [])

    # --- warps and blocks --------------------------------------------------------------------
    def warp_sync(self) -> None:
        """Wait for every lane of the warp; it also orders their memory accesses before it against
        theirs after it (a fence in one lane then stands for all)."""
        inline_asm(self.b, "bar.warp.sync -1;", "~{memory}", [])

    def lane0_value(self, value: ir.Value) -> ir.Value:
        """Lane 0's `value` (an i32) in every lane of the warp (all 32 lanes take part)."""
        return inline_asm(self.b, "shfl.sync.idx.b32 $0, $1, 0, 31, -1;", "=r,r,~{memory}", [value], I32)

    def shuffle_xor(self, value: ir.Value, lane_mask: int) -> ir.Value:
        """The `value` of the lane whose index differs from ours in `lane_mask` (all 32 lanes
        take part)."""
        b, ty = self.b, value.type
        if isinstance(ty, (ir.DoubleType, ir.IntType)) and getattr(ty, "width", 64) == 64:
            bits = b.bitcast(value, I64) if isinstance(ty, ir.DoubleType) else value
            lo = self._shfl(b.trunc(bits, I32), lane_mask)
            hi = self._shfl(b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32), lane_mask)
            joined = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
            return b.bitcast(joined, ty) if isinstance(ty, ir.DoubleType) else joined
        if isinstance(ty, ir.FloatType):
            return b.bitcast(self._shfl(b.bitcast(value, I32), lane_mask), ty)
        if ty.width < 32:
            return b.trunc(self._shfl(b.zext(value, I32), lane_mask), ty)
        return self._shfl(value, lane_mask)

    def _shfl(self, value: ir.Value, lane_mask: int) -> ir.Value:
        name = "llvm.nvvm.shfl.sync.bfly.i32"
        fn = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(I32, [I32, I32, I32, I32]), name)
        return self.b.call(fn, [ir.Constant(I32, -1), value, ir.Constant(I32, lane_mask), ir.Constant(I32, 31)])

    def group_reduce(self, partials: list[Partial], group: int, groups_per_block: int,
                     lane: ir.Value, member: ir.Value) -> list[Partial]:
        """Combine per-thread partial results over each group of `group` consecutive threads (a
        power of two): warp butterflies, then, for groups wider than a warp, one value per warp
        through shared memory. `lane` is the thread's index in its group, `member` its group's
        index in the block. Every thread of a group gets the same result: each combine is
        commutative, and the cross-warp fold runs in the same order in every thread (in warp
        order up to SEQUENTIAL_WARPS warps, beyond that as a second butterfly over lanes that
        each read one warp's partial, so that no thread holds every warp's partials at once)."""
        partials = self._butterfly(partials, min(group, WARP))
        if group <= WARP:
            return partials
        warps = group // WARP
        b = self.b
        arrays = [[self.shared(_stored_type(v.type), groups_per_block * warps) for v in p.values]
                  for p in partials]
        first_lane = b.icmp_unsigned("==", b.and_(lane, ir.Constant(I64, WARP - 1)), ir.Constant(I64, 0))
        slot = b.add(b.mul(member, ir.Constant(I64, warps)), b.udiv(lane, ir.Constant(I64, WARP)))
        with b.if_then(first_lane):
            for p, arrs in zip(partials, arrays):
                for v, arr in zip(p.values, arrs):
                    ty = _stored_type(v.type)
                    b.store(_to_stored(b, v), self.shared_at(arr, slot, ty))
        self.barrier()
        base = b.mul(member, ir.Constant(I64, warps))

        def read(p: Partial, arrs: list[ir.Value], w: ir.Value) -> Partial:
            at = b.add(base, w)
            return p.with_values([_from_stored(b, b.load(self.shared_at(arr, at, _stored_type(v.type)),
                                                         typ=_stored_type(v.type)), v.type)
                                  for v, arr in zip(p.values, arrs)])

        if warps > SEQUENTIAL_WARPS:
            mine = b.and_(lane, ir.Constant(I64, warps - 1))
            return self._butterfly([read(p, arrs, mine) for p, arrs in zip(partials, arrays)], warps)
        out = []
        for p, arrs in zip(partials, arrays):
            acc = read(p, arrs, ir.Constant(I64, 0))
            for w in range(1, warps):
                acc = acc.combine(b, read(p, arrs, ir.Constant(I64, w)))
            out.append(acc)
        return out

    def _butterfly(self, partials: list[Partial], width: int) -> list[Partial]:
        """Combine partials over each `width` consecutive lanes of a warp, leaving the result in all."""
        mask = 1
        while mask < width:
            others = [p.shuffled(self, mask) for p in partials]
            partials = [p.combine(self.b, o) for p, o in zip(partials, others)]
            mask *= 2
        return partials


def _stored_type(ty: ir.Type) -> ir.Type:
    return I8 if ty == I1 else ty


def _to_stored(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.zext(v, I8) if v.type == I1 else v


def _from_stored(b: ir.IRBuilder, v: ir.Value, ty: ir.Type) -> ir.Value:
    return b.trunc(v, I1) if ty == I1 else v


@dataclass(frozen=True)
class Partial:
    """A reduction's running result in one thread: its value, and for arg-reductions the
    position of that value."""

    reduction: Reduction
    values: tuple[ir.Value, ...]

    @staticmethod
    def start(r: Reduction) -> "Partial":
        init = reductions.identity(r.op, r.value.dtype)
        return Partial(r, (init, ir.Constant(I64, 0)) if r.op.startswith("arg") else (init,))

    def with_values(self, values: Sequence[ir.Value]) -> "Partial":
        return Partial(self.reduction, tuple(values))

    def add(self, b: ir.IRBuilder, value: ir.Value, position: ir.Value, valid: ir.Value | None) -> "Partial":
        """Fold in the next element (positions arrive in increasing order); `valid` false skips it."""
        r = self.reduction
        if r.op.startswith("arg"):
            best, at = self.values
            wins = reductions.better(b, r.op, value, best, r.value.dtype)
            if valid is not None:
                wins = b.and_(valid, wins)
            return self.with_values((b.select(wins, value, best), b.select(wins, position, at)))
        if valid is not None:
            value = b.select(valid, value, reductions.identity(r.op, r.value.dtype))
        folded = reductions.combine(b, r.op, self.values[0], value, r.dtype)
        if "contract" in getattr(value, "flags", ()):
            folded.flags.append("contract")  # a product that may fuse (a 16-bit chain's) fuses into the sum
        return self.with_values((folded,))

    def combine(self, b: ir.IRBuilder, other: "Partial") -> "Partial":
        """Merge two partials of disjoint element sets; symmetric, so the result is the same
        whichever side a thread holds (arg ties go to the lower position)."""
        r = self.reduction
        if not r.op.startswith("arg"):
            return self.with_values((reductions.combine(b, r.op, self.values[0], other.values[0], r.dtype),))
        (v, p), (w, q) = self.values, other.values
        dtype = r.value.dtype
        theirs = b.or_(reductions.better(b, r.op, w, v, dtype),
                       b.and_(b.not_(reductions.better(b, r.op, v, w, dtype)), b.icmp_signed("<", q, p)))
        return self.with_values((b.select(theirs, w, v), b.select(theirs, q, p)))

    def shuffled(self, ke: KernelEmitter, mask: int) -> "Partial":
        return self.with_values(tuple(ke.shuffle_xor(v, mask) for v in self.values))

    def result(self, b: ir.IRBuilder) -> ir.Value:
        """The row value: the folded value, or for arg-reductions the position in its dtype."""
        if self.reduction.op.startswith("arg"):
            return convert(b, self.values[1], dt.int64, self.reduction.dtype)
        return self.values[0]


# --- vector access ------------------------------------------------------------------------------

class Vectorization:
    """Which loads and stores of a kernel move along domain dim `v` contiguously, and the lane
    count that makes them 16 bytes wide."""

    def __init__(self, kernel: Kernel, analysis: Analysis, v: int | None, extent: int, max_lanes: int = MAX_LANES,
                 row_stores: bool = False):
        """`row_stores`: the kernel's row-level stores are at every point too (a contraction's,
        whose rows are its (m, n) points), so they count as element stores."""
        self.kernel, self.v = kernel, v
        loads = [e for e in reachable(kernel, analysis) if isinstance(e, Load) and not e.mask]
        flat_loads = {ld: flat_index(ld.index, kernel.inputs[ld.input].type.shape) for ld in loads}
        flat_stores = {s: flat_index(s.index, kernel.outputs[s.output].type.shape) for s in kernel.stores
                       if s.mode == "set" and (s.level == "element" or row_stores)}
        if v is None:
            self.width, self.loads, self.stores = 1, frozenset(), frozenset()
            return
        movers = {ld: f for ld, f in flat_loads.items() if moves_with(f, v, analysis)}
        store_movers = {s: f for s, f in flat_stores.items() if moves_with(f, v, analysis)}
        sizes = [ld.dtype.itemsize for ld in movers] + \
                [kernel.outputs[s.output].type.dtype.itemsize for s in store_movers]
        width = min(max_lanes, VECTOR_BYTES // min(sizes)) if sizes else 1
        while width > 1 and extent % width:
            width //= 2
        self.width = width
        # With the width known, also the loads and stores that move along runs of it (a
        # reshape's split of the dim: attention's heads back to rows), no vector spanning two.
        self.loads = frozenset(ld for ld, f in flat_loads.items() if self._vector(f, analysis))
        self.stores = frozenset(s for s, f in flat_stores.items() if self._vector(f, analysis))

    def _vector(self, flat: Index, analysis: Analysis) -> bool:
        return self.width > 1 and moves_in_runs(flat, self.v, self.width, analysis) and \
            aligned_to(flat, self.v, self.width, analysis)


def reachable(kernel: Kernel, analysis: Analysis) -> list[Expr]:
    """Every expression the kernel's reductions and stores compute from, each once."""
    return list(subexpressions(kernel.roots))


class Coordinates:
    """A contraction's domain points from flat positions: a batch (fixed per block), a row m of
    the M dims, a column n of the N dims and a depth kk of the contracting dims."""

    def __init__(self, ke: KernelEmitter, m_dims: list[int], n_dims: list[int], batch_dims: list[int],
                 batch: ir.Value):
        self.b, self.kernel = ke.b, ke.kernel
        self.m_dims, self.n_dims, self.batch_dims = m_dims, n_dims, batch_dims
        self.batch_coords = unflatten(ke.b, batch, [ke.kernel.parallel[d] for d in batch_dims]) if batch_dims else []

    def point(self, m: ir.Value | None, n: ir.Value | None, kk: ir.Value | None) -> list[ir.Value | None]:
        """Every dim's index (0 for a group left out: None)."""
        k, b = self.kernel, self.b
        dims: list[ir.Value | None] = [ir.Constant(I64, 0)] * k.rank
        for d, v in zip(self.batch_dims, self.batch_coords):
            dims[d] = v
        for group, flat in ((self.m_dims, m), (self.n_dims, n)):
            if group and flat is not None:
                for d, v in zip(group, unflatten(b, flat, [k.parallel[d] for d in group])):
                    dims[d] = v
        if kk is not None:
            dims[len(k.parallel):] = unflatten(b, kk, k.reduce)
        return dims


class LaneGroup:
    """`width` emitters for points that differ only in the vector dim, lane l at offset l."""

    def __init__(self, ke: KernelEmitter, vec: Vectorization, dims: Sequence[ir.Value],
                 outer: ExprEmitter | None = None):
        self.ke, self.vec = ke, vec
        b = ke.b
        self.emitters = []
        for lane in range(vec.width):
            lane_dims = list(dims)
            if lane:
                lane_dims[vec.v] = b.add(dims[vec.v], ir.Constant(I64, lane))
            self.emitters.append(ke.emitter(lane_dims, outer))
        self._visited: set[Expr] = set()

    @property
    def width(self) -> int:
        return self.vec.width

    def share_invariant(self, exprs: Sequence[Expr]) -> None:
        """Compute once, in lane 0, the parts of `exprs` that do not vary along the vector dim."""
        if self.width == 1:
            return
        first = self.emitters[0]
        before = set(first.memo)
        hoist(first, exprs, self.ke.analysis, frozenset((self.vec.v,)))
        shared = {e: first.memo[e] for e in first.memo if e not in before}
        for em in self.emitters[1:]:
            em.memo.update(shared)

    def preload(self, exprs: Sequence[Expr], ready: Callable[[Load], bool] | None = None) -> None:
        """Issue the vector loads `exprs` need that this group has not loaded yet (only those
        `ready` accepts, when given: a load whose index needs a row value must wait for it)."""
        if self.width == 1:
            return
        b, first = self.ke.b, self.emitters[0]
        for ld in loads_under(exprs, set(self._visited) if ready else self._visited):
            if ld not in self.vec.loads or ld in self.emitters[1].memo or (ready and not ready(ld)):
                continue
            mem = memory_type(ld.dtype)
            offset = first.offset(ld.index, self.ke.shapes[ld.input])
            at = b.gep(self.ke.in_ptrs[ld.input], [offset], inbounds=True, source_etype=mem)
            align = min(VECTOR_BYTES, self.width * ld.dtype.itemsize)
            if ld.dtype == dt.bfloat16:
                # Pairs of bf16 as 32-bit words: the low half is the even lane, and each half
                # becomes a float with one shift or mask.
                words = b.load(at, typ=ir.VectorType(I32, self.width // 2), align=align)
                for pair in range(self.width // 2):
                    word = b.extract_element(words, ir.Constant(I32, pair))
                    self.emitters[2 * pair].memo[ld] = b.bitcast(b.shl(word, ir.Constant(I32, 16)), F32)
                    self.emitters[2 * pair + 1].memo[ld] = b.bitcast(b.and_(word, ir.Constant(I32, -65536)), F32)
                continue
            vector = b.load(at, typ=ir.VectorType(mem, self.width), align=align)
            for lane, em in enumerate(self.emitters):
                em.memo[ld] = from_memory(b, b.extract_element(vector, ir.Constant(I32, lane)), ld.dtype)

    def prefetch(self, exprs: Sequence[Expr], ready: Callable[[Load], bool]) -> None:
        """Prefetch into L2 what the vector loads of `exprs` will read (those `ready` accepts)."""
        first = self.emitters[0]
        for ld in loads_under(exprs, set()):
            if ld in self.vec.loads and ready(ld) and ld not in first.memo:
                offset = first.offset(ld.index, self.ke.shapes[ld.input])
                self.ke.prefetch_l2(self.ke.b.gep(self.ke.in_ptrs[ld.input], [offset], inbounds=True,
                                                  source_etype=memory_type(ld.dtype)))

    def values(self, e: Expr) -> list[ir.Value]:
        return [em.value(e) for em in self.emitters]

    def store_all(self, stores: Sequence[Store]) -> None:
        """The group's stores, every value of every lane computed first (see
        `KernelEmitter.store_all`)."""
        for s in stores:
            for em in self.emitters:
                em.stored(s.value, self.ke.kernel.outputs[s.output].type.dtype)
        for s in stores:
            self._store(s)

    def _store(self, store: Store) -> None:
        ke, b = self.ke, self.ke.b
        if store not in self.vec.stores:
            for em in self.emitters:
                ke.store(em, store)
            return
        dtype = ke.kernel.outputs[store.output].type.dtype
        address = ke.output_address(self.emitters[0], store)
        align = min(VECTOR_BYTES, self.width * dtype.itemsize)
        if dtype.itemsize == 2:
            words = ir.Constant(ir.VectorType(I32, self.width // 2), ir.Undefined)
            for pair, word in enumerate(self.words(store)):
                words = b.insert_element(words, word, ir.Constant(I32, pair))
            b.store(words, address, align=align)
            return
        values = [convert(b, em.stored(store.value, dtype), store.value.dtype, dtype) for em in self.emitters]
        vector = ir.Constant(ir.VectorType(memory_type(dtype), self.width), ir.Undefined)
        for lane, value in enumerate(values):
            vector = b.insert_element(vector, to_memory(b, value, dtype), ir.Constant(I32, lane))
        b.store(vector, address, align=align)

    def words(self, store: Store) -> list[ir.Value]:
        """The group's values of a store to a 16-bit output, rounded and packed two lanes to a
        32-bit word (lane 2i in the low half), not stored."""
        ke, b = self.ke, self.ke.b
        dtype = ke.kernel.outputs[store.output].type.dtype
        values = [convert(b, em.stored(store.value, dtype), store.value.dtype, dtype) for em in self.emitters]
        if dtype == dt.bfloat16 and ke.packs_bf16:
            return [pack_bf16x2(b, values[2 * i], values[2 * i + 1]) for i in range(self.width // 2)]
        halves = [to_memory(b, value, dtype) for value in values]
        bits = [b.zext(h if h.type == I16 else b.bitcast(h, I16), I32) for h in halves]
        return [b.or_(bits[2 * i], b.shl(bits[2 * i + 1], ir.Constant(I32, 16))) for i in range(self.width // 2)]


QUAD = 4  # lanes of a fragment's quad: together they hold 8 consecutive columns of a row a group


class AccumulatorStores:
    """A contraction's epilogue at its float32 accumulators: the kernel's stores at (m, n).

    A tensor-core fragment holds neighbouring columns in register pairs (columns 2q and 2q + 1
    of one row): where N's innermost dim has an even extent the pair never straddles two of its
    rows, and both columns' stores become one vector store (bf16 packed into a word), the
    epilogue's loads along N one vector load."""

    def __init__(self, ke: KernelEmitter, coordinates: Coordinates, m_size: int, n_size: int):
        k = ke.kernel
        self.ke, self.point, self.m_size, self.n_size = ke, coordinates.point, m_size, n_size
        v = coordinates.n_dims[-1] if coordinates.n_dims else None
        pairs = Vectorization(k, ke.analysis, v, 2, row_stores=True) if v is not None and k.parallel[v] % 2 == 0 \
            else None
        self.pairs = pairs if pairs is not None and pairs.width == 2 else None
        rows = Vectorization(k, ke.analysis, v, k.parallel[v], row_stores=True) if self.pairs is not None else None
        # Whether `store_quads` serves: every store a plain one of a 16-bit float, 8 columns of
        # which are 16 contiguous, aligned bytes of the output
        self.quads = rows is not None and rows.width == 8 and all(
            s in rows.stores and s in self.pairs.stores and k.outputs[s.output].type.dtype in (dt.bfloat16, dt.float16)
            for s in k.stores)

    def _dims(self, m: ir.Value, n: ir.Value) -> list[ir.Value | None]:
        k = self.ke.kernel
        return self.point(m, n, None)[:len(k.parallel)] + [None] * len(k.reduce)

    def _inside(self, m: ir.Value, n: ir.Value) -> ir.Value:
        b = self.ke.b
        return b.and_(b.icmp_unsigned("<", m, ir.Constant(I64, self.m_size)),
                      b.icmp_unsigned("<", n, ir.Constant(I64, self.n_size)))

    def store_pair(self, m: ir.Value, n: ir.Value, sums: Sequence[ir.Value]) -> None:
        """The stores at (m, n) and (m, n + 1), n even, of the sums there."""
        ke, b, stores = self.ke, self.ke.b, self.ke.kernel.stores
        if self.pairs is None:
            for lane, total in enumerate(sums):
                column = b.add(n, ir.Constant(I64, lane))
                with b.if_then(self._inside(m, column)):
                    em = ke.emitter(self._dims(m, column))
                    em.rows = [total]
                    ke.store_all(em, stores)
            return
        with b.if_then(self._inside(m, n)):  # (n + 1 too: n is even and so is N)
            group = LaneGroup(ke, self.pairs, self._dims(m, n))
            for em, total in zip(group.emitters, sums):
                em.rows = [total]
            group.preload([s.value for s in stores])
            group.store_all(stores)

    def store_tile(self, inside: ir.Value, quad: ir.Value, rows: Sequence[ir.Value], columns: Sequence[ir.Value],
                   sums: Callable[[int, int], Sequence[ir.Value]]) -> None:
        """The stores of a lane's fragments: at each of its `rows` and the column pairs
        `columns` (8 apart, in order), the sums `sums(row, group)`. Where `quads` and the groups
        come in fours, a tile wholly `inside` the output takes `store_quads` and one on its edge
        the pairs (both emitted: `inside` is known only at run time)."""
        b = self.ke.b

        def pairs() -> None:
            for r, m in enumerate(rows):
                for g, n in enumerate(columns):
                    self.store_pair(m, n, sums(r, g))

        if not (self.quads and len(columns) % QUAD == 0):
            pairs()
            return
        with b.if_else(inside) as (whole, edge):
            with whole:
                for r, m in enumerate(rows):
                    for g0 in range(0, len(columns), QUAD):
                        self.store_quads(m, columns[g0], quad, [sums(r, g) for g in range(g0, g0 + QUAD)])
            with edge:
                pairs()

    def store_quads(self, m: ir.Value, n: ir.Value, quad: ir.Value, sums: Sequence[Sequence[ir.Value]]) -> None:
        """Where `quads`, inside the output (no bounds checked): the stores of QUAD
        consecutive 8-column groups of row m, this lane (`quad`-th of its quad) holding the
        sums at columns n + 8g + 2 quad and the next of group g (`sums[g]`), n a multiple of 8
        past the lane's own offset. Each output's words are computed for every group first (an
        output may be written in place over an input), transposed across the quad (`transposed`),
        and stored as one 16-byte vector a lane: columns n' + 8 quad .. + 7 of group `quad`, so a
        warp writes 64 contiguous bytes in each of its 8 rows instead of 16 (half a sector)."""
        ke, b, stores = self.ke, self.ke.b, self.ke.kernel.stores
        lane_column = b.mul(b.zext(quad, I64), ir.Constant(I64, 2))
        first = b.sub(n, lane_column)  # the groups' first column
        words = []
        for g, group_sums in enumerate(sums):
            group = LaneGroup(ke, self.pairs, self._dims(m, b.add(n, ir.Constant(I64, 8 * g))))
            for em, total in zip(group.emitters, group_sums):
                em.rows = [total]
            group.preload([s.value for s in stores])
            for s in stores:
                for em in group.emitters:
                    em.stored(s.value, ke.kernel.outputs[s.output].type.dtype)
            words.append([group.words(s)[0] for s in stores])
        mine = ke.emitter(self._dims(m, b.add(first, b.mul(b.zext(quad, I64), ir.Constant(I64, 8)))))
        for i, store in enumerate(stores):
            row = self.transposed(quad, [words[g][i] for g in range(QUAD)])
            vector = ir.Constant(ir.VectorType(I32, QUAD), ir.Undefined)
            for lane, word in enumerate(row):
                vector = b.insert_element(vector, word, ir.Constant(I32, lane))
            b.store(vector, ke.output_address(mine, store), align=VECTOR_BYTES)

    def transposed(self, quad: ir.Value, words: Sequence[ir.Value]) -> list[ir.Value]:
        """The 4 x 4 transpose of a quad's words (lane q holds row q): lane q gets column q,
        word i from lane i. Two butterfly rounds, across lanes 2 apart and then 1 apart: each
        lane keeps the half of its words whose index bit matches its own and swaps the other
        half with its partner."""
        b = self.ke.b
        x = list(words)
        for bit in (2, 1):
            high = b.icmp_unsigned("!=", b.and_(quad, ir.Constant(quad.type, bit)), ir.Constant(quad.type, 0))
            for i in [i for i in range(QUAD) if not i & bit]:
                sent = b.select(high, x[i], x[i + bit])  # the word the partner keeps
                got = self.ke.shuffle_xor(sent, bit)
                x[i], x[i + bit] = b.select(high, got, x[i]), b.select(high, x[i + bit], got)
        return x
