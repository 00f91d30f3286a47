"""LLVM IR -> PTX through the NVPTX target bundled in llvmlite; no GPU needed.

Kernels are marked with the `ptx_kernel` calling convention (`define ptx_kernel void @k(...)`),
which LLVM 20+ prefers; the older `!nvvm.annotations` `"kernel"` metadata still works (LLVM
upgrades it on parse). A module with no kernel is an error here rather than a PTX file with no
`.entry` that fails later at load. Pointer parameters should be `ptr addrspace(1)` (global).

Each architecture gets the lowest PTX ISA version that supports it, so the PTX loads on the oldest
driver that knows the GPU (sm_90 with PTX 8.0 loads on CUDA 12.0 drivers and later).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache

from glue.backend import llvm_jobs
from glue.errors import BackendError

TRIPLE = llvm_jobs.NVPTX_TRIPLE
DEFAULT_ARCH = "sm_90"
# The PTX ISA each arch's modules are written in; sm_90's 8.1 (CUDA 12.1) for `st.async`, which a
# column reduction's cluster uses to send its partials.
PTX_FEATURES = {"sm_75": "+ptx63", "sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78",
                "sm_90": "+ptx81", "sm_90a": "+ptx81"}


def sm_number(arch: str) -> int:
    """The compute capability an arch names, as a number (sm_90a -> 90)."""
    return int(arch.removeprefix("sm_").rstrip("a"))


def ptx_job(llvm_ir: str, arch: str, opt_level: int) -> tuple[str, tuple]:
    """The compile job (`glue.backend.workers.Jobs.submit`) that makes a module's PTX."""
    if arch not in PTX_FEATURES:
        raise BackendError(f"cuda: no PTX target for {arch!r}; glue knows {sorted(PTX_FEATURES)}")
    return "nvptx", (llvm_ir, arch, PTX_FEATURES[arch], opt_level)


def checked(ptx: str) -> str:
    """`ptx`, which must define a kernel."""
    if ".entry" not in ptx:
        raise BackendError("cuda: the LLVM module defines no kernel; declare kernels as "
                           "`define ptx_kernel void @name(...)`")
    return ptx


def ptx_for_module(llvm_ir: str, arch: str = DEFAULT_ARCH, opt_level: int = 3) -> str:
    """Optimise an LLVM module (text) at `opt_level` and emit PTX for `arch`, in this process."""
    name, args = ptx_job(llvm_ir, arch, opt_level)
    try:
        ptx, _ = llvm_jobs.JOBS[name](*args)
    except RuntimeError as exc:
        raise BackendError(f"cuda: invalid LLVM IR for the NVPTX target: {exc}") from None
    return checked(ptx)


@dataclass
class ProgramPtx:
    """A program's device code: one PTX module per distinct kernel, by symbol. Its text is the
    modules one after another; `modules` are what the driver loads (`runtime/module.py`)."""

    modules: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.modules:
            return "// this program runs no kernels of glue's own\n"
        return "\n".join(f"// kernel {symbol}\n{ptx}" for symbol, ptx in self.modules.items())


def ptxas_available() -> bool:
    return shutil.which("ptxas") is not None


@lru_cache(maxsize=None)
def ptxas_version() -> str:
    """The last line of `ptxas --version` (its build), part of the cache keys of its cubins."""
    done = subprocess.run(["ptxas", "--version"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""


def assemble(ptx: "str | ProgramPtx", arch: str = DEFAULT_ARCH) -> str:
    """Run `ptxas -v` on PTX, or on each module of a program's PTX (a check that needs no
    GPU); returns its resource report (registers, spills, shared memory per kernel). Raises
    BackendError with ptxas's messages."""
    if isinstance(ptx, ProgramPtx):
        return "".join(assemble(module, arch) for module in ptx.modules.values())
    return _ptxas(ptx, arch, ["-v"])[1]


def ptx_target(ptx: str) -> str | None:
    """The arch a module's PTX names in its `.target` directive (`sm_90a`), or None."""
    found = re.search(r"^\s*\.target\s+([\w]+)", ptx, re.MULTILINE)
    return found.group(1) if found else None


def cubin(ptx: str, arch: str, relocatable: bool = False) -> bytes:
    """The machine code of one module, compiled by `ptxas` as a whole program (as the driver's
    `cuModuleLoadData` JIT compiles it), or as relocatable code (`ptxas -c`, as its JIT linker
    does) for the driver's linker. Raises BackendError with ptxas's messages."""
    return _ptxas(ptx, arch, ["-c"] if relocatable else [])[0]


def _ptxas(ptx: str, arch: str, flags: list[str]) -> tuple[bytes, str]:
    """(cubin, ptxas's report) of `ptxas -arch=arch *flags` on `ptx`."""
    if not ptxas_available():
        raise BackendError("cuda: ptxas is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(path, "w") as f:
            f.write(ptx)
        done = subprocess.run(["ptxas", f"-arch={arch}", *flags, path, "-o", out], capture_output=True, text=True)
        if done.returncode:
            raise BackendError(f"cuda: ptxas -arch={arch} rejected the PTX:\n{done.stderr.strip()}")
        with open(out, "rb") as f:
            return f.read(), done.stderr
