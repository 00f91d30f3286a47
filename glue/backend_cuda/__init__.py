"""The `cuda` backend: NVIDIA GPUs through LLVM's NVPTX target and the CUDA driver API.

Stages (the backend contract's table, `glue.backend.contract`): the scheduler's, "llvm" (the
program's launches and one LLVM module per distinct kernel: `codegen/`; kernels the caches hold
are not emitted) and "ptx" (each missing module optimised and emitted for the options' arch by
`ptx.py`, side by side in the compile workers). None of them needs a GPU: the arch is the GPU's
when a driver reports one (read without creating a context) and `sm_90` otherwise, or whatever
`arch=` / `glue.config.arch` names. Loading (`compile()`) needs a GPU: the internal stage
"cubin" compiles each kernel's PTX (with ptxas where there is one, else the driver's JIT) and
loads it (`runtime/module.py`), and `load` gives a `CudaExecutable` (`executor.py`).
`runtime/` holds what runs programs (contexts, modules, launches, allocator, streams,
transfers, device buffers).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from glue.backend import workers
from glue.backend.contract import Backend, Lowering, Options, add_plan_stages
from glue.backend_cuda.codegen import EMITTING_WORKERS, CudaProgram, build_program, compile_ptx
from glue.backend_cuda.codegen.flash import flash_note, why_not_flash
from glue.backend_cuda.ptx import DEFAULT_ARCH, PTX_FEATURES, ProgramPtx, sm_number
from glue.backend_cuda.runtime import driver
from glue.errors import GlueError
from glue.ir import Graph
from glue.scheduler.attention import AttentionPolicy
from glue.scheduler.streams import MAX_STREAMS
from glue.settings import config


@lru_cache(maxsize=None)
def detected_arch() -> str | None:
    """The default GPU's arch as the driver reports it (no context is made), or None."""
    if not driver.available():
        return None
    return driver.device_arch(0)


def default_arch() -> str:
    """The PTX target when none is named: glue.config.arch, else the GPU's (when glue knows
    it), else sm_90."""
    chosen = config.arch or detected_arch()
    return chosen if chosen in PTX_FEATURES else DEFAULT_ARCH


@dataclass(frozen=True)
class CudaOptions(Options):
    """arch: the PTX target; gemm: who may serve contractions ("auto" races glue's kernels
    against cuBLASLt, "library" and "codegen" force one); streams: at most how many streams the
    program's independent kernels spread over (glue.config.cuda_streams; one where more would
    hold much more memory; the body of a call kernel runs on one, its caller's);
    aligned: every operand starts 16-byte aligned (a call kernel's body reads and writes slices
    of its caller's buffers, a scan's step t at t times a slice's bytes: no vector access)."""

    arch: str = DEFAULT_ARCH
    opt_level: int = 3
    gemm: str = "auto"
    streams: int = MAX_STREAMS
    aligned: bool = True

    def __post_init__(self) -> None:
        if self.arch not in PTX_FEATURES:
            raise GlueError(f"cuda: no PTX target for arch {self.arch!r}; glue knows {sorted(PTX_FEATURES)}")
        if self.gemm not in ("auto", "library", "codegen"):
            raise GlueError(f"cuda: gemm must be auto, library or codegen, not {self.gemm!r}")
        if not isinstance(self.streams, int) or self.streams < 1:
            raise GlueError(f"cuda: streams must be a positive int, not {self.streams!r}")


