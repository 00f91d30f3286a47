"""Cache-blocked, vectorised code for contraction kernels (matmul, batched matmul).

A contraction kernel folds `left * right` over its reduce dims, where `left` depends on the
batch and row dims (I) and `right` on the batch and column dims (J); its stores (the epilogue:
bias, activation, cast, residual) use the sum at each output point. Flattened, that is
C[b, m, n] = sum_k A[b, m, k] B[b, k, n] with M, N, K the products of the I, J and reduce
extents, whatever the operands' layouts.

Work is split into units (batch, block of MB rows, block of NC columns), and each unit's sum
over k into k-blocks of KC steps. Per k-block, a unit packs its KC x NC block of `right` into
NR-wide column panels (evaluating the right-hand expression, so casts and transposes are
applied while packing), then for each MR-row micro-panel runs a register-blocked micro-kernel
per panel: MR x NR accumulators in vector registers, one broadcast of A and NR/VL vector
loads of B and MR*NR/VL fused multiply-adds per step of k. A is read straight from its
buffer when `left` is a plain load of the accumulator type, else packed per micro-panel and
k-block. The accumulators start from zero in the first k-block and from the partial sums the
previous k-block stored in the unit's MB x NC buffer in the others, so each sum still runs
over k in order, one fused multiply-add at a time: results do not depend on the blocking or
the thread split. After the last k-block the epilogue runs over the sums as an ordinary loop
over the columns, which LLVM vectorises, storing straight into the outputs.

Sizes: KC so that a packed B panel (KC x NR) takes half the L1 cache, NC so that the packed
B block (KC x NC) takes half the L2 cache, MB so that the partial sums stay within
`cpu_matmul_sums_bytes` (they are touched once per micro-kernel call, in order, so L2/L3 serves them).

One code for several sizes: LLVM's time is per distinct module, and a training step's
contractions often differ only in their sizes (a GPT-2-width layer's 4096x768 by 768x2304,
768x3072, 3072x768 ... products, forward and backward). `plan` computes on the host every number
the code depends on (`Sizes`: the flat extents, the blocking, left's stride, the scratch layout;
then every operand's strides), and the program (`program.py`) keys a contraction without its
sizes, compiling in those numbers that all the contractions sharing the code have alike (all of
them for a contraction alone: LLVM optimises code with known trip counts in two thirds of the
time); the code reads the others at its entry, from its use's `Launch`. Always compiled in: the
micro-tile (MR, NR, the vector type), each operand's last stride (1), and the extents that
unflatten a group of dims (all but a group's first: a division by a constant is a few
multiplications, by a value a division instruction, and packing divides at every step). How
left is read (packed, or in place at unit or another stride) and whether its packing vectorises
are decided from the sizes and keyed (`Contraction.signature`). Every number a use passes is
the one its own code would have compiled in, so its results are the same bits.
"""
from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields
from typing import Sequence

from llvmlite import ir

from glue.backend_cpu.kernels import CpuEmitter, KernelBuilder, KernelFunction, Launch, interleave_for
from glue.backend_cpu.target import thread_count
from glue.codegen.expr import ExprEmitter, convert, intrinsic
from glue.codegen.loops import loop, unflatten
from glue.codegen.scope import Analysis, hoist
from glue.codegen.types import I1, I8, I32, I64, memory_type, register_type
from glue.ir import dtypes as dt
from glue.ir.core import strides
from glue.scheduler.kernel_ir import Clamp, Dim, Div, Expr, Index, Kernel, Load, Mod, Op, Store, loads_under
from glue.settings import config

MR = 6  # rows of a micro-tile: 6 x 2 vectors of accumulators + 3 operands fit 16 registers
MIN_ROWS_PER_UNIT = 4 * MR
MIN_PANELS_PER_UNIT = 4
# Copies of the micro-kernel's step per loop iteration: the lean pipeline (program.py) unrolls
# only what a loop asks for. At 4 a GPT-2-width layer's products run as fast as with O3's own
# choice (2) within the 2-core machine's noise (150-180 GFLOP/s).
MICRO_UNROLL = 4


