"""Element access to a kernel's buffers, shared by the CPU and NVPTX kernel builders.

A builder that mixes this in holds `b` (its IRBuilder), `kernel`, and `in_ptrs` / `out_ptrs`
(one pointer value per input / output buffer).
"""
from __future__ import annotations

from llvmlite import ir

from glue.codegen.expr import ExprEmitter
from glue.codegen.types import from_memory, memory_type
from glue.ir.dtypes import DType
from glue.scheduler.kernel_ir import Store


class BufferAccess:
    def load(self, slot: int, offset: ir.Value, dtype: DType) -> ir.Value:
        """Element `offset` of input `slot`, in its register type."""
        ty = memory_type(dtype)
        at = self.b.gep(self.in_ptrs[slot], [offset], inbounds=True, source_etype=ty)
        return from_memory(self.b, self.b.load(at, typ=ty), dtype)

    def output_address(self, em: ExprEmitter, store: Store) -> ir.Value:
        """Where `store` writes, at the point `em` emits for."""
        buf = self.kernel.outputs[store.output]
        offset = em.offset(store.index, buf.type.shape)
        return self.b.gep(self.out_ptrs[store.output], [offset], inbounds=True,
                          source_etype=memory_type(buf.type.dtype))
