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
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache

import llvmlite.binding as llvm

from glue.errors import BackendError

TRIPLE = "nvptx64-nvidia-cuda"
DEFAULT_ARCH = "sm_90"
PTX_FEATURES = {"sm_75": "+ptx63", "sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78",
                "sm_90": "+ptx80", "sm_90a": "+ptx80"}

# LLVM's per-target state is not safe to use from several threads at once.
_lock = threading.Lock()


@lru_cache(maxsize=None)
def _target_machine(arch: str, opt_level: int) -> llvm.TargetMachine:
    if arch not in PTX_FEATURES:
        raise BackendError(f"cuda: no PTX target for {arch!r}; glue knows {sorted(PTX_FEATURES)}")
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features=PTX_FEATURES[arch], opt=opt_level)


def ptx_for_module(llvm_ir: str, arch: str = DEFAULT_ARCH, opt_level: int = 3) -> str:
    """Optimise an LLVM module (text) at `opt_level` and emit PTX for `arch`."""
    with _lock:
        tm = _target_machine(arch, opt_level)
        try:
            module = llvm.parse_assembly(llvm_ir)
            module.verify()
        except RuntimeError as exc:
            raise BackendError(f"cuda: invalid LLVM IR for the NVPTX target: {exc}") from None
        module.triple = TRIPLE
        module.data_layout = str(tm.target_data)
        if opt_level:
            builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(opt_level))
            builder.getModulePassManager().run(module, builder)
        ptx = tm.emit_assembly(module)
    if ".entry" not in ptx:
        raise BackendError("cuda: the LLVM module defines no kernel; declare kernels as "
                           "`define ptx_kernel void @name(...)`")
    return ptx


def ptxas_available() -> bool:
    return shutil.which("ptxas") is not None


def assemble(ptx: str, arch: str = DEFAULT_ARCH) -> str:
    """Run `ptxas -v` on PTX (a check that needs no GPU); returns its resource report
    (registers, spills, shared memory per kernel). Raises BackendError with ptxas's messages."""
    if not ptxas_available():
        raise BackendError("cuda: ptxas is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        done = subprocess.run(["ptxas", f"-arch={arch}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode:
        raise BackendError(f"cuda: ptxas -arch={arch} rejected the PTX:\n{done.stderr.strip()}")
    return done.stderr
