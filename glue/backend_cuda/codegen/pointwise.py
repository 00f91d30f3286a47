"""Pointwise kernels on the GPU: one thread per group of `width` consecutive points of the
flattened domain (a 16-byte vector of the narrowest contiguous operand), a 1-d grid over the
groups. Values that do not vary along the innermost dim are computed once per group."""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import KernelEmitter, LaneGroup, Vectorization, pow2_at_least
from glue.codegen.loops import unflatten
from glue.codegen.types import I64

BLOCK = 256


def emit_pointwise(ke: KernelEmitter) -> tuple[int, int, str]:
    """Emit the body; returns (grid, block, strategy)."""
    k, b = ke.kernel, ke.b
    points = math.prod(k.parallel)
    v = len(k.parallel) - 1 if k.parallel else None
    vec = Vectorization(k, ke.analysis, v, k.parallel[-1] if k.parallel else 1)
    groups = points // vec.width
    block = min(BLOCK, max(32, pow2_at_least(groups)))
    group = b.add(b.mul(ke.block_index(), ir.Constant(I64, block)), ke.thread_index())
    with b.if_then(b.icmp_unsigned("<", group, ir.Constant(I64, groups))):
        first = b.mul(group, ir.Constant(I64, vec.width))
        lanes = LaneGroup(ke, vec, unflatten(b, first, k.parallel) if k.parallel else [])
        values = [s.value for s in k.stores]
        lanes.share_invariant(values)
        lanes.preload(values)
        for s in k.stores:
            lanes.store(s)
    b.ret_void()
    return -(-groups // block), block, f"pointwise x{vec.width}"
