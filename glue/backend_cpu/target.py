"""The host target: LLVM IR text -> optimised native object code -> callable machine code.

Code is generated for the CPU this process runs on (its name and features, so that llvm.fma is
an instruction and the vectoriser may use the widest vector unit) as position-independent
code in the small code model (constants addressed relative to the instruction pointer rather
than loaded through 64-bit addresses), optimised at O3 through the new pass manager with loop
and SLP vectorisation, and linked into the process by ORC's JITLink from object code, the same
way whether the object was just compiled or came from the disk cache (`glue.backend.cache`).
LLVM's global state is not thread-safe, so every call into it holds `_lock`.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import llvmlite
import llvmlite.binding as llvm

from glue.backend.cache import DiskCache, digest
from glue.errors import BackendError
from glue.settings import config

_lock = threading.RLock()


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
        return f"{self.triple}|{self.cpu}|{self.features}|llvmlite {llvmlite.__version__}|O3"

    def machine(self) -> llvm.TargetMachine:
        """A fresh target machine (an MCJIT engine takes ownership of the one it is given)."""
        target = llvm.Target.from_triple(self.triple)
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=3,
                                            codemodel="small", reloc="pic")


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


def _optimised(ir_text: str, machine: llvm.TargetMachine) -> llvm.ModuleRef:
    try:
        module = llvm.parse_assembly(ir_text)
        module.verify()
    except RuntimeError as exc:
        raise BackendError(f"cpu: the generated LLVM IR is invalid: {exc}") from None
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    tuning.loop_interleaving = True
    tuning.loop_unrolling = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    return module


def optimised_ir(ir_text: str) -> str:
    """The module after the O3 pipeline, as text."""
    with _lock:
        return str(_optimised(ir_text, host().machine()))


def assembly(ir_text: str) -> str:
    """The host assembly of a module (optimised exactly as for execution)."""
    with _lock:
        machine = host().machine()
        return machine.emit_assembly(_optimised(ir_text, machine))


DISK = DiskCache("cpu")


def object_code(ir_text: str, options: str = "") -> tuple[bytes, bool]:
    """Native object code for a module, from the disk cache when it holds it; and whether it did.
    `options` is the backend options' cache key."""
    key = digest("cpu object", host().fingerprint, options, ir_text)
    cached = DISK.load(key)
    if cached is not None:
        return cached, True
    with _lock:
        machine = host().machine()
        code = machine.emit_object(_optimised(ir_text, machine))
    DISK.store(key, code)
    return code, False


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
    """Machine code linked into this process (against the process's own symbols, for the few
    library calls LLVM emits: memcpy, fmod); unloaded when this object is collected."""

    def __init__(self, code: bytes, symbols: Sequence[str]):
        builder = llvm.JITLibraryBuilder().add_object_img(code).add_current_process()
        for name in symbols:
            builder.export_symbol(name)
        with _lock:
            try:
                self._library = builder.link(_jit(), f"glue{next(_libraries)}")
            except RuntimeError as exc:
                raise BackendError(f"cpu: the compiled code could not be linked into this process "
                                   f"(needs {', '.join(undefined_symbols(code)) or 'nothing'}): {exc}") from None

    def function(self, name: str, restype, *argtypes) -> ctypes._CFuncPtr:
        address = self._library[name]
        if not address:
            raise BackendError(f"cpu: compiled code lacks the function {name!r}")
        return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def thread_count() -> int:
    """Threads a kernel is split over: `config.cpu_threads` (GLUE_CPU_THREADS), else the cores
    this process may use."""
    chosen = config.cpu_threads
    if chosen is not None:
        return max(1, chosen)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
