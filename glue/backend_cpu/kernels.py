"""Kernel IR -> one LLVM function per kernel, for the host CPU.

Every kernel becomes `void name(ptr table, ptr places, i64 start, i64 end, ptr scratch)`: it
processes the units [start, end) of its work, so the runtime can split a kernel over threads,
reading its buffers from the call's buffer table (arguments, outputs, arena; see `program.py`)
and using `scratch` as per-thread working memory. Where each operand lives is not compiled in:
`places` holds, per distinct operand location, an i64 pair (table entry, byte offset), so one
compiled kernel serves every place a program (or another program) uses it. A small wrapper
resolves the places and calls the kernel body with one `noalias` pointer per distinct location
(an output written in place over an input is one pointer, which the code depends on: the
operands' `aliases`), so LLVM knows no store clobbers another buffer. Code shared by kernels of
other sizes (the blocked contractions of `matmul.py`) also reads numbers of its use from
`places`, after the pairs: the wrapper passes the body a pointer to them (`Launch.sizes`).

The loops a kernel becomes depend on its kind:
- pointwise: units are the elements of the domain; one loop over rows (all dims but the last)
  around a tight inner loop over the last dim, which LLVM vectorises.
- reduction (and contraction without the blocked path of `matmul.py`): units are rows. Per row,
  the reductions and element-level stores are grouped into as few passes over the row as their
  dependencies allow (a pass cannot use a row value it is computing itself): softmax is one
  pass for the max, one for the sum and one for the stores. Row-level values are computed once
  per row, before the pass that needs them; an expensive element value a later pass would
  recompute (softmax's exp) is kept in scratch instead. A float sum over a row longer than
  SUM_BLOCK folds blocks of it from zero and joins them with a compensated sum
  (`blocked_fold`), so its error does not grow with the row's length.
- column reduction (a reduction whose input is contiguous along the last parallel dim and
  strided along the reduce dims: x.sum(0), a dense layer's bias gradient): units are still
  rows, but a block of neighbouring rows (columns of the input) is reduced together, with the
  loop over them innermost, so it reads memory in order and LLVM vectorises it; each row's
  partial results live in per-thread scratch. Every row still folds its elements in the same
  order as the row loop would: steps of the reduce dims in order, in chunks of COLUMN_CHUNK
  folded apart and then into the running total, float sums with compensation (as accurate as
  the row loop's blocks).
- data (scatter_add): one unit, run on one thread so the additions happen in a fixed order
  (the domain's row-major order, as the reference does); the scattered output first receives
  a copy of the `init` input unless both already are the same memory.

Two rewrites make the loops cheaper: a float division by a value that does not change inside
the loop (a row sum, a norm) becomes a multiplication by its reciprocal, computed once; and a
large output is written around the caches, each row through a small per-thread buffer copied
out with non-temporal stores (no read of the lines about to be overwritten).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from llvmlite import ir

from glue.backend_cpu.target import host
from glue.codegen import reductions
from glue.codegen.buffers import BufferAccess
from glue.codegen.expr import ExprEmitter, convert
from glue.codegen.loops import NestBody, loop, nest, unflatten
from glue.codegen.scope import Analysis, hoist
from glue.codegen.types import F64, I1, I64, from_memory, memory_type, register_type, to_memory
from glue.ir import dtypes as dt
from glue.ir.core import strides
from glue.scheduler.kernel_ir import (Const, Dim, Expr, FromValue, Index, Kernel, Load, Op, Store, children,
                                      rewrite_values, subexpressions)
from glue.settings import config
from glue.ir import primitive

PTR = ir.PointerType()
VOID = ir.VoidType()
SIGNATURE = ir.FunctionType(VOID, [PTR, PTR, I64, I64, PTR])

# Scratch kept per thread for values a later pass over a row reuses (bytes, all values together).
STASH_LIMIT = 256 * 1024
# Outputs of at least `config.cpu_stream_bytes` are written around the caches (non-temporal
# stores): they do not fit in them anyway, and a store that misses would first read the line it
# overwrites. Their rows go through a per-thread buffer of at most STREAM_ROW elements.
STREAM_ROW = 16384
# Float sums fold a row in blocks of at most this many elements, each from zero, and add the
# block sums with compensation (see glue.codegen.reductions). Rows up to this long (the
# benchmarks' 2048) keep the plain loop; blocks of 512 measured 20% slower on in-cache
# layernorm rows, where joining the vector accumulators each block shows. A block's own
# sequential sums (2048 over LLVM's few dozen vector accumulators) stay as accurate as a
# 2048-element row always was.
SUM_BLOCK = 2048
# Column reductions: at most this many rows reduced together (their partial results stay in L1),
# the steps folded apart before joining each row's running total, and the fewest rows (the
# last parallel extent) for which the column loop pays.
COLUMN_BLOCK = 1024
COLUMN_CHUNK = 64
MIN_COLUMNS = 8


@dataclass
class KernelFunction:
    """A compiled kernel's entry point and how its work may be divided.

    `units` is the number of work units [0, units) the function takes; `row` the number of units
    that form one contiguous inner loop (chunk boundaries preferably fall on multiples of it);
    `cost` an estimate of the work (operations) over all units; `scratch_bytes` the per-thread
    scratch it needs.
    """

    kernel: Kernel
    symbol: str
    units: int
    row: int
    cost: float
    splittable: bool = True
    scratch_bytes: int = 0

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def kind(self) -> str:
        return self.kernel.kind


@dataclass(frozen=True)
class Launch:
    """What a use of code shared by kernels of other sizes supplies: the numbers its code reads
    when called (`sizes`, after its operands' places) and its own work, which replace the
    `KernelFunction`'s facts of the kernel the code was built for."""

    sizes: tuple[int, ...]
    units: int
    cost: float
    scratch_bytes: int


def cost_per_point(kernel: Kernel) -> float:
    """Operations per domain point, transcendental functions counted as ten."""
    total = 0.0
    for e in subexpressions(kernel.roots):
        if isinstance(e, Op):
            total += 10.0 if primitive(e.primitive).expensive else 1.0
        else:
            total += 0.5
    return max(total, 1.0)


def define_wrapper(module: ir.Module, symbol: str, operand_aliases: Sequence[int],
                   sized: bool = False) -> tuple[ir.Function, list[int]]:
    """The entry point `symbol` (resolving places) and the internal body it calls, whose
    parameters are one noalias pointer per distinct operand location, then (where `sized`) a
    pointer to the use's sizes, then start, end and scratch. `operand_aliases[i]` is the first
    operand at operand i's location. Returns the body and, per operand, the index of its
    pointer parameter."""
    distinct = list(dict.fromkeys(operand_aliases))
    which = [distinct.index(a) for a in operand_aliases]
    pointers = len(distinct) + sized
    body = ir.Function(module, ir.FunctionType(VOID, [PTR] * pointers + [I64, I64, PTR]), f"{symbol}.body")
    body.linkage = "internal"
    for arg in list(body.args[:pointers]) + [body.args[-1]]:
        arg.add_attribute("noalias")
    entry = ir.Function(module, SIGNATURE, symbol)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    table, places, start, end, scratch = entry.args
    pointers = []
    for j in range(len(distinct)):
        slot = b.load(b.gep(places, [ir.Constant(I64, 2 * j)], source_etype=I64), typ=I64)
        offset = b.load(b.gep(places, [ir.Constant(I64, 2 * j + 1)], source_etype=I64), typ=I64)
        base = b.load(b.gep(table, [slot], source_etype=PTR), typ=PTR)
        pointers.append(b.gep(base, [offset], source_etype=ir.IntType(8)))
    if sized:
        pointers.append(b.gep(places, [ir.Constant(I64, 2 * len(distinct))], source_etype=I64))
    b.call(body, pointers + [start, end, scratch])
    b.ret_void()
    return body, which


@dataclass
class _Level:
    """One pass over a row: the reductions it computes and the element stores it makes."""

    reductions: list[int] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)


