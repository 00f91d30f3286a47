"""The `cpu` backend: the host CPU through LLVM (llvmlite).

Stages (the backend contract's table, `glue.backend.contract`): the scheduler's ("passes",
"fuse", "plan" and their views: optimized, fusion, kernels, streams, memory, graph),
"program" (the distinct kernels and each plan kernel's use of one: `program.py`), "llvm" (one
LLVM module per distinct kernel as generated: `kernels.py`, `matmul.py`), "asm" (the host
assembly after the O3 pipeline) and the internal "object" (each distinct kernel's code, from
memory, the disk cache or the compile workers: `code.py`). Loading links the new object files
into the process and gives an `Executable` (`runtime.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from glue.backend import workers
from glue.backend.cache import code_version, digest
from glue.backend.contract import Backend, Lowering, Options, add_plan_stages
from glue.backend_cpu.calls import CallSite
from glue.backend_cpu.code import DISK, kernel_code, link
from glue.backend_cpu.program import Program, build_program
from glue.backend_cpu.runtime import Executable
from glue.backend_cpu.target import assembly, host
from glue.errors import BackendError
from glue.ir import Graph
from glue.scheduler.attention import AttentionPolicy
from glue.settings import config

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
        if _hinted(lowering) and DISK.load(_program_hint(lowering)) is None:
            workers.prestart()  # likely a cold compile of many kernels: workers start meanwhile
        add_plan_stages(lowering, attention=_attention())
        lowering.add_stage("program", lambda lw: build_program(lw["plan"], lw.options.key, lw.options.opt_level),
                           text=None)
        lowering.add_stage("llvm", lambda lw: lw["program"].llvm_ir)
        lowering.add_stage("asm", _assembly)
        lowering.add_stage("object", _objects, text=None)

    def load(self, lowering: Lowering) -> Executable:
        program: Program = lowering["program"]
        loaded = link(lowering["object"], lowering)
        bodies = {k: [self.body(graph, lowering.options) for graph in use.plan.bodies]
                  for k, use in enumerate(program.uses) if isinstance(use, CallSite)}
        return Executable(program, loaded, bodies)

    @lru_cache(maxsize=256)
    def body(self, graph: Graph, options: CpuOptions) -> Executable:
        """The executable of a call kernel's body, compiled once for every program using it
        (its kernels' code usually built already, in the batch of the program calling it)."""
        return self.body_lowering(graph, options).compile()

    @lru_cache(maxsize=256)
    def body_lowering(self, graph: Graph, options: CpuOptions) -> Lowering:
        return Lowering(self, graph, (), "body", options)


def _attention() -> AttentionPolicy:
    """Attention runs as the plain math up to `config.cpu_unfused_attention_bytes` of scores,
    tiled beyond. The plain math is a few large contractions and row kernels, which the CPU runs
    as fast as the tiled scans (the 4-layer GPT-2-width bf16 step, 96 MiB of scores a layer,
    within the 2-core machine's noise; the small one's, 2 MiB, a tenth faster), and compiles far
    fewer distinct kernels: the scans' call kernels and their bodies took 28 of that step's 71
    modules and 30% of its LLVM time. Its price is memory: the scores and probabilities each
    layer keeps for the backward (that step's arena 401 -> 1169 MiB)."""
    return AttentionPolicy(unfused_bytes=config.cpu_unfused_attention_bytes)


def _assembly(lowering: Lowering) -> str:
    program: Program = lowering["program"]
    modules = [program.module(key) for key in program.sources]
    return "\n".join(assembly(module.text, module.pipeline) for module in modules)


def _objects(lowering: Lowering) -> dict:
    """The code of the program's kernels and of every call kernel's bodies (and theirs) not
    compiled yet, in one batch: the bodies' LLVM jobs run beside the program's in the compile
    workers instead of one body after another when the program is loaded."""
    bodies = _uncompiled_bodies(lowering)
    codes = kernel_code([lowering["program"]] + [body["program"] for body in bodies], lowering)
    for body, code in zip(bodies, codes[1:]):
        body.provide("object", code)
        for source in body["program"].sources.values():  # the same stats: linking adds to them
            body.kernel_stats[source.symbol] = lowering.kernel_stats[source.symbol]
    if all(stats.source != "built" for stats in lowering.kernel_stats.values()):
        lowering.note_cached("object")
    elif _hinted(lowering):
        DISK.store(_program_hint(lowering), b"compiled")
    return codes[0]


def _hinted(lowering: Lowering) -> bool:
    """Whether a program is large enough to start the compile workers ahead of its kernels."""
    return lowering.name != "body" and len(lowering.graph.eqns) >= workers.PRESTART_EQNS


def _program_hint(lowering: Lowering) -> bytes:
    """The disk cache key of a mark that a program like this one (the same primitives, types
    and options; a hint, not an identity) has had its kernels compiled into the cache."""
    graph = lowering.graph
    return digest("cpu program compiled", code_version(), host().fingerprint, lowering.options.key,
                  repr(graph.in_types), repr(graph.out_types), " ".join(e.primitive for e in graph.eqns))


def _uncompiled_bodies(lowering: Lowering) -> list[Lowering]:
    """The lowerings of the bodies of `lowering`'s call kernels, and of theirs, whose code is
    not built yet (each once)."""
    found: dict[int, Lowering] = {}
    todo = [lowering]
    while todo:
        program: Program = todo.pop()["program"]
        for use in program.uses:
            if not isinstance(use, CallSite):
                continue
            for graph in use.plan.bodies:
                body = lowering.backend.body_lowering(graph, lowering.options)
                if id(body) not in found and not body.built("object"):
                    found[id(body)] = body
                    todo.append(body)
    return list(found.values())


__all__ = ["CpuBackend", "CpuOptions", "Executable"]