def _split(kernel: Kernel, analysis: Analysis) -> tuple[Expr, Expr, list[int], list[int], list[int]] | None:
    """(left, right, batch dims, row dims, column dims) of a contraction, or None."""
    if len(kernel.reductions) != 1:
        return None
    red = kernel.reductions[0]
    if red.op != "sum" or red.dtype not in (dt.float32, dt.float64) or not isinstance(red.value, Op) \
            or red.value.primitive != "mul" or any(s.level != "row" for s in kernel.stores):
        return None
    left, right = red.value.args
    lu, ru = analysis.uses(left), analysis.uses(right)
    if lu.rows or ru.rows:
        return None
    p = len(kernel.parallel)
    batch = [k for k in range(p) if k in lu.dims and k in ru.dims]
    cols = [k for k in range(p) if k in ru.dims and k not in lu.dims]
    rows = [k for k in range(p) if k not in batch and k not in cols]
    return left, right, batch, rows, cols


@dataclass(frozen=True)
class Sizes:
    """The numbers of a blocked contraction's code that its sizes decide, in the order its
    code reads them (`Launch.sizes`, then the operands' `strides`): ints on the host, the
    values read at the code's entry inside it. B, M, N, K: the flat batch, row, column and
    reduce extents; KC, NC, MB and the block counts: the blocking; `left_stride`: left's
    step in elements per step of the flat k (read in place); `a_at`, `sums_at`: where the
    packed A panel and the partial sums start in the scratch (the packed B block at 0)."""

    B: int | ir.Value
    M: int | ir.Value
    N: int | ir.Value
    K: int | ir.Value
    kc: int | ir.Value
    nc: int | ir.Value
    mb: int | ir.Value
    k_blocks: int | ir.Value
    m_blocks: int | ir.Value
    n_blocks: int | ir.Value
    left_stride: int | ir.Value
    a_at: int | ir.Value
    sums_at: int | ir.Value


@dataclass(frozen=True)
class Contraction:
    """A contraction kernel planned for the blocked path, on the host (see the module doc):
    its split (`_split`), what its code depends on besides its structure that is always
    compiled in (`signature`, part of its key), and its numbers (`sizes`, `strides`), which a
    call of code shared with other sizes passes (`launch`)."""

    left: Expr
    right: Expr
    groups: tuple[tuple[int, ...], ...]  # the batch, row and column dims of the domain
    divisors: tuple[tuple[int, ...], ...]  # per batch, row, column and reduce group: its extents but the first
    acc: dt.DType
    nr: int
    left_read: str  # "packed", or in place at "unit" stride or "strided"
    linear_left: bool  # every load under left is linear in the flat k (its packing vectorises)
    sizes: Sizes
    strides: tuple[tuple[int, ...], ...]  # per operand (inputs, outputs), its strides but the last

    @property
    def signature(self) -> tuple[str, ...]:
        """What the code compiles in whatever its sizes, as key parts."""
        return ("blocked contraction", f"nr={self.nr}", f"divisors={self.divisors}", f"left={self.left_read}",
                f"linear left={self.linear_left}")

    @property
    def scratch_bytes(self) -> int:
        """Per-thread scratch: the packed B block, the packed A panel, the unit's partial sums."""
        s = self.sizes
        return s.sums_at + _round64(s.mb * s.nc * self.acc.itemsize)

    @property
    def launch(self) -> Launch:
        """Every number the code may read (`Sizes`, then the strides) and this kernel's work."""
        s = self.sizes
        numbers = astuple(s) + tuple(n for operand in self.strides for n in operand)
        return Launch(numbers, s.B * s.m_blocks * s.n_blocks, 2.0 * s.B * s.M * s.N * s.K, self.scratch_bytes)


