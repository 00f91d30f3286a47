"""Scatter kernels on the GPU: one thread per point of the updates; each adds its update into
the output with an atomic add (output 0 already holds a copy of the `init` input: the executor
copies it before the launch unless both are the same memory). Additions to one element happen
in no fixed order, so float results may differ from run to run in the last bits.

32- and 64-bit types use the hardware atomics (`atomicrmw add / fadd`); 16-bit floats use a
compare-and-swap loop on the aligned 32-bit word that holds them, which every arch has.
"""
from __future__ import annotations

import math

from llvmlite import ir

from glue.backend_cuda.codegen.common import PTR1, KernelEmitter, when
from glue.codegen.expr import ExprEmitter, convert
from glue.codegen.loops import unflatten
from glue.codegen.types import I16, I32, I64, from_memory, memory_type, to_memory
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.scheduler.kernel_ir import Store

BLOCK = 256


def _atomic_add_16(b: ir.IRBuilder, address: ir.Value, value: ir.Value, dtype: DType) -> None:
    """*address += value for a 16-bit float, through a CAS loop on its containing word."""
    raw = b.ptrtoint(address, I64)
    word = b.inttoptr(b.and_(raw, ir.Constant(I64, ~3)), PTR1)
    shift = b.trunc(b.shl(b.and_(raw, ir.Constant(I64, 2)), ir.Constant(I64, 3)), I32)
    keep = b.xor(b.shl(ir.Constant(I32, 0xFFFF), shift), ir.Constant(I32, -1))
    start = b.load(word, typ=I32)
    before = b.block
    retry = b.append_basic_block("cas")
    done = b.append_basic_block("cas.done")
    b.branch(retry)
    b.position_at_end(retry)
    old = b.phi(I32)
    old.add_incoming(start, before)
    mem = memory_type(dtype)  # half, or i16 for bfloat16
    current = from_memory(b, b.bitcast(b.trunc(b.lshr(old, shift), I16), mem), dtype)
    updated = b.zext(b.bitcast(to_memory(b, b.fadd(current, value), dtype), I16), I32)
    new = b.or_(b.and_(old, keep), b.shl(updated, shift))
    result = b.cmpxchg(word, old, new, "monotonic", "monotonic")
    old.add_incoming(b.extract_value(result, 0), retry)
    b.cbranch(b.extract_value(result, 1), done, retry)
    b.position_at_end(done)


def _add(ke: KernelEmitter, em: ExprEmitter, store: Store) -> None:
    b = ke.b
    dtype = ke.kernel.outputs[store.output].type.dtype
    value = convert(b, em.value(store.value), store.value.dtype, dtype)
    # Everything the branch uses is computed before it, so later stores may reuse it.
    address = ke.output_address(em, store)
    with when(b, em.in_bounds(store.mask) if store.mask else None):
        if dtype in (dt.float16, dt.bfloat16):
            _atomic_add_16(b, address, value, dtype)
        else:
            b.atomic_rmw("fadd" if dtype.is_float else "add", address, to_memory(b, value, dtype), "monotonic")


def emit_data(ke: KernelEmitter) -> tuple[int, int, str]:
    """Emit a scatter kernel; returns (grid, block, strategy)."""
    ke.await_producers()
    k, b = ke.kernel, ke.b
    points = math.prod(k.parallel)
    point = b.add(b.mul(ke.block_index(), ir.Constant(I64, BLOCK)), ke.thread_index())
    with b.if_then(b.icmp_unsigned("<", point, ir.Constant(I64, points))):
        em = ke.emitter(unflatten(b, point, k.parallel) if k.parallel else [])
        for s in k.stores:
            if s.mode == "add":
                _add(ke, em, s)
            else:
                ke.store(em, s)
    b.ret_void()
    return -(-points // BLOCK), BLOCK, "scatter atomics"
