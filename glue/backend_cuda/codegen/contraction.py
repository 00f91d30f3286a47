"""Contractions on the GPU: a shared-memory tiled kernel with the fused epilogue, on CUDA cores;
products of 16-bit operands go to tensor cores instead (`mma.py`).

The kernel's one reduction folds `A * B` over the contracting dims, where A (the lhs with its
cast prologue) does not use the rhs's free dims and B does not use the lhs's. The output's
parallel dims split into M (used by A only), N (used by B only) and batch dims (the rest). A
block computes a TM x TN tile of one batch: each step of the loop over K stages a TM x TK tile
of A and a TK x TN tile of B in shared memory (operands already converted to the accumulator
type), then every thread accumulates its RM x RN outputs, which sit SM = TM / RM rows and
SN = TN / RN columns apart so that a warp reads consecutive shared-memory words. The epilogue
(bias, activation, cast, residual: the kernel's row-level stores) runs on the accumulators.

Tiles are 64 x 64 x 16 for large products. A small product (the matmuls of a small-batch
training step) would then fill a few multiprocessors and leave the rest idle, so its tiles
shrink (down to 8 x 8) until about one block per multiprocessor exists, and its steps over
K deepen (up to 256) so that the loop, bound by the latency of its loads, takes few trips.
"""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import Coordinates, KernelEmitter, pow2_at_least, when
from glue.backend_cuda.codegen.mma import emit_mma
from glue.codegen import reductions
from glue.codegen.loops import loop, unflatten
from glue.codegen.types import I64, register_type
from glue.scheduler.kernel_ir import Expr, Op
from glue.settings import config

TILE = 64
MIN_TILE = 8
TK = 16
MAX_TK = 256
STAGED_PER_THREAD = 64  # operand elements a thread stages per step of K on a small tile
SMEM_BUDGET = 40 << 10  # bytes of staged tiles: under the 48 KiB a block gets without opting in
MICRO = 4
MIN_THREADS = 64
K_SLICES = 4  # thread groups that share a small tile, each taking a quarter of every K step
MIN_BLOCKS = 128  # about one block per multiprocessor: below that, smaller tiles finish sooner


def split_operands(ke: KernelEmitter) -> tuple[Expr, Expr, list[int], list[int], list[int]] | None:
    """(A, B, M dims, N dims, batch dims) of a contraction, or None if its reduction is not a
    product of two operands that each miss the other's free dims."""
    k = ke.kernel
    if len(k.reductions) != 1 or k.reductions[0].op != "sum":
        return None
    value = k.reductions[0].value
    if not (isinstance(value, Op) and value.primitive == "mul" and len(value.args) == 2):
        return None
    a, b = value.args
    used_a, used_b = ke.analysis.uses(a), ke.analysis.uses(b)
    if used_a.rows or used_b.rows:
        return None
    p = range(len(k.parallel))
    m = [d for d in p if d in used_a.dims and d not in used_b.dims]
    n = [d for d in p if d in used_b.dims and d not in used_a.dims]
    return a, b, m, n, [d for d in p if d not in m and d not in n]


