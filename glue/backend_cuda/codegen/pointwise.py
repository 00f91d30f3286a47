"""Pointwise kernels on the GPU: a thread computes up to `UNROLL` groups of `width` consecutive
points of the flattened domain (a group is one 16-byte vector of the narrowest contiguous
operand); the groups of a block are `BLOCK` apart, so each of a warp's accesses covers
consecutive memory, and a 1-d grid covers the domain. Values that do not vary along the
innermost dim are computed once per group. Kernels that transpose their one input take
transpose.py's tiles instead.

A long chain of math functions (LONG_MATH or more) is bound by its arithmetic, not its memory
traffic, so a thread computes one point, and the body is emitted once, bounds-checked: each lane
of a vector, each unrolled group and the unchecked copy for whole blocks would be another copy
of the body for LLVM and ptxas to compile (a 10,000-op tanh chain was 10 MB of PTX, 260 KB a
kernel, and 9.5 s to lower on two cores; now 2.6 MB and 3.0 s) for work that more threads of
the grid share as well."""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import KernelEmitter, LaneGroup, Vectorization, pow2_at_least, reachable, when
from glue.backend_cuda.codegen.transpose import emit_transpose, transpose_plan
from glue.codegen.loops import unflatten
from glue.codegen.types import I64
from glue.ir import primitive
from glue.scheduler.kernel_ir import Op

BLOCK = 128
UNROLL = 4
# Blocks of BLOCK threads that fill an H200 once (132 multiprocessors x 16). A thread unrolls
# only as many groups as keep at least this many blocks: unrolling a smaller grid leaves
# multiprocessors idle. The small step's AdamW updates of library weight gradients (2.6-9 MB)
# took 10.1-10.4 us on 16-64 blocks unrolled 4 times, 4.9 us unrolled once on 4x the blocks.
FULL_GRID = 2048
LONG_MATH = 16  # math functions (exp, tanh, ...) from which a body is compute-bound


def emit_pointwise(ke: KernelEmitter) -> tuple[int, int, str]:
    """Emit the body; returns (grid, block, strategy). A kernel that transposes its input runs
    in tiles through shared memory instead (transpose.py)."""
    plan = transpose_plan(ke.kernel, ke.analysis)
    if plan is not None:
        return emit_transpose(ke, plan)
    ke.await_producers()
    k, b = ke.kernel, ke.b
    points = math.prod(k.parallel)
    v = len(k.parallel) - 1 if k.parallel else None
    long_math = _math_functions(ke) >= LONG_MATH
    vec = Vectorization(k, ke.analysis, v if ke.aligned and not long_math else None, k.parallel[-1] if k.parallel else 1)
    groups = points // vec.width
    block = min(BLOCK, max(32, pow2_at_least(groups)))
    unroll = 1 if long_math else max(1, min(UNROLL, groups // (block * FULL_GRID)))
    per_block = block * unroll
    block_start = b.mul(ke.block_index(), ir.Constant(I64, per_block))
    base = b.add(block_start, ke.thread_index())
    values = [s.value for s in k.stores]

    def groups_of_thread(guarded: bool) -> None:
        for u in range(unroll):
            group = b.add(base, ir.Constant(I64, u * block)) if u else base
            with when(b, b.icmp_unsigned("<", group, ir.Constant(I64, groups)) if guarded else None):
                first = b.mul(group, ir.Constant(I64, vec.width))
                lanes = LaneGroup(ke, vec, unflatten(b, first, k.parallel) if k.parallel else [])
                lanes.share_invariant(values)
                lanes.preload(values)
                lanes.store_all(k.stores)

    if groups % per_block == 0:
        groups_of_thread(guarded=False)
    elif long_math:
        groups_of_thread(guarded=True)
    else:  # only the last block needs bounds checks; the others keep their loads unconditional
        whole = b.icmp_unsigned("<=", b.add(block_start, ir.Constant(I64, per_block)), ir.Constant(I64, groups))
        with b.if_else(whole) as (then, otherwise):
            with then:
                groups_of_thread(guarded=False)
            with otherwise:
                groups_of_thread(guarded=True)
    b.ret_void()
    return -(-groups // (block * unroll)), block, f"pointwise x{vec.width} unroll {unroll}"


def _math_functions(ke: KernelEmitter) -> int:
    """How many float math functions (exp, tanh, erf, ...) the kernel's body runs."""
    return sum(isinstance(e, Op) and e.dtype.is_float and primitive(e.primitive).expensive
               for e in reachable(ke.kernel, ke.analysis))
