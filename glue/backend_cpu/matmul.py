"""Cache-blocked, vectorised code for contraction kernels (matmul, batched matmul).

A contraction kernel folds `left * right` over its reduce dims, where `left` depends on the
batch and row dims (I) and `right` on the batch and column dims (J); its stores (the epilogue:
bias, activation, cast, residual) use the sum at each output point. Flattened, that is
C[b, m, n] = sum_k A[b, m, k] B[b, k, n] with M, N, K the products of the I, J and reduce
extents, whatever the operands' layouts.

Work is split into units (batch, block of rows, block of NC columns). A unit packs its
K x NC block of `right` into NR-wide column panels (evaluating the right-hand expression, so
casts and transposes are applied while packing), then for each MR-row micro-panel packs
`left` the same way and runs a register-blocked micro-kernel: MR x NR accumulators in
vector registers, one broadcast of A and NR/VL vector loads of B and MR*NR/VL fused
multiply-adds per step of k. The micro-panel's sums land in a small buffer, and the epilogue
runs over it as an ordinary loop over the columns, which LLVM vectorises, storing straight into
the outputs. NC is chosen so that a packed block of B stays in the L2 cache; each packed
A micro-panel stays in L1. Sums over k run in order, so results do not depend on the blocking.
"""
from __future__ import annotations

import math
from typing import Sequence

from llvmlite import ir

from glue.backend_cpu.kernels import KernelBuilder, KernelFunction, Operand, interleave_for
from glue.backend_cpu.target import thread_count
from glue.codegen.expr import ExprEmitter, convert, intrinsic
from glue.codegen.loops import loop, unflatten
from glue.codegen.scope import Analysis, hoist
from glue.codegen.types import I1, I8, I32, I64, register_type
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Expr, Kernel, Op

MR = 6  # rows of a micro-tile: 6 x 2 vectors of accumulators + 3 operands fit 16 registers
L2_BUDGET = 256 * 1024  # bytes of packed B a unit may keep hot
MIN_WORK = 16 * 1024  # multiply-adds below which the plain per-element loops do as well
MIN_ROWS_PER_UNIT = 4 * MR
MIN_PANELS_PER_UNIT = 4


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