def emit_contraction(ke: KernelEmitter) -> tuple[int, int, str] | None:
    """Emit the tiled kernel; None when the kernel does not have a contraction's shape."""
    split = split_operands(ke)
    if split is None:
        return None
    a_expr, b_expr, m_dims, n_dims, batch_dims = split
    if config.cuda_tensor_cores:
        shape = emit_mma(ke, a_expr, b_expr, m_dims, n_dims, batch_dims)
        if shape is not None:
            return shape
    k, b = ke.kernel, ke.b
    extent = lambda dims: math.prod(k.parallel[d] for d in dims)  # noqa: E731
    m_size, n_size, batches, depth = extent(m_dims), extent(n_dims), extent(batch_dims), math.prod(k.reduce)
    tm, tn = min(TILE, pow2_at_least(m_size)), min(TILE, pow2_at_least(n_size))
    while batches * -(-m_size // tm) * -(-n_size // tn) < MIN_BLOCKS and max(tm, tn) > MIN_TILE:
        if tm >= tn:  # a small product is latency-bound: spread it over more multiprocessors
            tm //= 2
        else:
            tn //= 2
    rm, rn = min(MICRO, tm), min(MICRO, tn)
    while (tm // rm) * (tn // rn) < MIN_THREADS and (rm > 1 or rn > 1):
        if rn >= rm:
            rn //= 2
        else:
            rm //= 2
    sm, sn = tm // rm, tn // rn
    # A small tile's loop over K is latency-bound (load, barrier, a few multiply-adds, barrier):
    # deeper steps issue more independent loads at once and take fewer trips round the loop,
    # and slicing each step's K among several thread groups puts more warps on the
    # multiprocessor to hide the latency (the slices' sums are added at the end).
    small = tm * tn < TILE * TILE
    slices = K_SLICES if small and depth >= K_SLICES * TK else 1
    threads = sm * sn * slices
    tk = TK
    while small and tk < min(MAX_TK, pow2_at_least(depth)) and 2 * tk * (tm + tn) <= STAGED_PER_THREAD * threads \
            and 2 * tk * (tm + 1 + tn) * 4 + slices * tm * tn * 4 <= SMEM_BUDGET:
        tk *= 2
    per_slice = tk // slices
    tiles_m, tiles_n = -(-m_size // tm), -(-n_size // tn)
    reduction = k.reductions[0]
    acc_type = register_type(reduction.dtype)
    a_tile = ke.shared(acc_type, tk * (tm + 1))
    b_tile = ke.shared(acc_type, tk * tn)
    c = lambda v: ir.Constant(I64, v)  # noqa: E731

    batch, tile_m, tile_n = unflatten(b, ke.block_index(), [batches, tiles_m, tiles_n])
    tid = ke.thread_index()
    group = sm * sn
    local, piece = (b.urem(tid, c(group)), b.udiv(tid, c(group))) if slices > 1 else (tid, c(0))
    tx, ty = b.urem(local, c(sn)), b.udiv(local, c(sn))
    a_base = b.add(ty, b.mul(piece, c(per_slice * (tm + 1))))
    b_base = b.add(tx, b.mul(piece, c(per_slice * tn)))
    m0, n0 = b.mul(tile_m, c(tm)), b.mul(tile_n, c(tn))
    point = Coordinates(ke, m_dims, n_dims, batch_dims, batch).point

    def stage(tile: ir.Value, expr: Expr, k0: ir.Value, size: int, is_a: bool) -> None:
        """Evaluate an operand on its tile into shared memory: A's tile is TM x TK with K
        fastest (the lhs's usual layout), B's TK x TN with N fastest; out-of-range points are 0."""
        count = tk * (tm if is_a else tn)
        for q in range(-(-count // threads)):
            e = b.add(tid, c(q * threads))
            in_tile = b.icmp_unsigned("<", e, c(count))
            if is_a:
                kk, i = b.urem(e, c(tk)), b.udiv(e, c(tk))
                slot = b.add(b.mul(kk, c(tm + 1)), i)
            else:
                i, kk = b.urem(e, c(tn)), b.udiv(e, c(tn))
                slot = b.add(b.mul(kk, c(tn)), i)
            outer = b.add(m0 if is_a else n0, i)
            kidx = b.add(k0, kk)
            ok = b.and_(b.icmp_unsigned("<", outer, c(size)), b.icmp_unsigned("<", kidx, c(depth)))
            ok = b.and_(ok, in_tile)
            outer = b.select(ok, outer, c(0))
            kidx = b.select(ok, kidx, c(0))
            em = ke.emitter(point(outer, None, kidx) if is_a else point(None, outer, kidx))
            value = b.select(ok, em.value(expr), reductions.identity("sum", reduction.dtype))
            with when(b, in_tile if count % threads else None):
                b.store(value, ke.shared_at(tile, slot, acc_type))

    def multiply(accs: list[ir.Value]) -> list[ir.Value]:
        """Accumulate this thread's outputs over the staged step of K."""
        accs = list(accs)
        for kk in range(per_slice):
            a_vals = [b.load(ke.shared_at(a_tile, b.add(a_base, c(kk * (tm + 1) + i * sm)), acc_type), typ=acc_type)
                      for i in range(rm)]
            b_vals = [b.load(ke.shared_at(b_tile, b.add(b_base, c(kk * tn + j * sn)), acc_type), typ=acc_type)
                      for j in range(rn)]
            for i in range(rm):
                for j in range(rn):
                    product = b.fmul(a_vals[i], b_vals[j]) if reduction.dtype.is_float else b.mul(a_vals[i], b_vals[j])
                    accs[i * rn + j] = reductions.combine(b, "sum", accs[i * rn + j], product, reduction.dtype)
        return accs

    def step(b: ir.IRBuilder, kstep: ir.Value, accs: list[ir.Value]):
        k0 = b.mul(kstep, c(tk))
        stage(a_tile, a_expr, k0, m_size, True)
        stage(b_tile, b_expr, k0, n_size, False)
        ke.barrier()
        accs = multiply(accs)
        ke.barrier()
        return accs

    zero = reductions.identity("sum", reduction.dtype)
    operands = [(a_tile, a_expr, m_size, True), (b_tile, b_expr, n_size, False)]
    constant = [ke.reads_only_constants(expr) for _, expr, _, _ in operands]
    if depth <= tk and any(constant):
        # One step covers K: an operand that only reads constant inputs (the weights of a
        # training step) is staged before waiting for the kernel producing the other one, so
        # under a dependent launch its loads overlap that kernel's tail.
        for early in (True, False):
            for (tile, expr, size, is_a), const in zip(operands, constant):
                if const is early:
                    stage(tile, expr, c(0), size, is_a)
            if early:
                ke.await_producers()
        ke.barrier()
        accs = multiply([zero] * (rm * rn))
    else:
        ke.await_producers()
        accs = loop(b, 0, -(-depth // tk), step, [zero] * (rm * rn), name="kstep", vectorize=False)
    first = None
    if slices > 1:  # slice 0 adds the other slices' sums to its own, in slice order
        partial = ke.shared(acc_type, slices * group * rm * rn)
        for q in range(rm * rn):
            slot = b.add(b.mul(b.add(b.mul(c(q), c(slices)), piece), c(group)), local)
            b.store(accs[q], ke.shared_at(partial, slot, acc_type))
        ke.barrier()
        first = b.icmp_unsigned("==", piece, c(0))
        for q in range(rm * rn):
            for p in range(1, slices):
                other = b.load(ke.shared_at(partial, b.add(c((q * slices + p) * group), local), acc_type),
                               typ=acc_type)
                accs[q] = reductions.combine(b, "sum", accs[q], other, reduction.dtype)
    for i in range(rm):
        for j in range(rn):
            m = b.add(m0, b.add(ty, c(i * sm)))
            n = b.add(n0, b.add(tx, c(j * sn)))
            ok = b.and_(b.icmp_unsigned("<", m, c(m_size)), b.icmp_unsigned("<", n, c(n_size)))
            ok = b.and_(ok, first) if first is not None else ok
            with b.if_then(ok):
                dims = point(m, n, None)[:len(k.parallel)] + [None] * len(k.reduce)
                em = ke.emitter(dims)
                em.rows = [accs[i * rn + j]]
                ke.store_all(em, k.stores)
    b.ret_void()
    sliced = f" k-slices {slices}" if slices > 1 else ""
    return batches * tiles_m * tiles_n, threads, f"tiled {tm}x{tn}x{tk} micro {rm}x{rn}{sliced}"