class CpuEmitter(ExprEmitter):
    """`ExprEmitter` whose masked loads of 4- and 8-byte elements (a concatenation's pieces,
    a pad) branch around the load where the host has masked vector loads (AVX): the loop
    vectoriser makes the branch a masked load of consecutive elements. The shared branch-free
    form reads from a selected offset, which it cannot prove consecutive, so it loaded each
    lane apart: the GPT-2-width step's 8-piece concatenation with a log became 61 KB of
    assembly and 0.30 s of LLVM (now 0.16 s, and vector loads)."""

    def masked_load(self, slot: int, offset: ir.Value, ok: ir.Value, dtype: dt.DType, other: ir.Value) -> ir.Value:
        if dtype.itemsize not in (4, 8) or host().vector_bits < 256:
            return super().masked_load(slot, offset, ok, dtype, other)
        b = self.b
        before = b.block
        with b.if_then(ok):
            value = self.load_element(slot, offset, dtype)
            loaded = b.block
        result = b.phi(value.type)
        result.add_incoming(value, loaded)
        result.add_incoming(other, before)
        return result


class KernelBuilder(BufferAccess):
    """Emits one kernel's function into a module; its points' values through `emitter_class`."""

    emitter_class: type[CpuEmitter] = CpuEmitter

    def __init__(self, module: ir.Module, kernel: Kernel, symbol: str, operand_aliases: Sequence[int],
                 sized: bool = False):
        self.kernel = kernel
        self.symbol = symbol
        self.fn, which = define_wrapper(module, symbol, operand_aliases, sized)
        params = self.fn.args
        n_in = len(kernel.inputs)
        self.in_ptrs = [params[w] for w in which[:n_in]]
        self.out_ptrs = [params[w] for w in which[n_in:]]
        self.sizes = params[-4] if sized else None  # the use's `Launch.sizes`
        self.start, self.end, self.scratch = params[-3:]
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.shapes = [buf.type.shape for buf in kernel.inputs]
        self.analysis = Analysis()
        self.scratch_bytes = 0
        self.streams: dict[int, int] = {}  # output slot -> scratch offset of its row buffer
        self.stream_at: ir.Value | None = None  # position in the row buffers of the current point

    def reserve(self, nbytes: int) -> int:
        """Per-thread scratch for this kernel: the offset of `nbytes` more, 64-byte aligned."""
        offset = self.scratch_bytes
        self.scratch_bytes += -(-nbytes // 64) * 64
        return offset

    def scratch_at(self, offset: int) -> ir.Value:
        return self.b.gep(self.scratch, [ir.Constant(I64, offset)], source_etype=ir.IntType(8))

    # --- memory ------------------------------------------------------------------------------
    def emitter(self, dims: Sequence[ir.Value | None], outer: ExprEmitter | None = None) -> ExprEmitter:
        em = self.emitter_class(self.b, dims, self.shapes, self.load)
        if outer is not None:
            em.memo = dict(outer.memo)
            em.rows = outer.rows
        return em

    def store_all(self, em: ExprEmitter, stores: Sequence[Store]) -> None:
        """Make `stores` at one point: every value first, then the writes, since an output may
        share memory with an input that a later value still reads at this point."""
        for s in stores:
            em.value(s.value)
        for s in stores:
            self.store(em, s)

    def store(self, em: ExprEmitter, store: Store) -> None:
        dtype = self.kernel.outputs[store.output].type.dtype
        value = convert(self.b, em.value(store.value), store.value.dtype, dtype)
        if store.output in self.streams and self.stream_at is not None:
            address = self.b.gep(self.scratch_at(self.streams[store.output]), [self.stream_at],
                                 inbounds=True, source_etype=memory_type(dtype))
        else:
            address = self.output_address(em, store)
        if store.mode == "set":
            self.b.store(to_memory(self.b, value, dtype), address)
            return
        ok = em.in_bounds(store.mask) if store.mask else ir.Constant(I1, 1)
        with self.b.if_then(ok):
            ty = memory_type(dtype)
            old = from_memory(self.b, self.b.load(address, typ=ty), dtype)
            new = reductions.combine(self.b, "sum", old, value, dtype)
            self.b.store(to_memory(self.b, new, dtype), address)

    def plan_streams(self, inner: Sequence[int], length: int) -> None:
        """Choose the outputs written around the caches: large ones with a single element store
        that is contiguous over the loops of `inner` dims (`length` elements per row)."""
        if length > STREAM_ROW or not host().triple.startswith("x86_64"):
            return
        k = self.kernel
        for s in k.stores:
            buf = k.outputs[s.output]
            if s.level == "element" and s.mode == "set" and buf.type.nbytes >= config.cpu_stream_bytes \
                    and [t.output for t in k.stores].count(s.output) == 1 \
                    and _contiguous(s.index, buf.type.shape, inner, [(k.parallel + k.reduce)[d] for d in inner]):
                self.streams[s.output] = self.reserve(length * buf.type.dtype.itemsize)

    def flush(self, dims: list[ir.Value], count: ir.Value) -> None:
        """Copy the row buffers to the outputs (the row starting at domain point `dims`)."""
        k, b = self.kernel, self.b
        em = self.emitter(dims)
        for s in k.stores:
            if s.output in self.streams:
                ty = memory_type(k.outputs[s.output].type.dtype)
                start = b.gep(self.out_ptrs[s.output], [em.offset(s.index, k.outputs[s.output].type.shape)],
                              inbounds=True, source_etype=ty)
                stream_copy(b, start, self.scratch_at(self.streams[s.output]), count, ty,
                            k.outputs[s.output].type.dtype.itemsize, host().vector_bits // 8)

    def use_reciprocals(self, dims: frozenset[int]) -> None:
        """Rewrite float divisions whose divisor is invariant in loops over `dims` (a row sum, a
        norm, a constant) as multiplications by its reciprocal, which the loop-invariant code
        then computes once. A division costs eight times a multiplication in vector code, and
        the two roundings stay within 1.5 ulp (16-bit floats go through float32); only a divisor
        so small that its reciprocal overflows (below 2^-128 in float32) gives inf where the
        quotient would still be finite."""
        def reciprocal(e: Expr) -> Expr:
            if isinstance(e, Op) and e.primitive == "div" and e.dtype.is_float \
                    and self.analysis.inside(e.args[0], dims) and not self.analysis.inside(e.args[1], dims):
                wide = dt.float32 if e.dtype.bits == 16 else e.dtype
                inverse = Op("div", (Const(1.0, wide), _as(e.args[1], wide)), wide)
                return _as(Op("mul", (_as(e.args[0], wide), inverse), wide), e.dtype)
            return e

        self.kernel = rewrite_values(self.kernel, reciprocal)

    # --- kinds -------------------------------------------------------------------------------
    def build(self) -> KernelFunction:
        k = self.kernel
        if k.kind == "pointwise" and k.parallel:
            self.use_reciprocals(frozenset((len(k.parallel) - 1,)))
        elif k.kind in ("reduction", "contraction"):
            self.use_reciprocals(frozenset(range(len(k.parallel), k.rank)))
        source, k = k, self.kernel
        columns = self.column_reduction()
        points = math.prod(k.parallel + k.reduce)
        per_point = cost_per_point(k)
        with self.b.if_then(self.b.icmp_signed("<", self.start, self.end)):
            if k.kind == "data":
                self.data()
            elif 0 in k.parallel:
                pass  # no elements, no rows (a reduction over nothing does store its identity)
            elif k.kind == "pointwise":
                self.pointwise()
            elif columns:
                self.columns()
            else:
                self.rows()
        if self.streams:
            self.b.call(_sfence(self.b.module), [])
        self.b.ret_void()
        if k.kind == "pointwise":
            return KernelFunction(source, self.symbol, math.prod(k.parallel), k.parallel[-1] if k.parallel else 1,
                                  points * per_point, scratch_bytes=self.scratch_bytes)
        if k.kind == "data":
            return KernelFunction(source, self.symbol, 1, 1, points * per_point, splittable=False)
        return KernelFunction(source, self.symbol, math.prod(k.parallel), k.parallel[-1] if columns else 1,
                              points * per_point, scratch_bytes=self.scratch_bytes)

    def pointwise(self) -> None:
        k, b = self.kernel, self.b
        values = [s.value for s in k.stores]
        if not k.parallel:
            em = self.emitter([])
            self.store_all(em, k.stores)
            return
        inner = k.parallel[-1]
        hints = vector_hints(values, self.analysis, frozenset((len(k.parallel) - 1,)))
        if not hints["interleave"]:  # a loop busy with math functions does not wait on memory: no copy pass
            self.plan_streams([len(k.parallel) - 1], inner)
        width = ir.Constant(I64, inner)
        first = b.udiv(self.start, width)
        last = b.udiv(b.sub(self.end, ir.Constant(I64, 1)), width)

        def row(b: ir.IRBuilder, r: ir.Value, _):
            base = b.mul(r, width)
            lo = b.select(b.icmp_signed("==", r, first), b.sub(self.start, base), ir.Constant(I64, 0))
            hi = b.select(b.icmp_signed("==", r, last), b.sub(self.end, base), width)
            coords = unflatten(b, r, k.parallel[:-1])
            outer = self.emitter(coords + [None])
            hoist(outer, values, self.analysis, frozenset((len(k.parallel) - 1,)))

            def element(b: ir.IRBuilder, j: ir.Value, _):
                em = self.emitter(coords + [j], outer)
                self.stream_at = b.sub(j, lo)
                self.store_all(em, k.stores)
                self.stream_at = None
                return []
            loop(b, lo, hi, element, name="j", **hints)
            if self.streams:
                self.flush(coords + [lo], b.sub(hi, lo))
            return []
        loop(b, first, b.add(last, ir.Constant(I64, 1)), row, name="row", vectorize=False)

    def column_reduction(self) -> bool:
        """Whether this reduction runs as a column reduction (see the module doc): one pass of
        plain folds over inputs that step through memory along the last parallel dim and not
        along the innermost reduce dim."""
        k = self.kernel
        if k.kind != "reduction" or not k.parallel or not k.reduce or k.parallel[-1] < MIN_COLUMNS:
            return False
        if any(r.op not in ("sum", "prod", "max", "min") or r.dtype == dt.bool_ or self.analysis.uses(r.value).rows
               for r in k.reductions) or any(s.level != "row" for s in k.stores):
            return False
        extents = k.parallel + k.reduce
        loads, seen, stack = [], set(), [r.value for r in k.reductions]
        while stack:
            e = stack.pop()
            if e not in seen:
                seen.add(e)
                if isinstance(e, Load):
                    loads.append(e)
                stack.extend(children(e))

        def contiguous(load: Load, d: int) -> bool:
            return _contiguous(load.index, self.shapes[load.input], [d], [extents[d]])
        p = len(k.parallel)
        return any(contiguous(x, p - 1) for x in loads) and not any(contiguous(x, k.rank - 1) for x in loads)

    def columns(self) -> None:
        k, b = self.kernel, self.b
        p, width, steps = len(k.parallel), k.parallel[-1], math.prod(k.reduce)
        block = min(COLUMN_BLOCK, width)
        column_dim = frozenset((p - 1,))
        values = [r.value for r in k.reductions]
        types = [register_type(r.dtype) for r in k.reductions]
        # Per reduction, one block of running totals and one of the current chunk's results;
        # per float sum, one of the totals' rounding errors (the chunks are added with compensation).
        totals = [self.reserve(block * _bytes(t)) for t in types]
        chunks = [self.reserve(block * _bytes(t)) for t in types]
        errors = [self.reserve(block * _bytes(t)) if reductions.compensated(r.op, r.dtype) else None
                  for r, t in zip(k.reductions, types)]
        row_stores = [s for s in k.stores if s.level == "row"]
        first = b.udiv(self.start, ir.Constant(I64, width))
        last = b.udiv(b.sub(self.end, ir.Constant(I64, 1)), ir.Constant(I64, width))

        def slot(b: ir.IRBuilder, offsets: list[int], i: int, j: ir.Value) -> ir.Value:
            return b.gep(self.scratch_at(offsets[i]), [j], inbounds=True, source_etype=types[i])

        def reset(b: ir.IRBuilder, offsets: list[int | None], count: ir.Value) -> None:
            def column(b: ir.IRBuilder, j: ir.Value, _):
                for i, r in enumerate(k.reductions):
                    if offsets[i] is not None:
                        b.store(reductions.identity(r.op, r.value.dtype), slot(b, offsets, i, j))
                return []
            loop(b, 0, count, column, name="c")

        def line(b: ir.IRBuilder, r: ir.Value, _):
            base = b.mul(r, ir.Constant(I64, width))
            lo = b.select(b.icmp_signed("==", r, first), b.sub(self.start, base), ir.Constant(I64, 0))
            hi = b.select(b.icmp_signed("==", r, last), b.sub(self.end, base), ir.Constant(I64, width))
            coords = unflatten(b, r, k.parallel[:-1])

            def column_block(b: ir.IRBuilder, q: ir.Value, _):
                c0 = b.add(lo, b.mul(q, ir.Constant(I64, block)))
                count = _min(b, ir.Constant(I64, block), b.sub(hi, c0))
                reset(b, totals, count)
                reset(b, errors, count)

                def chunk(b: ir.IRBuilder, c: ir.Value, _):
                    t0 = b.mul(c, ir.Constant(I64, COLUMN_CHUNK))
                    reset(b, chunks, count)

                    def step(b: ir.IRBuilder, t: ir.Value, _):
                        rcoords = unflatten(b, t, k.reduce)
                        outer = self.emitter(coords + [None] + rcoords)
                        hoist(outer, values, self.analysis, column_dim)

                        def column(b: ir.IRBuilder, j: ir.Value, _):
                            em = self.emitter(coords + [b.add(c0, j)] + rcoords, outer)
                            for i, r in enumerate(k.reductions):
                                at = slot(b, chunks, i, j)
                                acc = b.load(at, typ=types[i])
                                b.store(reductions.combine(b, r.op, acc, em.value(r.value), r.dtype), at)
                            return []
                        loop(b, 0, count, column, name="c")
                        return []
                    loop(b, t0, _min(b, b.add(t0, ir.Constant(I64, COLUMN_CHUNK)), ir.Constant(I64, steps)), step,
                         name="t", vectorize=False)

                    def fold(b: ir.IRBuilder, j: ir.Value, _):
                        for i, r in enumerate(k.reductions):
                            at = slot(b, totals, i, j)
                            part = b.load(slot(b, chunks, i, j), typ=types[i])
                            total = b.load(at, typ=types[i])
                            if errors[i] is None:
                                b.store(reductions.combine(b, r.op, total, part, r.dtype), at)
                                continue
                            error_at = slot(b, errors, i, j)
                            total, error = reductions.compensated_add(b, total, b.load(error_at, typ=types[i]), part)
                            b.store(total, at)
                            b.store(error, error_at)
                        return []
                    loop(b, 0, count, fold, name="c")
                    return []
                loop(b, 0, -(-steps // COLUMN_CHUNK), chunk, name="chunk", vectorize=False)

                def store(b: ir.IRBuilder, j: ir.Value, _):
                    em = self.emitter(coords + [b.add(c0, j)] + [None] * len(k.reduce))
                    em.rows = []
                    for i, ty in enumerate(types):
                        total = b.load(slot(b, totals, i, j), typ=ty)
                        if errors[i] is not None:
                            total = reductions.compensated_result(b, total, b.load(slot(b, errors, i, j), typ=ty))
                        em.rows.append(total)
                    self.store_all(em, row_stores)
                    return []
                loop(b, 0, count, store, name="c")
                return []
            blocks = b.udiv(b.add(b.sub(hi, lo), ir.Constant(I64, block - 1)), ir.Constant(I64, block))
            loop(b, 0, blocks, column_block, name="block", vectorize=False)
            return []
        loop(b, first, b.add(last, ir.Constant(I64, 1)), line, name="line", vectorize=False)

    def data(self) -> None:
        k, b = self.kernel, self.b
        target = next((s.output for s in k.stores if s.mode == "add"), 0)
        if k.init is not None and self.in_ptrs[k.init] is not self.out_ptrs[target]:
            nbytes = k.outputs[target].type.nbytes
            b.call(_memcpy(b.module), [self.out_ptrs[target], self.in_ptrs[k.init], ir.Constant(I64, nbytes),
                                       ir.Constant(I1, 0)])

        def point(b: ir.IRBuilder, coords: list[ir.Value], _):
            em = self.emitter(coords)
            self.store_all(em, k.stores)
            return []
        nest(b, k.parallel, point, name="i")

    def rows(self) -> None:
        k = self.kernel
        p, n_red = len(k.parallel), len(k.reductions)
        reduce_dims = frozenset(range(p, k.rank))
        levels = self.levels()
        stashes = self.stashes(levels, reduce_dims)
        self.plan_streams(list(range(p, k.rank)), math.prod(k.reduce))

        def row(b: ir.IRBuilder, r: ir.Value, _):
            coords = unflatten(b, r, k.parallel) if k.parallel else []
            outer = self.emitter(coords + [None] * len(k.reduce))
            outer.rows = [None] * n_red
            for depth, level in enumerate(levels):
                computing = frozenset(level.reductions)
                exprs = [k.reductions[i].value for i in level.reductions] + [s.value for s in level.stores]
                hoist(outer, exprs, self.analysis, reduce_dims, computing)
                accs = self.row_pass(outer, coords, level, stashes, depth)
                for i, value in zip(level.reductions, accs):
                    outer.rows[i] = value
                if any(st.output in self.streams for st in level.stores):
                    row_start = coords + [ir.Constant(I64, 0)] * len(k.reduce)
                    self.flush(row_start, ir.Constant(I64, math.prod(k.reduce)))
            self.store_all(outer, [s for s in k.stores if s.level == "row"])
            return []
        loop(self.b, self.start, self.end, row, name="row", vectorize=False)

    def row_pass(self, outer: ExprEmitter, coords: list[ir.Value], level: _Level,
                 stashes: dict[Expr, tuple[int, int, int]], depth: int) -> list[ir.Value]:
        """One loop over the reduce dims: folds the level's reductions, makes its stores."""
        k = self.kernel
        reds = [k.reductions[i] for i in level.reductions]
        init = []
        for r in reds:
            init.append(reductions.identity(r.op, r.value.dtype))
            if r.op.startswith("arg"):
                init.append(ir.Constant(I64, 0))
        flat_strides = strides(k.reduce)

        def body(b: ir.IRBuilder, rcoords: list[ir.Value], accs: list[ir.Value]):
            em = self.emitter(coords + rcoords, outer)
            flat = _linear(b, rcoords, flat_strides)
            for e, (first, last, offset) in stashes.items():
                if first < depth <= last:
                    em.memo[e] = b.load(self._stash_at(offset, flat, e), typ=register_type(e.dtype))
            out, it = [], iter(accs)
            for r in reds:
                value, acc = em.value(r.value), next(it)
                if r.op.startswith("arg"):
                    position = next(it)
                    wins = reductions.better(b, r.op, value, acc, r.value.dtype)
                    out += [b.select(wins, value, acc), b.select(wins, rcoords[0], position)]
                else:
                    out.append(reductions.combine(b, r.op, acc, value, r.dtype))
            for e, (first, last, offset) in stashes.items():
                if first == depth:
                    b.store(em.value(e), self._stash_at(offset, flat, e))
            self.stream_at = flat
            self.store_all(em, level.stores)
            self.stream_at = None
            return out
        exprs = [r.value for r in reds] + [s.value for s in level.stores]
        spread = interleave_for(exprs, self.analysis, frozenset(range(len(k.parallel), k.rank)))
        positions, summed = 0, []
        for r in reds:
            if reductions.compensated(r.op, r.dtype):
                summed.append(positions)
            positions += 2 if r.op.startswith("arg") else 1
        accs = iter(blocked_fold(self.b, k.reduce, body, init, summed, spread))
        results = []
        for r in reds:
            value = next(accs)
            if r.op.startswith("arg"):
                value = convert(self.b, next(accs), dt.int64, r.dtype)
            results.append(value)
        return results

    def _stash_at(self, offset: int, flat: ir.Value, e: Expr) -> ir.Value:
        return self.b.gep(self.scratch_at(offset), [flat], inbounds=True, source_etype=register_type(e.dtype))

    def levels(self) -> list[_Level]:
        """Reductions and element stores grouped into passes: a pass holds what depends only on
        row values of earlier passes. Element stores come in the last pass that reads the row
        (or one after it): an output may share memory with an input that every pass reads."""
        k = self.kernel
        depth: dict[int, int] = {}
        for i, r in enumerate(k.reductions):
            depth[i] = 1 + max((depth[j] for j in self.analysis.uses(r.value).rows), default=-1)
        passes: dict[int, _Level] = {}
        for i in range(len(k.reductions)):
            passes.setdefault(depth[i], _Level()).reductions.append(i)
        last = max(depth.values(), default=0)
        for s in k.stores:
            if s.level == "element":
                d = 1 + max((depth[j] for j in self.analysis.uses(s.value).rows), default=-1)
                passes.setdefault(max(d, last), _Level()).stores.append(s)
        return [passes[d] for d in sorted(passes)]

    def stashes(self, levels: list[_Level], reduce_dims: frozenset[int]) -> dict[Expr, tuple[int, int, int]]:
        """Expensive element values computed in one pass and needed again in a later one:
        value -> (pass computing it, last pass using it, scratch offset)."""
        k = self.kernel
        length = math.prod(k.reduce)
        computed: dict[Expr, int] = {}
        chosen: dict[Expr, tuple[int, int, int]] = {}
        for depth, level in enumerate(levels):
            stack = [k.reductions[i].value for i in level.reductions] + [s.value for s in level.stores]
            seen: set[Expr] = set()
            while stack:
                e = stack.pop()
                if e in seen or not self.analysis.inside(e, reduce_dims):
                    continue
                seen.add(e)
                if e in chosen:
                    first, _, offset = chosen[e]
                    chosen[e] = (first, depth, offset)
                    continue
                size = length * e.dtype.itemsize
                if computed.get(e, depth) < depth and e.dtype in (dt.float32, dt.float64) \
                        and self.scratch_bytes + size <= STASH_LIMIT and _expensive(e, self.analysis, reduce_dims):
                    chosen[e] = (computed[e], depth, self.reserve(size))
                    continue
                computed.setdefault(e, depth)
                stack.extend(children(e))
        return chosen


def block_split(extents: Sequence[int]) -> tuple[int, int] | None:
    """How a fold over `extents` (row-major) is cut into blocks of at most SUM_BLOCK
    consecutive elements: (dim s, chunk c) where a block is c steps of dim s and all of the dims
    after it; None when the whole fold is one block."""
    if math.prod(extents) <= SUM_BLOCK:
        return None
    inner, s = 1, len(extents) - 1
    while inner * extents[s] <= SUM_BLOCK:
        inner *= extents[s]
        s -= 1
    return s, max(1, SUM_BLOCK // inner)


def blocked_fold(b: ir.IRBuilder, extents: Sequence[int], body: NestBody, init: Sequence[ir.Value],
                 summed: Sequence[int], interleave: int = 0) -> list[ir.Value]:
    """`nest(b, extents, body, init)` for a fold whose carried values at positions `summed`
    are float sums: those restart from zero in every block of at most SUM_BLOCK elements (LLVM
    keeps a block's sum in a few vector accumulators), and the block sums are added into the
    row's total with compensation (`reductions.compensated_add`). The other carried values
    (max, min, arg-reductions, integer sums) run through the blocks unchanged."""
    split = block_split(extents)
    if not summed or split is None:
        return nest(b, extents, body, init, interleave=interleave)
    s, chunk = split
    n, steps = len(init), extents[s]

    def blocks(b: ir.IRBuilder, outer: list[ir.Value], state: list[ir.Value]) -> list[ir.Value]:
        def block(b: ir.IRBuilder, q: ir.Value, state: list[ir.Value]) -> list[ir.Value]:
            totals, errors = state[:n], state[n:]
            start = [init[i] if i in summed else v for i, v in enumerate(totals)]
            lo = b.mul(q, ir.Constant(I64, chunk))
            hi = b.add(lo, ir.Constant(I64, chunk))
            if steps % chunk:
                hi = _min(b, hi, ir.Constant(I64, steps))

            def step(b: ir.IRBuilder, i: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
                return nest(b, extents[s + 1:], lambda b, rest, vs: body(b, outer + [i] + rest, vs), values,
                            name="r_in", interleave=interleave)
            parts = loop(b, lo, hi, step, start, name="r_block",
                         interleave=interleave if s == len(extents) - 1 else 0)
            out, new_errors = list(parts), []
            for i, error in zip(summed, errors):
                out[i], error = reductions.compensated_add(b, totals[i], error, parts[i])
                new_errors.append(error)
            return out + new_errors
        return loop(b, 0, -(-steps // chunk), block, state, name="blocks", vectorize=False)
    final = nest(b, extents[:s], blocks, list(init) + [init[i] for i in summed], name="r_out")
    out = final[:n]
    for i, error in zip(summed, final[n:]):
        out[i] = reductions.compensated_result(b, out[i], error)
    return out


# Math functions by the length of their code: a loop around one short function gains from four
# vector iterations in flight, longer bodies from two (measured on gelu, tanh, exp, log, erf).
_SHORT_MATH = frozenset({"exp", "exp2", "expm1", "tanh", "logistic", "sqrt", "rsqrt"})
LONG_MATH = 16  # the weight of math functions (`_math_in`) from which a body counts as long


def _math_in(exprs: Sequence[Expr], analysis: Analysis, dims: frozenset[int]) -> tuple[int, int]:
    """(weight, bits) of the math functions a loop over `dims` computing `exprs` runs: one for
    each short function, two for each other, and the widest register type they compute in."""
    weight, bits, seen, stack = 0, 0, set(), list(exprs)
    while stack:
        e = stack.pop()
        if e in seen or not analysis.inside(e, dims):
            continue
        seen.add(e)
        if isinstance(e, Op) and primitive(e.primitive).expensive and e.dtype.is_float:
            weight += 1 if e.primitive in _SHORT_MATH else 2
            bits = max(bits, 64 if register_type(e.dtype) == F64 else 32)
        stack.extend(children(e))
    return weight, bits


def _in_flight(weight: int) -> int:
    return 0 if weight == 0 else 4 if weight == 1 else 2


def interleave_for(exprs: Sequence[Expr], analysis: Analysis, dims: frozenset[int]) -> int:
    """How many vector iterations to keep in flight in a loop over `dims` computing `exprs`
    (0: LLVM's choice, which is one for long bodies)."""
    return _in_flight(_math_in(exprs, analysis, dims)[0])


def vector_hints(exprs: Sequence[Expr], analysis: Analysis, dims: frozenset[int]) -> dict[str, int]:
    """`loop`'s hints for an elementwise loop over `dims` computing `exprs`: `interleave_for`'s
    vector iterations in flight; for a long body (LONG_MATH) on a host whose widest vectors are
    256 bits, as many times as wide vectors instead (16 float32 lanes rather than two iterations
    of 8): the same work, but LLVM's passes before the code generator see one copy of the body,
    not two, and the vectoriser costs one width (a 10,000-op chain's LLVM time a fifth less, a
    20-tanh chain's run time the same; a short body, sin(x) * cos(x), ran 8% slower so, and
    compiles fast anyway). (Where 512-bit vectors exist LLVM prefers 256 or 512 bits by CPU.)"""
    weight, bits = _math_in(exprs, analysis, dims)
    if weight < LONG_MATH or host().vector_bits != 256:
        return {"interleave": _in_flight(weight)}
    return {"vector_width": _in_flight(weight) * 256 // bits, "interleave": 1}


def _as(e: Expr, dtype: dt.DType) -> Expr:
    return e if e.dtype == dtype else Op("convert_element_type", (e,), dtype, (("new_dtype", dtype),))


def _expensive(e: Expr, analysis: Analysis, dims: frozenset[int]) -> bool:
    """Whether recomputing `e` per element would run a transcendental function or a division."""
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if x in seen or not analysis.inside(x, dims):
            continue
        seen.add(x)
        if isinstance(x, Op) and (primitive(x.primitive).expensive or x.primitive == "div" and x.dtype.is_float):
            return True
        stack.extend(children(x))
    return False



def _bytes(ty: ir.Type) -> int:
    """Size of a register type kept in memory (no i1: bool reductions take the row loop)."""
    return ty.width // 8 if isinstance(ty, ir.IntType) else 8 if ty == F64 else 4


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _linear(b: ir.IRBuilder, coords: Sequence[ir.Value], strides: Sequence[int]) -> ir.Value:
    total: ir.Value = ir.Constant(I64, 0)
    for c, s in zip(coords, strides):
        term = c if s == 1 else b.mul(c, ir.Constant(I64, s))
        total = term if isinstance(total, ir.Constant) else b.add(total, term)
    return total


def _memcpy(module: ir.Module) -> ir.Function:
    name = "llvm.memcpy.p0.p0.i64"
    existing = module.globals.get(name)
    return existing if existing is not None else \
        ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I64, I1]), name)


def _contiguous(index: Sequence[Index], shape: Sequence[int], dims: Sequence[int], extents: Sequence[int]) -> bool:
    """Whether an element's offset steps through memory in row-major order of `dims` (of
    `extents`), one element per step, so that one row of them is one contiguous block."""
    flat = Index()
    for i, stride in zip(index, strides(shape)):
        flat = flat + i * stride
    linear = {atom.k: c for atom, c in flat.terms if isinstance(atom, Dim)}
    nonlinear = {d.k for atom, _ in flat.terms if not isinstance(atom, Dim) for d in _dims_in(atom)}
    return all(linear.get(d) == st and d not in nonlinear for d, st in zip(dims, strides(extents)))


def _dims_in(atom) -> list[Dim]:
    if isinstance(atom, Dim):
        return [atom]
    if isinstance(atom, FromValue):
        return [Dim(k) for k in Analysis().uses(atom.value).dims]
    return [d for a, _ in atom.index.terms for d in _dims_in(a)]


def stream_copy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, count: ir.Value, ty: ir.Type, size: int,
                vector_bytes: int) -> None:
    """dst[:count] = src[:count] with aligned non-temporal vector stores: a few plain stores
    until dst is aligned, whole vectors, then the tail."""
    lanes = vector_bytes // size
    vt = ir.VectorType(ty, lanes)
    misaligned = b.and_(b.ptrtoint(dst, I64), ir.Constant(I64, vector_bytes - 1))
    head = b.udiv(b.and_(b.sub(ir.Constant(I64, vector_bytes), misaligned), ir.Constant(I64, vector_bytes - 1)),
                  ir.Constant(I64, size))
    head = b.select(b.icmp_unsigned("<", head, count), head, count)
    memcpy = _memcpy(b.module)
    b.call(memcpy, [dst, src, b.mul(head, ir.Constant(I64, size)), ir.Constant(I1, 0)])
    vectors = b.udiv(b.sub(count, head), ir.Constant(I64, lanes))
    nontemporal = b.module.add_metadata([ir.Constant(ir.IntType(32), 1)])

    def copy(b: ir.IRBuilder, v: ir.Value, _):
        at = b.add(head, b.mul(v, ir.Constant(I64, lanes)))
        value = b.load(b.gep(src, [at], inbounds=True, source_etype=ty), typ=vt, align=size)
        out = b.store(value, b.gep(dst, [at], inbounds=True, source_etype=ty), align=vector_bytes)
        out.set_metadata("nontemporal", nontemporal)
        return []
    loop(b, 0, vectors, copy, name="nt", vectorize=False)
    done = b.add(head, b.mul(vectors, ir.Constant(I64, lanes)))
    b.call(memcpy, [b.gep(dst, [done], inbounds=True, source_etype=ty),
                    b.gep(src, [done], inbounds=True, source_etype=ty),
                    b.mul(b.sub(count, done), ir.Constant(I64, size)), ir.Constant(I1, 0)])


def _sfence(module: ir.Module) -> ir.Function:
    """x86's store fence: non-temporal stores are weakly ordered, so a kernel fences them
    before another thread (the next kernel) may read what they wrote."""
    name = "llvm.x86.sse.sfence"
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, ir.FunctionType(VOID, []), name)
