"""The host target: LLVM IR text -> optimised native object code -> callable machine code.

Code is generated for the CPU this process runs on (its name and features, so that llvm.fma is
an instruction and the vectoriser may use the widest vector unit) as position-independent
code in the small code model (constants addressed relative to the instruction pointer rather
than loaded through 64-bit addresses), optimised through the new pass manager with loop and SLP
vectorisation by a `Pipeline` chosen per kernel class (`program.pipeline`), in this process or a
compile worker (`glue.backend.llvm_jobs`), and linked into the process by ORC's JITLink from
object code, the same way whether the objects were just compiled or came from the disk cache
(`code.py`). LLVM's global state is not thread-safe, so every call into it here holds `_lock`.
"""
from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import llvmlite
import llvmlite.binding as llvm

from glue.backend import llvm_jobs
from glue.backend.workers import usable_cores
from glue.errors import BackendError
from glue.settings import config

_lock = llvm_jobs.LOCK
CODEGEN_LEVEL = 3  # the instruction selector's and register allocator's optimisation level


@dataclass(frozen=True)
class HostTarget:
    """What code is generated for: part of every cache key."""

    triple: str
    cpu: str
    features: str
    data_layout: str = ""

    @property
    def vector_bits(self) -> int:
        """The width of the widest vector registers the features allow."""
        flags = set(self.features.split(","))
        return 512 if "+avx512f" in flags else 256 if "+avx" in flags else 128

    @property
    def fingerprint(self) -> str:
        return f"{self.triple}|{self.cpu}|{self.features}|llvmlite {llvmlite.__version__}|codegen O{CODEGEN_LEVEL}"

    def machine(self) -> llvm.TargetMachine:
        """A fresh target machine (an MCJIT engine takes ownership of the one it is given)."""
        return llvm_jobs.host_machine(self.triple, self.cpu, self.features, CODEGEN_LEVEL)


@lru_cache(maxsize=None)
def host() -> HostTarget:
    """The host CPU; raises BackendError when LLVM cannot target it."""
    with _lock:
        try:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            triple = llvm.get_process_triple()
            target = HostTarget(triple, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
            target = HostTarget(target.triple, target.cpu, target.features, str(target.machine().target_data))
        except RuntimeError as exc:
            raise BackendError(f"cpu: LLVM cannot generate code for this host: {exc}") from None
    return target


@dataclass(frozen=True)
class Pipeline:
    """How a module is optimised: the pass pipeline's speed level, whether the code generator
    runs loop strength reduction, whether the loop vectoriser folds a loop's tail into
    the vector loop rather than leaving it to remainder loops, and whether the pipeline is
    `lean` (no loop body copied beyond the vector loop's own: `llvm_jobs.host_code`)."""

    speed_level: int = 3
    strength_reduction: bool = True
    fold_tail: bool = False
    lean: bool = False

    def job(self, ir_text: str, assembly: bool = False) -> tuple[str, tuple]:
        """The compile job (`glue.backend.workers.Jobs.submit`) making the module's object code
        (or assembly)."""
        h = host()
        return "host_code", (ir_text, h.triple, h.cpu, h.features, self.speed_level, CODEGEN_LEVEL,
                             self.strength_reduction, assembly, self.fold_tail, self.lean)


def assembly(ir_text: str, pipeline: Pipeline = Pipeline()) -> str:
    """The host assembly of a module (optimised exactly as for execution)."""
    name, args = pipeline.job(ir_text, assembly=True)
    try:
        return llvm_jobs.JOBS[name](*args)[0]
    except RuntimeError as exc:
        raise BackendError(f"cpu: the generated LLVM IR is invalid: {exc}") from None


def undefined_symbols(code: bytes) -> list[str]:
    """The names an ELF64 object file needs from outside itself (empty for other formats)."""
    if code[:5] != b"\x7fELF\x02":
        return []
    (shoff,), (shentsize, shnum) = struct.unpack_from("<Q", code, 0x28), struct.unpack_from("<HH", code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for j in range(size // entsize):
            name, info, _, section, _, _ = struct.unpack_from("<IBBHQQ", code, offset + j * entsize)
            if section == 0 and name and info >> 4 in (1, 2):  # undefined, global or weak
                names.append(code[strings + name:code.index(b"\0", strings + name)].decode())
    return names


@lru_cache(maxsize=None)
def _jit() -> llvm.LLJIT:
    """The process's ORC JIT; JITLink places each object's code, constants, GOT and stubs
    together, which the small code model (RIP-relative constants) needs."""
    return llvm.create_lljit_compiler(host().machine(), use_jit_link=True)


_libraries = itertools.count()


class LoadedCode:
    """Object files linked into this process as one library (against the process's own symbols,
    for the few library calls LLVM emits: memcpy, fmod); unloaded when this object is collected."""

    def __init__(self, objects: Sequence[bytes], symbols: Sequence[str]):
        builder = llvm.JITLibraryBuilder().add_current_process()
        for code in objects:
            builder.add_object_img(code)
        for name in symbols:
            builder.export_symbol(name)
        with _lock:
            try:
                self._library = builder.link(_jit(), f"glue{next(_libraries)}")
            except RuntimeError as exc:
                needs = sorted({name for code in objects for name in undefined_symbols(code)} - set(symbols))
                raise BackendError(f"cpu: the compiled code could not be linked into this process "
                                   f"(needs {', '.join(needs) or 'nothing'}): {exc}") from None

    def address(self, name: str) -> int:
        address = self._library[name]
        if not address:
            raise BackendError(f"cpu: compiled code lacks the function {name!r}")
        return address


def thread_count() -> int:
    """Threads a kernel is split over: `config.cpu_threads` (GLUE_CPU_THREADS), else the cores
    this process may use."""
    chosen = config.cpu_threads
    return max(1, chosen) if chosen else usable_cores()