def plan(kernel: Kernel, vector_bits: int) -> Contraction | None:
    """The kernel planned for the blocked path, or None when that does not apply."""
    parts = _split(kernel, Analysis())
    if parts is None:
        return None
    left, right, batch, rows, cols = parts
    ext = kernel.parallel
    acc = kernel.reductions[0].dtype
    size = acc.itemsize
    lanes = vector_bits // (8 * size)
    nr = 2 * lanes
    B = math.prod(ext[k] for k in batch)
    M = math.prod(ext[k] for k in rows)
    N = math.prod(ext[k] for k in cols)
    K = math.prod(kernel.reduce)
    work = B * M * N * K
    if work == 0 or work < config.cpu_matmul_min_work or N < lanes:
        return None
    kc = min(K, max(1, config.cpu_matmul_l1_bytes // (nr * size)))
    k_blocks = -(-K // kc)
    # Units: enough for every thread to get two (for balance), split first along the
    # columns (each unit packs only its own block of B), then along the rows.
    wanted = 2 * thread_count()
    nc = max(nr, config.cpu_matmul_l2_bytes // (kc * size) // nr * nr)
    if B * -(-N // nc) < wanted:
        per_batch = -(-wanted // B)
        nc = min(nc, max(MIN_PANELS_PER_UNIT * nr, _round_up(-(-N // per_batch), nr)))
    nc = min(nc, _round_up(N, nr))
    n_blocks = -(-N // nc)
    # Row blocks: as many as balance needs, and enough that each unit's partial sums stay
    # within config.cpu_matmul_sums_bytes, all of about the same height.
    row_parts = max(1, -(-wanted // (B * n_blocks)), -(-M * nc * size // config.cpu_matmul_sums_bytes))
    mb = min(_round_up(M, MR), max(MIN_ROWS_PER_UNIT, _round_up(-(-M // row_parts), MR)))
    m_blocks = -(-M // mb)
    # `left` read straight from its buffer costs the micro-kernel nothing more than from a
    # packed copy (one broadcast load per row and step either way; measured 5-10% faster
    # without the copy, also at 2048 rows, whose power-of-two stride could alias in L1).
    # Anything else is packed, so that casts and masks are evaluated once per k-block.
    # The micro-kernel walks A's rows by pointer (`left_stride`), so in place it needs a
    # left whose address moves by a constant stride per step of the flat k.
    left_stride = _k_stride(left, kernel) if isinstance(left, Load) else None
    in_place = isinstance(left, Load) and left.dtype == acc and not left.mask and left_stride is not None
    # Per-thread scratch: packed B block, packed A micro-panel, the unit's partial sums.
    a_at = _round64(kc * nc * size)
    sums_at = a_at + (0 if in_place else _round64(kc * MR * size))
    groups = (tuple(batch), tuple(rows), tuple(cols))
    divisors = tuple(tuple(ext[d] for d in g[1:]) for g in groups) + (kernel.reduce[1:],)
    operands = kernel.inputs + kernel.outputs
    return Contraction(
        left, right, groups, divisors, acc, nr,
        "packed" if not in_place else "unit" if left_stride == 1 else "strided",
        all(_k_stride(ld, kernel) is not None for ld in loads_under([left])),
        Sizes(B, M, N, K, kc, nc, mb, k_blocks, m_blocks, n_blocks, left_stride if in_place else 0, a_at, sums_at),
        tuple(strides(buf.type.shape)[:-1] for buf in operands))


class _StridedEmitter(CpuEmitter):
    """`CpuEmitter` for code shared by kernels of other sizes: the "shapes" it is given are its
    operands' strides (values: compiled in, or read when the code is called; None for the last
    axis, whose stride is 1), and an element's offset is the sum of each axis's index times its
    stride."""

    def offset(self, index: Sequence[Index], strides: Sequence[ir.Value | None]) -> ir.Value:
        total: ir.Value | None = None
        for i, stride in zip(index, strides):
            if i.is_const and i.const == 0:
                continue
            term = self.index(i) if stride is None else self.b.mul(self.index(i), stride)
            total = term if total is None else self.b.add(total, term)
        return total if total is not None else ir.Constant(I64, 0)


class MatmulBuilder(KernelBuilder):
    """Emits a contraction kernel as packed, register-blocked loops (see the module doc), for
    every kernel of its structure and `Contraction.signature`: of the numbers of its uses'
    `Launch.sizes`, those `compiled_in` gives are constants, the others read from the call."""

    emitter_class = _StridedEmitter

    def __init__(self, module: ir.Module, kernel: Kernel, symbol: str, operand_aliases: Sequence[int],
                 contraction: Contraction, compiled_in: Sequence[int | None]):
        super().__init__(module, kernel, symbol, operand_aliases, sized=True)
        c = self.contraction = contraction
        self.left, self.right = c.left, c.right
        self.batch, self.row_dims, self.col_dims = (list(g) for g in c.groups)
        self.acc = c.acc
        self.ty = register_type(self.acc)
        self.size = self.acc.itemsize
        self.nr = c.nr
        self.lanes = self.nr // 2
        self.pack_left = c.left_read == "packed"
        # The numbers of the call that are not compiled in, read once at the entry.
        values = [self.const(n) if n is not None else
                  self.b.load(self.b.gep(self.sizes, [self.const(i)], source_etype=I64), typ=I64)
                  for i, n in enumerate(compiled_in)]
        self.n = Sizes(*values[:len(fields(Sizes))])
        rest = iter(values[len(fields(Sizes)):])
        strides = [[next(rest) for _ in operand] + [None] for operand in c.strides]
        self.shapes = strides[:len(kernel.inputs)]
        self.out_strides = strides[len(kernel.inputs):]
        # Unflattening a group never reads its first extent: those vary between the kernels
        # sharing this code, the others are `divisors`.
        lengths = [len(g) for g in c.groups] + [len(kernel.reduce)]
        self.extents = [(0, *d) if n else () for d, n in zip(c.divisors, lengths)]

    # --- helpers --------------------------------------------------------------------------
    def const(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def element(self, base: ir.Value, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [index], inbounds=True, source_etype=self.ty)

    def point(self, bc: list[ir.Value], m: ir.Value | None, n: ir.Value | None,
              k: ir.Value | None) -> list[ir.Value | None]:
        """Domain dims for batch coords, flat row m, flat column n and flat reduce index k."""
        dims: list[ir.Value | None] = [None] * self.kernel.rank
        for d, c in zip(self.batch, bc):
            dims[d] = c
        for group, extents, flat in ((self.row_dims, self.extents[1], m), (self.col_dims, self.extents[2], n)):
            if flat is not None and group:
                for d, c in zip(group, unflatten(self.b, flat, extents)):
                    dims[d] = c
        if k is not None:
            p = len(self.kernel.parallel)
            for d, c in enumerate(unflatten(self.b, k, self.extents[3])):
                dims[p + d] = c
        return dims

    def output_address(self, em: ExprEmitter, store: Store) -> ir.Value:
        offset = em.offset(store.index, self.out_strides[store.output])
        return self.b.gep(self.out_ptrs[store.output], [offset], inbounds=True,
                          source_etype=memory_type(self.kernel.outputs[store.output].type.dtype))

    def value_at(self, e: Expr, dims: list[ir.Value | None]) -> ir.Value:
        return self.emitter(dims).value(e)

    def zero_fill(self, base: ir.Value, count: ir.Value) -> None:
        memset = self.b.module.globals.get("llvm.memset.p0.i64") or ir.Function(
            self.b.module, ir.FunctionType(ir.VoidType(), [base.type, I8, I64, I1]), "llvm.memset.p0.i64")
        self.b.call(memset, [base, ir.Constant(I8, 0), self.b.mul(count, self.const(self.size)), ir.Constant(I1, 0)])

    # --- the kernel -----------------------------------------------------------------------
    def build(self) -> KernelFunction:
        source = self.kernel
        self.use_reciprocals(frozenset(self.col_dims))
        with self.b.if_then(self.b.icmp_signed("<", self.start, self.end)):
            loop(self.b, self.start, self.end, self.unit, name="unit", vectorize=False, unroll=1)
        self.b.ret_void()
        launch = self.contraction.launch
        return KernelFunction(source, self.symbol, launch.units, 1, launch.cost, scratch_bytes=launch.scratch_bytes)

    def unit(self, b: ir.IRBuilder, u: ir.Value, _) -> list:
        n = self.n
        bb, mblk, nblk = unflatten(b, u, [0, n.m_blocks, n.n_blocks])
        bc = unflatten(b, bb, self.extents[0]) if self.batch else []
        m0 = b.mul(mblk, n.mb)
        n0 = b.mul(nblk, n.nc)
        m_len = _min(b, n.mb, b.sub(n.M, m0))
        n_len = _min(b, n.nc, b.sub(n.N, n0))
        packed_b = self.scratch
        packed_a = b.gep(self.scratch, [n.a_at], source_etype=I8)
        sums = b.gep(self.scratch, [n.sums_at], source_etype=I8)
        panels = b.udiv(b.add(n_len, self.const(self.nr - 1)), self.const(self.nr))
        micro = b.udiv(b.add(m_len, self.const(MR - 1)), self.const(MR))
        panel_elements = b.mul(n.kc, self.const(self.nr))
        tile_elements = b.mul(n.nc, self.const(MR))

        def k_block(b: ir.IRBuilder, kb: ir.Value, _):
            k0 = b.mul(kb, n.kc)
            k_len = _min(b, n.kc, b.sub(n.K, k0))
            first = b.icmp_unsigned("==", kb, self.const(0))
            self.pack_b(bc, n0, n_len, k0, k_len, packed_b)

            def micro_panel(b: ir.IRBuilder, i: ir.Value, _):
                row0 = b.add(m0, b.mul(i, self.const(MR)))
                if self.pack_left:
                    self.pack_a(bc, row0, k0, k_len, packed_a)
                    source = packed_a
                else:  # rows past the end repeat the last one; their sums are never stored
                    last = b.sub(n.M, self.const(1))
                    source = [self.left_address(bc, _min(b, b.add(row0, self.const(mm)), last), k0)
                              for mm in range(MR)]
                tile = b.mul(i, tile_elements)

                def panel(b: ir.IRBuilder, p: ir.Value, _):
                    self.micro_kernel(source, k_len, first, self.element(packed_b, b.mul(p, panel_elements)),
                                      self.element(sums, b.add(tile, b.mul(p, self.const(self.nr)))))
                    return []
                loop(b, 0, panels, panel, name="panel", vectorize=False, unroll=1)
                return []
            loop(b, 0, micro, micro_panel, name="micro", vectorize=False, unroll=1)
            return []
        loop(b, 0, n.k_blocks, k_block, name="kblock", vectorize=False, unroll=1)
        self.epilogue(bc, m0, m_len, n0, n_len, sums)
        return []

    def pack_b(self, bc, n0, n_len, k0, k_len, packed) -> None:
        """packed[p][kk][jj] = right(k0 + kk, n0 + p*NR + jj), zero past the last column."""
        b, nr = self.b, self.nr
        panel_elements = b.mul(self.n.kc, self.const(nr))
        full = b.udiv(n_len, self.const(nr))
        with b.if_then(b.icmp_unsigned("!=", b.urem(n_len, self.const(nr)), self.const(0))):
            self.zero_fill(self.element(packed, b.mul(full, panel_elements)), panel_elements)
        panels = b.udiv(b.add(n_len, self.const(nr - 1)), self.const(nr))

        def panel(b: ir.IRBuilder, p: ir.Value, _):
            col0 = b.add(n0, b.mul(p, self.const(nr)))
            width = _min(b, self.const(nr), b.sub(b.add(n0, n_len), col0))
            base = b.mul(p, panel_elements)

            def step(b: ir.IRBuilder, kk: ir.Value, _):
                row = b.add(base, b.mul(kk, self.const(nr)))
                k = b.add(k0, kk)

                def column(b: ir.IRBuilder, jj: ir.Value, _):
                    value = self.value_at(self.right, self.point(bc, None, b.add(col0, jj), k))
                    b.store(convert(b, value, self.right.dtype, self.acc), self.element(packed, b.add(row, jj)))
                    return []
                loop(b, 0, width, column, name="jj")
                return []
            loop(b, 0, k_len, step, name="k", vectorize=False, unroll=1)
            return []
        loop(b, 0, panels, panel, name="bpanel", vectorize=False, unroll=1)

    def pack_a(self, bc, row0, k0, k_len, packed) -> None:
        """packed[kk][mm] = left(row0 + mm, k0 + kk); rows past the end repeat the last one
        (their sums are never stored)."""
        b = self.b
        last = b.sub(self.n.M, self.const(1))
        rows = [self.point(bc, _min(b, b.add(row0, self.const(mm)), last), None, None) for mm in range(MR)]

        def step(b: ir.IRBuilder, kk: ir.Value, _):
            reduce_dims = self.point(bc, None, None, b.add(k0, kk))
            at = b.mul(kk, self.const(MR))
            for mm, dims in enumerate(rows):
                point = [r if r is not None else k for r, k in zip(dims, reduce_dims)]
                value = self.value_at(self.left, point)
                b.store(convert(b, value, self.left.dtype, self.acc), self.element(packed, b.add(at, self.const(mm))))
            return []
        # Vectorised, a left whose index is not linear in k (a reshape's divisions: attention's
        # heads merged back) becomes MR x lanes x interleave copies of its index arithmetic,
        # which LLVM then spends tens of seconds on (GPT-2 width step: 20 s for one kernel),
        # for a packing loop of gathers that vectors do not speed up.
        loop(b, 0, k_len, step, name="ka", vectorize=self.contraction.linear_left)

    def left_address(self, bc, m: ir.Value, k: ir.Value) -> ir.Value:
        """The address of left(row m, flat reduce index k), a plain load read in place."""
        em = self.emitter(self.point(bc, m, None, k))
        offset = em.offset(self.left.index, self.shapes[self.left.input])
        return self.element(self.in_ptrs[self.left.input], offset)

    def micro_kernel(self, source, k_len, first, packed_b: ir.Value, sums: ir.Value) -> None:
        """sums[mm][v*VL : (v+1)*VL] (+)= sum over kk of A[k0 + kk][mm] * B[kk][v*VL : (v+1)*VL].

        The accumulators start from zero in the first k-block and from the stored partial sums
        in the others, so every sum still runs over k in order, whatever the blocking. A comes
        from the packed micro-panel (`source` a pointer) or, read in place, from `left` at the
        micro-panel's rows (`source` the addresses of their elements at the k-block's first k).
        The loop walks pointers (B's panel, A's packed panel) and the in-place rows share one
        offset (the step count at unit stride), each advanced by a constant (or left's stride,
        a number of the call) per step, so the code generator needs no loop strength reduction
        to address them well."""
        b, lanes, vectors = self.b, self.lanes, self.nr // self.lanes
        vt = ir.VectorType(self.ty, lanes)
        fma = intrinsic(b.module, "llvm.fma", vt, [vt] * 3, [vt])
        zero = ir.Constant(vt, [0.0] * lanes)
        splat_mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
        tile = [self.element(sums, b.add(b.mul(self.n.nc, self.const(mm)), self.const(v * lanes)))
                for mm in range(MR) for v in range(vectors)]
        start = [b.select(first, zero, b.load(at, typ=vt, align=self.size)) for at in tile]
        in_place = isinstance(source, list)
        # In place, the rows share one element offset: the step count itself at unit stride.
        walk = in_place and self.contraction.left_read == "strided"

        def step(b: ir.IRBuilder, kk: ir.Value, state: list[ir.Value]):
            pb, at, accs = state[0], state[1] if walk or not in_place else kk, state[2:]
            bv = [b.load(self.element(pb, self.const(v * lanes)), typ=vt, align=self.size) for v in range(vectors)]
            if in_place:
                a_values = [b.load(self.element(row, at), typ=self.ty) for row in source]
            else:
                a_values = [b.load(self.element(at, self.const(mm)), typ=self.ty) for mm in range(MR)]
            out = []
            for mm, a in enumerate(a_values):
                av = b.shuffle_vector(b.insert_element(ir.Constant(vt, None), a, ir.Constant(I32, 0)),
                                      ir.Constant(vt, None), splat_mask)
                out += [b.call(fma, [av, bv[v], accs[mm * vectors + v]]) for v in range(vectors)]
            if walk:
                following = b.add(at, self.n.left_stride)
            elif in_place:
                following = at  # unused
            else:
                following = self.element(at, self.const(MR))
            return [self.element(pb, self.const(self.nr)), following] + out
        a_start = self.const(0) if in_place else source
        state = loop(b, 0, k_len, step, [packed_b, a_start] + start, name="kk", vectorize=False,
                     unroll=MICRO_UNROLL)
        for acc, at in zip(state[2:], tile):
            b.store(acc, at, align=self.size)

    def epilogue(self, bc, m0, m_len, n0, n_len, sums) -> None:
        """The kernel's stores at every point of the unit, with the sums as row value 0."""
        k = self.kernel
        values = [s.value for s in k.stores]
        cols = frozenset(self.col_dims)
        spread = interleave_for(values, self.analysis, cols)

        def row(b: ir.IRBuilder, mm: ir.Value, _):
            m = b.add(m0, mm)
            outer = self.emitter(self.point(bc, m, None, None))
            outer.rows = [None]
            hoist(outer, values, self.analysis, cols, frozenset((0,)))
            line = b.mul(mm, self.n.nc)

            def column(b: ir.IRBuilder, j: ir.Value, _):
                em = self.emitter(self.point(bc, m, b.add(n0, j), None), outer)
                em.rows = [b.load(self.element(sums, b.add(line, j)), typ=self.ty)]
                self.store_all(em, k.stores)
                return []
            loop(b, 0, n_len, column, name="n", interleave=spread)
            return []
        loop(self.b, 0, m_len, row, name="em", vectorize=False, unroll=1)


def _mentions(atom, dims: frozenset[int]) -> bool:
    """Whether an index atom depends on any of the domain `dims` other than as a plain term."""
    if isinstance(atom, Dim):
        return atom.k in dims
    if isinstance(atom, (Div, Mod, Clamp)):
        return any(_mentions(a, dims) for a, _ in atom.index.terms)
    return True  # a data-dependent index


def _k_stride(load: Load, kernel: Kernel) -> int | None:
    """The constant distance in elements between load(..., k) and load(..., k + 1) over the
    flat reduce index k, or None when the address is not linear in it."""
    p = len(kernel.parallel)
    reduce_dims = frozenset(range(p, p + len(kernel.reduce)))
    flat = Index()
    for i, s in zip(load.index, strides(kernel.inputs[load.input].type.shape)):
        flat = flat + i * s
    coeff = {d: 0 for d in reduce_dims}
    for atom, c in flat.terms:
        if isinstance(atom, Dim) and atom.k in reduce_dims:
            coeff[atom.k] += c
        elif _mentions(atom, reduce_dims):
            return None
    stride = None
    inner = 1  # the flat k's step for one step of reduce dim d: the extents after it
    for d in reversed(range(len(kernel.reduce))):
        if kernel.reduce[d] > 1:
            if stride is None:
                stride = coeff[p + d]
            elif coeff[p + d] != stride * inner:
                return None
        inner *= kernel.reduce[d]
    return stride if stride is not None else 0


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _round64(n: int) -> int:
    return _round_up(n, 64)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def common_sizes(launches: Sequence[tuple[int, ...]]) -> tuple[int | None, ...]:
    """Per number of the `Launch.sizes` of contractions sharing code, their common value, or
    None where they differ (the code reads it when it is called)."""
    return tuple(n[0] if len(set(n)) == 1 else None for n in zip(*launches))


def blocked_contraction(module: ir.Module, kernel: Kernel, symbol: str, operand_aliases: Sequence[int],
                        vector_bits: int, compiled_in: Sequence[int | None] | None = None) -> KernelFunction | None:
    """The kernel's function through the blocked path, or None when it does not apply; the
    numbers of its `Launch.sizes` that `compiled_in` gives (all: the kernel's own, by default)
    are constants of the code, the others read when it is called."""
    contraction = plan(kernel, vector_bits)
    if contraction is None:
        return None
    numbers = contraction.launch.sizes if compiled_in is None else compiled_in
    return MatmulBuilder(module, kernel, symbol, operand_aliases, contraction, numbers).build()
