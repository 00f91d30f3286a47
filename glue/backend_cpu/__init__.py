"""The `cpu` backend: the host CPU through LLVM (llvmlite).

Stages (the backend contract's table, `glue.backend.contract`): the scheduler's ("plan" and its
views: optimized, fusion, kernels, streams, memory, graph), "llvm" (one LLVM module for the
program as generated: `program.py`, `kernels.py`, `matmul.py`), "asm" (the host assembly after
the O3 pipeline) and the internal "object" (native object code, through the disk cache:
`target.py`). Loading links the object into the process and gives an `Executable`
(`runtime.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from glue.backend.contract import Backend, Lowering, Options, add_plan_stages
from glue.backend_cpu.calls import CallSite
from glue.backend_cpu.program import Program, build_program
from glue.backend_cpu.runtime import Executable
from glue.backend_cpu.target import LoadedCode, assembly, host, object_code
from glue.codegen.analysis import estimate_cost
from glue.errors import BackendError
from glue.ir import Graph


@dataclass(frozen=True)
class CpuOptions(Options):
    opt_level: int = 3


class CpuBackend(Backend):
    name = "cpu"
    Options = CpuOptions

    @classmethod
    def can_run(cls) -> bool:
        try:
            host()
        except BackendError:
            return False
        return True

    @classmethod
    def why_not(cls) -> str:
        return "LLVM cannot generate code for this host"

    def add_stages(self, lowering: Lowering) -> None:
        add_plan_stages(lowering)
        lowering.add_stage("llvm", lambda lw: build_program(lw["plan"], lw.name), text=_llvm_text)
        lowering.add_stage("asm", lambda lw: assembly(lw["llvm"].llvm_ir))
        lowering.add_stage("object", _object, text=None)

    def load(self, lowering: Lowering) -> Executable:
        program: Program = lowering["llvm"]
        code = LoadedCode(lowering["object"], [f.symbol for f in program.functions])
        bodies = {k: [self.body(graph, lowering.options) for graph in step.plan.bodies]
                  for k, step in enumerate(program.steps) if isinstance(step, CallSite)}
        return Executable(program, code, estimate_cost(lowering["plan"]), bodies)

    @lru_cache(maxsize=256)
    def body(self, graph: Graph, options: CpuOptions) -> Executable:
        """The executable of a call kernel's body, compiled once for every program using it."""
        return Lowering(self, graph, (), "body", options).compile()


def _llvm_text(program: Program) -> str:
    return program.llvm_ir


def _object(lowering: Lowering) -> bytes:
    code, hit = object_code(lowering["llvm"].llvm_ir, lowering.options.key)
    if hit:
        lowering.note_cached("object")
    return code


__all__ = ["CpuBackend", "CpuOptions", "Executable"]
