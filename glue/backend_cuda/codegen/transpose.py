"""Pointwise kernels that transpose: their inputs are contiguous along another domain dim than
their outputs, so the plain pointwise strategy (pointwise.py) would read them a column at a time.

Such a kernel (a contraction's operand written K-major, see library.py; a layout change the
scheduler could not fold into a view) runs in TILE x TILE tiles of the two dims through shared
memory: the block first reads the tile along the inputs' contiguous dim (`load_dim`), a warp a
run of TILE consecutive elements, into a padded shared array per load (a row of TILE + 1
words, so the transposed reads of the second phase fall in distinct banks); after a barrier it
computes the stores along the outputs' contiguous dim (the domain's last, `store_dim`), reading
the values transposed from shared memory. Both global accesses are then coalesced. In the
GPT-2-width f32 step on the H200, eight K-major copies of [4096, 768] weight-gradient operands
took 21 us each through the pointwise strategy; tiled, the step's pointwise kernels took 148 us
less in all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from glue.backend_cuda.codegen.common import KernelEmitter, flat_index, moves_in_runs, when
from glue.codegen.loops import unflatten
from glue.codegen.scope import Analysis
from glue.codegen.types import I64
from glue.scheduler.kernel_ir import Kernel, Load, loads_under

TILE = 32
ROWS_PER_PASS = 8  # the block is TILE x ROWS_PER_PASS threads; each thread moves TILE / 8 rows
MIN_EXTENT = TILE  # both dims at least one tile, or the plain strategy does as well
MAX_LOADS = 4  # tiles in shared memory, one per load (a concatenation's sources)


@dataclass(frozen=True)
class TransposePlan:
    """The loads a transposing kernel reads, the domain dim they are contiguous along, and the
    domain's last dim, along which the outputs are."""

    loads: tuple[Load, ...]
    load_dim: int
    store_dim: int


def transpose_plan(kernel: Kernel, analysis: Analysis) -> TransposePlan | None:
    """How `kernel` runs as a tiled transpose, or None where it is not one: a pointwise kernel
    of rank 2 or more whose plain stores all move with its last dim and whose input loads (at
    most MAX_LOADS: a copy, a cast, a concatenation) all move with one other dim and not with
    the last, over runs of a tile (`moves_in_runs`: a reshape's split dims count), both dims at
    least MIN_EXTENT."""
    if kernel.kind != "pointwise" or len(kernel.parallel) < 2 or kernel.reduce:
        return None
    last = len(kernel.parallel) - 1
    for store in kernel.stores:
        out_shape = kernel.outputs[store.output].type.shape
        if store.level != "element" or store.mode != "set" or \
                not moves_in_runs(flat_index(store.index, out_shape), last, TILE, analysis):
            return None
    loads = tuple(dict.fromkeys(loads_under([s.value for s in kernel.stores])))
    if not loads or len(loads) > MAX_LOADS or any(ld.dtype.itemsize > 8 for ld in loads):
        return None
    flats = [flat_index(ld.index, kernel.inputs[ld.input].type.shape) for ld in loads]
    if any(moves_in_runs(f, last, TILE, analysis) for f in flats):
        return None
    along = [v for v in range(last) if all(moves_in_runs(f, v, TILE, analysis) for f in flats)]
    if not along or kernel.parallel[along[0]] < MIN_EXTENT or kernel.parallel[last] < MIN_EXTENT:
        return None
    return TransposePlan(loads, along[0], last)


def emit_transpose(ke: KernelEmitter, plan: TransposePlan) -> tuple[int, int, str]:
    """Emit the tiled transpose; returns (grid, block, strategy)."""
    ke.await_producers()
    k, b = ke.kernel, ke.b
    ext = k.parallel
    d, s = plan.load_dim, plan.store_dim
    others = [v for v in range(len(ext)) if v not in (d, s)]
    tiles_d, tiles_s = -(-ext[d] // TILE), -(-ext[s] // TILE)
    grid = math.prod(ext[v] for v in others) * tiles_d * tiles_s

    def const(n: int) -> ir.Constant:
        return ir.Constant(I64, n)

    *outer, tile_d, tile_s = unflatten(b, ke.block_index(), [ext[v] for v in others] + [tiles_d, tiles_s])
    d0, s0 = b.mul(tile_d, const(TILE)), b.mul(tile_s, const(TILE))
    thread = ke.thread_index()
    lane, row = b.urem(thread, const(TILE)), b.udiv(thread, const(TILE))

    def point(at_d: ir.Value, at_s: ir.Value) -> list[ir.Value | None]:
        dims: list[ir.Value | None] = [None] * len(ext)
        for v, c in zip(others, outer):
            dims[v] = c
        dims[d], dims[s] = at_d, at_s
        return dims

    def inside(at_d: ir.Value, at_s: ir.Value) -> ir.Value:
        return b.and_(b.icmp_unsigned("<", at_d, const(ext[d])), b.icmp_unsigned("<", at_s, const(ext[s])))

    # Phase 1: lanes along the loads' contiguous dim; per load tile[s][d], a row padded by one
    # element (each array is made once its first value shows the register type).
    tiles: list[ir.Value | None] = [None] * len(plan.loads)
    types: list[ir.Type | None] = [None] * len(plan.loads)
    for r in range(0, TILE, ROWS_PER_PASS):
        local_s = b.add(row, const(r))
        at_d, at_s = b.add(d0, lane), b.add(s0, local_s)
        with when(b, inside(at_d, at_s)):
            em = ke.emitter(point(at_d, at_s))
            for i, load in enumerate(plan.loads):
                value = em.value(load)
                if tiles[i] is None:
                    tiles[i], types[i] = ke.shared(value.type, TILE * (TILE + 1)), value.type
                b.store(value, ke.shared_at(tiles[i], b.add(b.mul(local_s, const(TILE + 1)), lane), types[i]))
    ke.barrier()
    # Phase 2: lanes along the outputs' dim, the values read back transposed.
    for r in range(0, TILE, ROWS_PER_PASS):
        local_d = b.add(row, const(r))
        at_d, at_s = b.add(d0, local_d), b.add(s0, lane)
        with when(b, inside(at_d, at_s)):
            em = ke.emitter(point(at_d, at_s))
            at = b.add(b.mul(lane, const(TILE + 1)), local_d)
            for load, tile, ty in zip(plan.loads, tiles, types):
                em.memo[load] = b.load(ke.shared_at(tile, at, ty), typ=ty)
            ke.store_all(em, k.stores)
    b.ret_void()
    return grid, TILE * ROWS_PER_PASS, f"transpose {TILE}x{TILE} tiles through shared memory"


__all__ = ["MAX_LOADS", "TILE", "TransposePlan", "emit_transpose", "transpose_plan"]