class CudaBackend(Backend):
    name = "cuda"
    Options = CudaOptions
    rounds_to_tf32 = True

    @classmethod
    def can_run(cls) -> bool:
        """True only when the NVIDIA driver initialises and a GPU exists; never raises."""
        return driver.available()

    @classmethod
    def why_not(cls) -> str:
        return "no NVIDIA GPU and driver"

    def default_options(self) -> CudaOptions:
        return CudaOptions(arch=default_arch(), gemm=config.gemm, streams=config.cuda_streams)

    def add_stages(self, lowering: Lowering) -> None:
        add_plan_stages(lowering, lowering.options.streams, _attention(lowering.options))
        lowering.add_stage("llvm", _program, text=_llvm_text)
        lowering.add_stage("ptx", _ptx)
        lowering.add_stage("cubin", _cubin, text=None)

    def before_scheduling(self, lowering: Lowering) -> None:
        """A large program planned afresh: its kernels are likely not in the disk cache either,
        so the compile workers start now, each importing the emitter it will run kernels
        through (see codegen's EMITTING_WORKERS), and are ready when the first kernel is."""
        if lowering.name != "body" and len(lowering.graph.eqns) >= workers.PRESTART_EQNS:
            workers.prestart(("glue.backend_cuda.codegen",) if workers.worker_count() >= EMITTING_WORKERS else ())

    def load(self, lowering: Lowering) -> Any:
        from glue.backend_cuda.executor import CudaExecutable

        lowering["cubin"]  # every kernel's module loaded, timed as a stage of its own
        return CudaExecutable(lowering["llvm"], lowering["ptx"], lowering.name)

    @lru_cache(maxsize=256)
    def body(self, graph: Graph, options: CudaOptions) -> Lowering:
        """The lowering of a call kernel's body (on one stream), shared by every program that
        uses it; each program's executable loads it with memory of its own."""
        return Lowering(self, graph, (), "body", replace(options, streams=1, aligned=False, gemm="codegen"))

    def device_put(self, value: Any) -> Any:
        from glue.backend_cuda.executor import device_put

        return device_put(value)

    def holds(self, buffer: Any) -> bool:
        from glue.backend_cuda.runtime.device_array import DeviceBuffer

        return isinstance(buffer, DeviceBuffer)

    def private_copy(self, value: Any) -> Any:
        from glue.backend_cuda.executor import device_copy

        return device_copy(value)


# Attention the flash kernels do not serve runs as the plain math where its scores take at most
# this much: the GPU runs its contractions and row kernels faster than the tiled scans' steps (a
# GPT-2-width float32 step, 96 MiB of scores a layer, took 57 ms tiled against 7.7 unfused on
# the H200); beyond it, the scans keep the memory O(T).
UNFUSED_SCORES_BYTES = 96 << 20  # a GPT-2-width layer's at T=512 (B=8, 12 heads)


def _attention(options: CudaOptions) -> AttentionPolicy:
    """How attention runs here: as the flash kernels (codegen/flash.py) where they serve (not in
    a call kernel's body, whose operands may be unaligned, nor without tensor cores), else as
    the plain math up to UNFUSED_SCORES_BYTES of scores, else tiled."""
    if not options.aligned or not config.cuda_tensor_cores:
        return AttentionPolicy(unfused_bytes=UNFUSED_SCORES_BYTES)
    sm = sm_number(options.arch)
    return AttentionPolicy(lambda eqn: None if why_not_flash(eqn, sm) else flash_note(eqn), UNFUSED_SCORES_BYTES,
                           lambda eqn: why_not_flash(eqn, sm))


def _program(lowering: Lowering) -> CudaProgram:
    options = lowering.options
    return build_program(lowering["plan"], lowering.name, options.arch, options.gemm, options.opt_level,
                         lowering.kernel_stats, lambda graph: lowering.backend.body(graph, options), options.aligned)


def _llvm_text(program: CudaProgram) -> str:
    return program.llvm_ir


def _ptx(lowering: Lowering) -> ProgramPtx:
    ptx = compile_ptx(lowering["llvm"], lowering.options.opt_level, lowering.kernel_stats)
    if all(stats.source != "built" for stats in lowering.kernel_stats.values()):
        lowering.note_cached("ptx")
    return ptx


def _cubin(lowering: Lowering) -> Any:
    """Each kernel's module loaded on the GPU (the executor finds them in the module cache)."""
    from glue.backend_cuda.runtime import get_context

    return get_context().modules.load(lowering["ptx"], lowering.name, lowering.kernel_stats)


__all__ = ["CudaBackend", "CudaOptions", "default_arch"]
