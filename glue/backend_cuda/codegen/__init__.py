"""Kernel IR -> LLVM IR for the NVPTX target: one module per program, one kernel per Kernel.

`build_program(plan)` maps each kernel onto the GPU by its class (`pointwise.py`, `rows.py`,
`contraction.py`, `data.py`; `common.py` holds what they share) and records how to launch it:
grid, block, and the memory place of each pointer parameter. A contraction may also, or
instead, be served by cuBLASLt (`library.py`): its launches then form the variant "library" of
that plan kernel beside the variant "codegen", and the executor runs one (`glue.config.gemm`
forces either; "auto" races them). Kernel symbols carry the program
name, the kernel's position and the ops it fuses; each kernel declares its block size as its
launch bound (`.maxntid`), which lets ptxas budget registers for exactly that many threads.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from llvmlite import ir

from glue.backend_cuda import cublaslt
from glue.backend_cuda.codegen.columns import ColumnPlan, columns_fit, emit_columns
from glue.backend_cuda.codegen.common import KernelEmitter, Launch, Place
from glue.backend_cuda.codegen.contraction import emit_contraction
from glue.backend_cuda.codegen.data import emit_data
from glue.backend_cuda.codegen.library import library_launches
from glue.backend_cuda.codegen.pointwise import emit_pointwise
from glue.backend_cuda.codegen.rows import emit_rows
from glue.backend_cuda.ptx import DEFAULT_ARCH
from glue.codegen.scope import Analysis
from glue.ir import Graph, TensorType
from glue.scheduler.calls import call_plan
from glue.scheduler.gemm import GemmSpec, gemm_spec
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.memory import Placement
from glue.scheduler.plan import Plan, Result

log = logging.getLogger("glue")


@dataclass
class CudaProgram:
    plan: Plan
    llvm_ir: str
    launches: list[Launch]
    arch: str = DEFAULT_ARCH
    scratch: tuple[int, ...] = ()  # bytes of each stream's scratch region (library operands, partials)
    counters: int = 0              # bytes of zeroed counters (column reductions' last-block counts)
    bodies: dict[int, list[Any]] = field(default_factory=dict)  # call kernel -> its bodies' lowerings

    @property
    def arena_bytes(self) -> int:
        return self.plan.memory.arena_bytes

    @property
    def arg_types(self) -> list[TensorType]:
        return self.plan.argument_types

    @property
    def output_types(self) -> list[TensorType]:
        return self.plan.output_types

    @property
    def results(self) -> list[Result]:
        return self.plan.results()


_EMIT = {"pointwise": emit_pointwise, "data": emit_data, "reduction": emit_rows}


def _place(p: Placement) -> Place:
    if p.kind == "arena":
        return Place("arena", 0, p.slot)
    return Place("output" if p.kind == "output" else "argument", p.slot)


def _symbol(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _launch_bounds(llvm_ir: str, launches: list[Launch]) -> str:
    """Declare each kernel's block size (`.maxntid`) and the blocks that must fit on a
    multiprocessor where its emitter asks (`.minnctapersm`); llvmlite cannot attach string
    attributes."""
    for launch in launches:
        if launch.library is not None or launch.call is not None:
            continue
        bounds = f'"nvvm.maxntid"="{launch.block}"'
        if launch.min_blocks:
            bounds += f' "nvvm.minctasm"="{launch.min_blocks}"'
        header = re.compile(rf'^(define ptx_kernel void @"{launch.symbol}"\(.*\))$', re.M)
        llvm_ir = header.sub(lambda m: f'{m.group(1)} {bounds}', llvm_ir, count=1)
    return llvm_ir


class _Memory:
    """The working memory kernels of a program claim besides their operands: each stream's
    scratch region (sized by its largest claim: kernels of one stream run one after another)
    and the program's zeroed counters (each claim its own)."""

    def __init__(self) -> None:
        self.scratch: dict[int, int] = {}
        self.counters = 0

    def claim_scratch(self, stream: int, nbytes: int) -> Place:
        self.scratch[stream] = max(self.scratch.get(stream, 0), nbytes)
        return Place("scratch", stream, 0)

    def claim_counters(self, nbytes: int) -> Place:
        place = Place("counters", 0, self.counters)
        self.counters += -(-nbytes // 256) * 256
        return place

    def regions(self) -> tuple[int, ...]:
        return tuple(self.scratch.get(s, 0) for s in range(max(self.scratch, default=-1) + 1))


def _emit(module: ir.Module, kernel: Kernel, symbol: str, inputs: list[Place], outputs: list[Place],
          arch: str, written: frozenset[Place], memory: _Memory | None = None, stream: int = 0) -> Launch:
    """One of glue's own kernels, emitted by its class (a column reduction claims working
    memory from `memory`, on `stream`)."""
    analysis = Analysis()
    if kernel.kind == "reduction" and memory is not None and columns_fit(kernel, analysis):
        plan = ColumnPlan(kernel, analysis)
        extra = [memory.claim_scratch(stream, plan.scratch_bytes), memory.claim_counters(plan.counter_bytes)] \
            if plan.splits > 1 else []
        ke = KernelEmitter(module, kernel, symbol, inputs, outputs, arch, written, extra)
        shape = emit_columns(ke, plan)
    else:
        ke = KernelEmitter(module, kernel, symbol, inputs, outputs, arch, written)
        shape = emit_contraction(ke) if kernel.kind == "contraction" else None
        if shape is None:
            shape = _EMIT.get(kernel.kind, emit_rows)(ke)
    grid, block, strategy = shape
    copy = None
    if kernel.init is not None and inputs[kernel.init] != outputs[0]:
        copy = (outputs[0], inputs[kernel.init], kernel.outputs[0].type.nbytes)
    return Launch(symbol, kernel, grid, block, ke.places, strategy, copy, ke.awaited, ke.min_blocks)


def gemm_variants(spec: GemmSpec | None, choice: str = "auto") -> tuple[str, ...]:
    """Who may serve a contraction: glue's own kernel ("codegen"), cuBLASLt ("library"), or
    both (then the executor races them), as `choice` (the backend's `gemm` option) says and
    the library can."""
    if spec is None or choice == "codegen":
        return ("codegen",)
    why_not = "nvmath-python is not installed" if not cublaslt.available() else cublaslt.can_serve(spec)
    if why_not:
        if choice == "library":
            _note_once(f"glue.cuda: a contraction runs on glue's own kernels although GLUE_GEMM=library: {why_not}")
        elif not cublaslt.available():
            _note_once("glue.cuda: contractions run on glue's own kernels (install the 'cuda' extra, "
                       "nvmath-python, for cuBLASLt)")
        return ("codegen",)
    return ("library",) if choice == "library" else ("codegen", "library")


_NOTED: set[str] = set()


def _note_once(message: str) -> None:
    if message not in _NOTED:
        _NOTED.add(message)
        log.info(message)


def build_program(plan: Plan, name: str = "fn", arch: str = DEFAULT_ARCH, gemm: str = "auto",
                  lower_body: Callable[[Graph], Any] | None = None) -> CudaProgram:
    """One LLVM module with a kernel per plan kernel for `arch` (and the launches of each
    contraction's library variant), and how to launch each. A call kernel (control flow, a
    print) is a launch without a grid holding its plan; `lower_body` lowers each of its bodies
    as a program of its own (see steps.py)."""
    placements = plan.memory.placements
    module = ir.Module(name=_symbol(name))
    launches: list[Launch] = []
    memory = _Memory()
    bodies: dict[int, list[Any]] = {}
    written = frozenset(_place(placements[b.value_id]) for kernel in plan.kernels for b in kernel.outputs)
    for i, kernel in enumerate(plan.kernels):
        inputs = [_place(placements[b.value_id]) for b in kernel.inputs]
        outputs = [_place(placements[b.value_id]) for b in kernel.outputs]
        symbol = f"glue_{_symbol(name)}_{i}_{_symbol(kernel.name)}"[:120]
        if kernel.call is not None:
            if lower_body is None:
                raise ValueError(f"build_program: {kernel.name} is a call kernel, which needs lower_body")
            call = call_plan(kernel)
            launches.append(Launch(symbol, kernel, 0, 0, tuple(inputs + outputs), "call", group=i, call=call))
            bodies[i] = [lower_body(body) for body in call.bodies]
            continue
        spec = gemm_spec(kernel) if kernel.kind == "contraction" else None
        variants = gemm_variants(spec, gemm)
        stream = plan.streams.streams[i]
        if "codegen" in variants:
            launches.append(replace(_emit(module, kernel, symbol, inputs, outputs, arch, written, memory, stream),
                                    group=i))
        if "library" in variants:
            def emit(k: Kernel, ins: list[Place], outs: list[Place], sym: str) -> Launch:
                return _emit(module, k, sym, ins, outs, arch, written)

            served, need = library_launches(spec, i, symbol, inputs, outputs, stream, emit)
            launches += served
            memory.claim_scratch(stream, need)
    return CudaProgram(plan, _launch_bounds(str(module), launches), launches, arch, memory.regions(),
                       memory.counters, bodies)


__all__ = ["CudaProgram", "Launch", "Place", "Result", "build_program", "gemm_variants"]
