"""The `cuda` backend: NVIDIA GPUs through LLVM's NVPTX target and the CUDA driver API.

`CudaBackend.lower(graph)` schedules the graph (`glue.scheduler`) and generates one LLVM module
for it (`codegen/`); stages "llvm" and "ptx" print the module and the PTX for the target arch
(the GPU's when there is one, else sm_90), which needs no GPU. `compile()` loads the PTX and
returns a `CudaExecutable` (`executor.py`). `runtime/` holds what runs programs (contexts,
modules, launches, allocator, streams, transfers, device buffers); `ptx.py` turns LLVM IR into
PTX.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

from glue.backend_cuda.codegen import CudaProgram, build_program
from glue.backend_cuda.ptx import DEFAULT_ARCH, PTX_FEATURES, ptx_for_module
from glue.backend_cuda.runtime import driver
from glue.codegen.analysis import estimate_cost
from glue.ir import Graph
from glue.scheduler.plan import STAGES, Plan, schedule
from glue.scheduler.streams import MAX_STREAMS


def target_arch() -> str:
    """The PTX target: the default GPU's arch when glue knows it, else sm_90."""
    if driver.available():
        from glue.backend_cuda.runtime.context import get_context

        arch = get_context().device.arch
        if arch in PTX_FEATURES:
            return arch
    return DEFAULT_ARCH


class CudaLowered:
    """A program scheduled and generated for NVIDIA GPUs, not yet loaded on one."""

    stages: tuple[str, ...] = STAGES + ("llvm", "ptx")

    def __init__(self, graph: Graph, donated: Sequence[int], name: str, arch: str | None = None):
        self.name = name
        self.arch = arch or target_arch()
        self.plan: Plan = schedule(graph, tuple(donated), MAX_STREAMS)

    @cached_property
    def program(self) -> CudaProgram:
        return build_program(self.plan, self.name, self.arch)

    @cached_property
    def ptx(self) -> str:
        if not self.program.launches:  # every output is an argument or a literal
            return "// this program runs no kernels\n"
        return ptx_for_module(self.program.llvm_ir, self.arch)

    def as_text(self, stage: str) -> str:
        if stage == "llvm":
            return self.program.llvm_ir
        if stage == "ptx":
            return self.ptx
        if stage in STAGES:
            return self.plan.as_text(stage)
        raise KeyError(stage)

    def compile(self):
        from glue.backend_cuda.executor import CudaExecutable

        return CudaExecutable(self.program, self.ptx, estimate_cost(self.plan), self.name)


class CudaBackend:
    name = "cuda"

    @staticmethod
    def is_available() -> bool:
        """True only when the NVIDIA driver initialises and a GPU exists; never raises."""
        return driver.available()

    @staticmethod
    def device_put(value: Any) -> Any:
        from glue.backend_cuda.executor import device_put

        return device_put(value)

    def lower(self, graph: Graph, *, donated: Sequence[int] = (), name: str = "fn",
              arch: str | None = None) -> CudaLowered:
        return CudaLowered(graph, donated, name, arch)


__all__ = ["CudaBackend", "CudaLowered", "target_arch"]
