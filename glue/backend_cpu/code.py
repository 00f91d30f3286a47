"""Each distinct kernel's machine code: from this process's memory, the disk cache, or LLVM.

A kernel's code is found by its structural key (`program.py`) in three places, cheapest first:
kernels already linked into this process (by any program that is still alive), the disk cache
(namespace "cpu": the function's facts and its object file), and else it is built: its LLVM
module generated here and handed to the compile workers (`glue.backend.workers`), which
optimise and emit every missing kernel side by side while the next module is being generated.
A program then links the object files it got from disk or LLVM into one library, and every use
of a kernel calls the one function.
"""
from __future__ import annotations

import ctypes
import json
import time
import weakref
from dataclasses import dataclass, fields
from typing import Sequence, Union

from glue import profiler
from glue.backend.cache import DiskCache, digest
from glue.backend.contract import Lowering
from glue.backend.workers import Jobs
from glue.backend_cpu.kernels import KernelFunction
from glue.backend_cpu.program import Program, body_size
from glue.backend_cpu.target import LoadedCode
from glue.errors import BackendError

DISK = DiskCache("cpu")
# Everything about a KernelFunction but the kernel it was built for, as stored on disk.
_FACTS = tuple(f.name for f in fields(KernelFunction) if f.name != "kernel")
ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


@dataclass
class ObjectCode:
    """A kernel's compiled object file, not yet linked."""

    function: KernelFunction
    code: bytes


class LoadedKernel:
    """A kernel's function linked into this process; shared by every program that runs it."""

    def __init__(self, function: KernelFunction, library: LoadedCode):
        self.function = function
        self.library = library  # keeps the code mapped while any program uses the kernel
        self.entry = ENTRY(library.address(function.symbol))


Code = Union[ObjectCode, LoadedKernel]
_loaded: "weakref.WeakValueDictionary[bytes, LoadedKernel]" = weakref.WeakValueDictionary()


def _disk_key(key: bytes) -> bytes:
    return digest("cpu kernel object", key)


def _encode(code: ObjectCode) -> bytes:
    facts = {name: getattr(code.function, name) for name in _FACTS}
    return json.dumps(facts).encode() + b"\n" + code.code


def _decode(payload: bytes, program: Program, key: bytes) -> ObjectCode | None:
    head, _, code = payload.partition(b"\n")
    try:
        facts = json.loads(head)
        function = KernelFunction(program.sources[key].kernel, **{name: facts[name] for name in _FACTS})
    except (ValueError, KeyError, TypeError):
        return None
    return ObjectCode(function, code)


def _cost(program: Program, key: bytes) -> tuple[bool, int]:
    """How long a kernel's LLVM job is expected to take, as a sort key: blocked matmuls
    longest, then by the size of its loop body (`body_size`)."""
    kernel = program.sources[key].kernel
    return kernel.kind == "contraction", body_size(kernel)


def kernel_code(programs: Sequence[Program], lowering: Lowering) -> list[dict[bytes, Code]]:
    """The code of every distinct kernel of each of `programs` (a program and the bodies of its
    call kernels), with what it cost in `lowering`'s kernel stats. The missing kernels are
    compiled as one batch, in parallel where there are several, the most expensive first (so
    that the compile workers end the batch on short jobs): each module is built here and
    handed to the workers at once, which optimise it while the next one is built."""
    found: dict[bytes, Code] = {}
    missing: dict[bytes, Program] = {}
    uses: dict[bytes, int] = {}
    for program in programs:
        for key, positions in program.uses_by_key().items():
            uses[key] = uses.get(key, 0) + len(positions)
            if key in found or key in missing:
                continue
            source = program.sources[key]
            stats = lowering.kernel(source.symbol, source.kernel.kind)
            loaded = _loaded.get(key)
            if loaded is not None:
                found[key], stats.source = loaded, "memory"
                continue
            start = time.perf_counter()
            payload = DISK.load(_disk_key(key))
            stored = _decode(payload, program, key) if payload is not None else None
            stats.add("disk cache", time.perf_counter() - start)
            if stored is not None:
                found[key], stats.source = stored, "disk"
            else:
                missing[key] = program
    for program in programs:
        for key, source in program.sources.items():
            lowering.kernel_stats[source.symbol].uses = uses[key]
    jobs = Jobs(len(missing))
    pending = {}
    for key in sorted(missing, key=lambda k: _cost(missing[k], k), reverse=True):
        program = missing[key]
        stats = lowering.kernel_stats[program.sources[key].symbol]
        start = time.perf_counter()
        with profiler.span("compile", f"llvm build {stats.symbol}"):
            module = program.module(key)
        stats.add("llvm build", time.perf_counter() - start)
        pending[key] = (module.function, jobs.submit(*module.pipeline.job(module.text), label=stats.symbol))
    for key, (function, future) in pending.items():
        stats = lowering.kernel_stats[function.symbol]
        try:
            code, seconds = future.result()
        except RuntimeError as exc:
            raise BackendError(f"cpu: LLVM could not compile kernel {function.name}: {exc}") from None
        for step, spent in seconds.items():
            stats.add(step, spent)
        found[key] = ObjectCode(function, code)
        DISK.store(_disk_key(key), _encode(found[key]))
    return [{key: found[key] for key in program.sources} for program in programs]


def link(codes: dict[bytes, Code], lowering: Lowering) -> dict[bytes, LoadedKernel]:
    """Every kernel's function in this process: the object files linked as one library."""
    new = {key: code for key, code in codes.items() if isinstance(code, ObjectCode)}
    loaded = {key: code for key, code in codes.items() if isinstance(code, LoadedKernel)}
    if new:
        start = time.perf_counter()
        library = LoadedCode([c.code for c in new.values()], [c.function.symbol for c in new.values()])
        for key, code in new.items():
            loaded[key] = _loaded[key] = LoadedKernel(code.function, library)
        share = (time.perf_counter() - start) / len(new)
        for code in new.values():
            lowering.kernel_stats[code.function.symbol].add("link", share)
    return loaded