class MatmulBuilder(KernelBuilder):
    """Emits a contraction kernel as packed, register-blocked loops (see the module doc)."""

    def __init__(self, module: ir.Module, kernel: Kernel, symbol: str, inputs: Sequence[Operand],
                 outputs: Sequence[Operand], parts, vector_bits: int):
        super().__init__(module, kernel, symbol, inputs, outputs)
        self.left, self.right, self.batch, self.row_dims, self.col_dims = parts
        self.acc = kernel.reductions[0].dtype
        self.ty = register_type(self.acc)
        self.size = self.acc.itemsize
        self.lanes = vector_bits // (8 * self.size)
        self.nr = 2 * self.lanes
        ext = kernel.parallel
        self.B = math.prod(ext[k] for k in self.batch)
        self.M = math.prod(ext[k] for k in self.row_dims)
        self.N = math.prod(ext[k] for k in self.col_dims)
        self.K = math.prod(kernel.reduce)
        # Units: enough for every thread to get two (for balance), split first along the
        # columns (each unit packs only its own block of B), then along the rows.
        wanted = 2 * thread_count()
        nc = max(self.nr, L2_BUDGET // max(1, self.K * self.size) // self.nr * self.nr)
        if self.B * -(-self.N // nc) < wanted:
            per_batch = -(-wanted // self.B)
            nc = min(nc, max(MIN_PANELS_PER_UNIT * self.nr, _round_up(-(-self.N // per_batch), self.nr)))
        self.nc = min(nc, _round_up(self.N, self.nr))
        self.n_blocks = -(-self.N // self.nc)
        parts = max(1, -(-wanted // (self.B * self.n_blocks)))
        self.mb = min(_round_up(self.M, MR), max(MIN_ROWS_PER_UNIT, _round_up(-(-self.M // parts), MR)))
        self.m_blocks = -(-self.M // self.mb)
        # Per-thread scratch: packed B block, packed A micro-panel, micro-panel sums.
        self.b_bytes = _round64(self.K * self.nc * self.size)
        self.a_bytes = _round64(self.K * MR * self.size)
        self.scratch_bytes = self.b_bytes + self.a_bytes + _round64(MR * self.nc * self.size)

    # --- helpers --------------------------------------------------------------------------
    def const(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def element(self, base: ir.Value, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [index], inbounds=True, source_etype=self.ty)

    def point(self, bc: list[ir.Value], m: ir.Value | None, n: ir.Value | None,
              k: ir.Value | None) -> list[ir.Value | None]:
        """Domain dims for batch coords, flat row m, flat column n and flat reduce index k."""
        dims: list[ir.Value | None] = [None] * self.kernel.rank
        ext = self.kernel.parallel
        for d, c in zip(self.batch, bc):
            dims[d] = c
        for group, flat in ((self.row_dims, m), (self.col_dims, n)):
            if flat is not None and group:
                for d, c in zip(group, unflatten(self.b, flat, [ext[d] for d in group])):
                    dims[d] = c
        if k is not None:
            p = len(ext)
            for d, c in enumerate(unflatten(self.b, k, self.kernel.reduce)):
                dims[p + d] = c
        return dims

    def value_at(self, e: Expr, dims: list[ir.Value | None]) -> ir.Value:
        em = ExprEmitter(self.b, dims, self.shapes, self.load)
        return em.value(e)

    def zero_fill(self, base: ir.Value, count: int) -> None:
        memset = self.b.module.globals.get("llvm.memset.p0.i64") or ir.Function(
            self.b.module, ir.FunctionType(ir.VoidType(), [base.type, I8, I64, I1]), "llvm.memset.p0.i64")
        self.b.call(memset, [base, ir.Constant(I8, 0), self.const(count * self.size), ir.Constant(I1, 0)])

    # --- the kernel -----------------------------------------------------------------------
    def build(self) -> KernelFunction:
        source = self.kernel
        self.use_reciprocals(frozenset(self.col_dims))
        units = self.B * self.m_blocks * self.n_blocks
        with self.b.if_then(self.b.icmp_signed("<", self.start, self.end)):
            loop(self.b, self.start, self.end, self.unit, name="unit", vectorize=False)
        self.b.ret_void()
        return KernelFunction(source, self.symbol, units, 1, 2.0 * self.B * self.M * self.N * self.K,
                              scratch_bytes=self.scratch_bytes)

    def unit(self, b: ir.IRBuilder, u: ir.Value, _) -> list:
        bb, mblk, nblk = unflatten(b, u, [self.B, self.m_blocks, self.n_blocks])
        bc = unflatten(b, bb, [self.kernel.parallel[d] for d in self.batch]) if self.batch else []
        m0 = b.mul(mblk, self.const(self.mb))
        n0 = b.mul(nblk, self.const(self.nc))
        m_len = _min(b, self.const(self.mb), b.sub(self.const(self.M), m0))
        n_len = _min(b, self.const(self.nc), b.sub(self.const(self.N), n0))
        packed_b = self.scratch_at(0)
        self.pack_b(bc, n0, n_len, packed_b)
        panels = b.udiv(b.add(n_len, self.const(self.nr - 1)), self.const(self.nr))
        micro = b.udiv(b.add(m_len, self.const(MR - 1)), self.const(MR))

        def micro_panel(b: ir.IRBuilder, i: ir.Value, _):
            row0 = b.add(m0, b.mul(i, self.const(MR)))
            height = _min(b, self.const(MR), b.sub(b.add(m0, m_len), row0))
            packed_a = self.scratch_at(self.b_bytes)
            sums = self.scratch_at(self.b_bytes + self.a_bytes)
            self.pack_a(bc, row0, height, packed_a)

            def panel(b: ir.IRBuilder, p: ir.Value, _):
                self.micro_kernel(packed_a, self.element(packed_b, b.mul(p, self.const(self.K * self.nr))),
                                  self.element(sums, b.mul(p, self.const(self.nr))))
                return []
            loop(b, 0, panels, panel, name="panel", vectorize=False)
            self.epilogue(bc, row0, height, n0, n_len, sums)
            return []
        loop(b, 0, micro, micro_panel, name="micro", vectorize=False)
        return []

    def pack_b(self, bc, n0, n_len, packed) -> None:
        """packed[p][k][jj] = right(k, n0 + p*NR + jj), zero past the last column."""
        b, nr, K = self.b, self.nr, self.K
        tail = b.urem(n_len, self.const(nr))
        full = b.udiv(n_len, self.const(nr))
        with b.if_then(b.icmp_unsigned("!=", tail, self.const(0))):
            self.zero_fill(self.element(packed, b.mul(full, self.const(K * nr))), K * nr)
        panels = b.udiv(b.add(n_len, self.const(nr - 1)), self.const(nr))

        def panel(b: ir.IRBuilder, p: ir.Value, _):
            col0 = b.add(n0, b.mul(p, self.const(nr)))
            width = _min(b, self.const(nr), b.sub(b.add(n0, n_len), col0))
            base = b.mul(p, self.const(K * nr))

            def step(b: ir.IRBuilder, k: ir.Value, _):
                row = b.add(base, b.mul(k, self.const(nr)))

                def column(b: ir.IRBuilder, jj: ir.Value, _):
                    value = self.value_at(self.right, self.point(bc, None, b.add(col0, jj), k))
                    b.store(convert(b, value, self.right.dtype, self.acc), self.element(packed, b.add(row, jj)))
                    return []
                loop(b, 0, width, column, name="jj")
                return []
            loop(b, 0, K, step, name="k", vectorize=False)
            return []
        loop(b, 0, panels, panel, name="bpanel", vectorize=False)

    def pack_a(self, bc, row0, height, packed) -> None:
        """packed[k][mm] = left(row0 + mm, k), zero past the last row."""
        b = self.b
        with b.if_then(b.icmp_unsigned("<", height, self.const(MR))):
            self.zero_fill(packed, self.K * MR)

        def row(b: ir.IRBuilder, mm: ir.Value, _):
            m = b.add(row0, mm)

            def step(b: ir.IRBuilder, k: ir.Value, _):
                value = self.value_at(self.left, self.point(bc, m, None, k))
                at = b.add(b.mul(k, self.const(MR)), mm)
                b.store(convert(b, value, self.left.dtype, self.acc), self.element(packed, at))
                return []
            loop(b, 0, self.K, step, name="ka")
            return []
        loop(b, 0, height, row, name="mm", vectorize=False)

    def micro_kernel(self, packed_a: ir.Value, packed_b: ir.Value, sums: ir.Value) -> None:
        """sums[mm][v*VL : (v+1)*VL] = sum over k of A[k][mm] * B[k][v*VL : (v+1)*VL]."""
        b, lanes, vectors = self.b, self.lanes, self.nr // self.lanes
        vt = ir.VectorType(self.ty, lanes)
        fma = intrinsic(b.module, "llvm.fma", vt, [vt] * 3, [vt])
        zero = ir.Constant(vt, [0.0] * lanes)
        splat_mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)

        def step(b: ir.IRBuilder, k: ir.Value, accs: list[ir.Value]):
            row = b.mul(k, self.const(self.nr))
            bv = [b.load(self.element(packed_b, b.add(row, self.const(v * lanes))), typ=vt, align=self.size)
                  for v in range(vectors)]
            out = []
            for mm in range(MR):
                a = b.load(self.element(packed_a, b.add(b.mul(k, self.const(MR)), self.const(mm))), typ=self.ty)
                av = b.shuffle_vector(b.insert_element(ir.Constant(vt, None), a, ir.Constant(I32, 0)),
                                      ir.Constant(vt, None), splat_mask)
                out += [b.call(fma, [av, bv[v], accs[mm * vectors + v]]) for v in range(vectors)]
            return out
        accs = loop(b, 0, self.K, step, [zero] * (MR * vectors), name="kk", vectorize=False)
        for mm in range(MR):
            for v in range(vectors):
                at = self.element(sums, self.const(mm * self.nc + v * lanes))
                b.store(accs[mm * vectors + v], at, align=self.size)

    def epilogue(self, bc, row0, height, n0, n_len, sums) -> None:
        """The kernel's stores at every point of the micro-panel, with the sums as row value 0."""
        k = self.kernel
        values = [s.value for s in k.stores]
        cols = frozenset(self.col_dims)
        spread = interleave_for(values, self.analysis, cols)

        def row(b: ir.IRBuilder, mm: ir.Value, _):
            m = b.add(row0, mm)
            outer = ExprEmitter(b, self.point(bc, m, None, None), self.shapes, self.load)
            outer.rows = [None]
            hoist(outer, values, self.analysis, cols, frozenset((0,)))
            line = b.mul(mm, self.const(self.nc))

            def column(b: ir.IRBuilder, j: ir.Value, _):
                em = self.emitter(self.point(bc, m, b.add(n0, j), None), outer)
                em.rows = [b.load(self.element(sums, b.add(line, j)), typ=self.ty)]
                self.store_all(em, k.stores)
                return []
            loop(b, 0, n_len, column, name="n", interleave=spread)
            return []
        loop(self.b, 0, height, row, name="em", vectorize=False)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _round64(n: int) -> int:
    return _round_up(n, 64)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def blocked_contraction(module: ir.Module, kernel: Kernel, symbol: str, inputs: Sequence[Operand],
                        outputs: Sequence[Operand], vector_bits: int) -> KernelFunction | None:
    """The kernel's function through the blocked path, or None when it does not apply."""
    parts = _split(kernel, Analysis())
    if parts is None:
        return None
    work = math.prod(kernel.parallel + kernel.reduce)
    ext = kernel.parallel
    n = math.prod(ext[d] for d in parts[4])
    lanes = vector_bits // (8 * kernel.reductions[0].dtype.itemsize)
    if work == 0 or work < MIN_WORK or n < lanes:
        return None
    return MatmulBuilder(module, kernel, symbol, inputs, outputs, parts, vector_bits).build()
