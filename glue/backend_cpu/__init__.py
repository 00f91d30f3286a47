"""The `cpu` backend: the host CPU through LLVM (llvmlite).

`CpuBackend.lower(graph)` schedules the graph (passes, fusion, memory plan; `glue.scheduler`)
and generates one LLVM module for it (`program.py`, `kernels.py`, `matmul.py`); `compile()`
turns the module into machine code through the disk cache (`target.py`, `cache.py`) and
returns an `Executable` (`runtime.py`). Stages: the scheduler's, "llvm" (the module as
generated, before optimisation) and "asm" (the host assembly after the O3 pipeline).
"""
from __future__ import annotations

from functools import cached_property
from typing import Sequence

from glue.backend_cpu.program import Program, build_program
from glue.backend_cpu.runtime import Executable
from glue.codegen.analysis import CostAnalysis, MemoryAnalysis, estimate_cost
from glue.backend_cpu.target import LoadedCode, assembly, host, object_code
from glue.errors import BackendError
from glue.ir import Graph
from glue.scheduler.plan import STAGES, Plan, schedule


class CpuLowered:
    """A program scheduled and generated for the host CPU, not yet compiled to machine code."""

    stages: tuple[str, ...] = STAGES + ("llvm", "asm")

    def __init__(self, graph: Graph, donated: Sequence[int], name: str):
        self.name = name
        self.plan: Plan = schedule(graph, tuple(donated))

    @cached_property
    def program(self) -> Program:
        return build_program(self.plan, self.name)

    def as_text(self, stage: str) -> str:
        if stage == "llvm":
            return self.program.llvm_ir
        if stage == "asm":
            return assembly(self.program.llvm_ir)
        if stage in STAGES:
            return self.plan.as_text(stage)
        raise KeyError(stage)

    def compile(self) -> Executable:
        code, _ = object_code(self.program.llvm_ir)
        code = LoadedCode(code, [f.symbol for f in self.program.functions])
        return Executable(self.program, code, estimate_cost(self.plan))


class CpuBackend:
    name = "cpu"

    @staticmethod
    def is_available() -> bool:
        try:
            host()
        except BackendError:
            return False
        return True

    def lower(self, graph: Graph, *, donated: Sequence[int] = (), name: str = "fn") -> CpuLowered:
        return CpuLowered(graph, donated, name)


__all__ = ["CpuBackend", "CpuLowered", "CostAnalysis", "Executable", "MemoryAnalysis"]
