"""A scheduler Plan as one LLVM module, and the buffer table its kernels read their operands from.

The table a call fills has one entry per program argument, one per fresh output, then the
arena: a value's memory-plan placement becomes a (table slot, byte offset) pair compiled into
the kernels that touch it, so one call builds one small table and every kernel reads from it.
A call kernel (control flow, a print) has no function: its step runs compiled bodies on the
same table entries (`calls.py`).
Each graph output is then either a fresh output buffer, a donated argument's buffer, a copy of an
argument (an output that is an input), or a literal.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from llvmlite import ir

from glue.backend_cpu.calls import CallSite
from glue.backend_cpu.kernels import KernelBuilder, KernelFunction, Operand
from glue.backend_cpu.matmul import blocked_contraction
from glue.backend_cpu.target import host
from glue.ir import TensorType
from glue.scheduler.calls import call_plan
from glue.scheduler.memory import Placement
from glue.scheduler.plan import Plan, Result


@dataclass
class Program:
    """The module (`llvm_ir`, with one function per kernel of glue's own: `functions`) and the
    program's steps in order: those functions, and call kernels (`CallSite`), which run
    compiled bodies."""

    plan: Plan
    llvm_ir: str
    functions: list[KernelFunction]
    steps: list[KernelFunction | CallSite]

    @property
    def arg_types(self) -> list[TensorType]:
        return self.plan.argument_types

    @property
    def output_types(self) -> list[TensorType]:
        return self.plan.output_types

    @property
    def results(self) -> list[Result]:
        return self.plan.results()


def _operand(p: Placement, n_args: int, arena_slot: int) -> Operand:
    if p.kind == "arena":
        return Operand(arena_slot, p.slot)
    return Operand(n_args + p.slot if p.kind == "output" else p.slot)


def _symbol(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def build_program(plan: Plan, name: str = "fn") -> Program:
    """Generate the module for `plan`: one function per kernel (see `kernels.py`)."""
    placements = plan.memory.placements
    n_args = len(plan.argument_types)
    arena_slot = n_args + len(plan.output_types)
    module = ir.Module(name=_symbol(name))
    module.triple, module.data_layout = host().triple, host().data_layout
    functions = []
    steps: list[KernelFunction | CallSite] = []
    vector_bits = host().vector_bits
    for i, kernel in enumerate(plan.kernels):
        inputs = [_operand(placements[b.value_id], n_args, arena_slot) for b in kernel.inputs]
        outs = [_operand(placements[b.value_id], n_args, arena_slot) for b in kernel.outputs]
        if kernel.call is not None:
            steps.append(CallSite(kernel, call_plan(kernel), inputs, outs))
            continue
        symbol = f"glue_{_symbol(name)}_{i}_{_symbol(kernel.name)}"[:120]
        built = None
        if kernel.kind == "contraction":
            built = blocked_contraction(module, kernel, symbol, inputs, outs, vector_bits)
        if built is None:
            built = KernelBuilder(module, kernel, symbol, inputs, outs).build()
        functions.append(built)
        steps.append(built)
    return Program(plan, str(module), functions, steps)
