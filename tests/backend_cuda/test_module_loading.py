"""How the cuda backend turns a kernel's PTX into a loaded module (runtime/module.py), on the
stub driver (tests/backend_cuda/stub_driver.py): the driver's JIT by default, ptxas's machine code
kept in the disk cache under `cuda_ptxas`, and the JIT again where the driver refuses that code.
No GPU needed; ptxas where the test says so."""
from __future__ import annotations

import pytest

from glue.backend_cuda.ptx import ptx_for_module, ptxas_available
from glue.backend_cuda.runtime import get_context, module
from glue.backend_cuda.runtime.module import ModuleCache
from glue.settings import config
from tests.backend_cuda import stub_driver
from tests.backend_cuda.kernels import axpy_ir

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
ELF = b"\x7fELF"


@pytest.fixture
def stub():
    with stub_driver.installed() as driver:
        yield driver


def loaded_images(stub):
    """Record what each module load hands the driver: [(call, image bytes)]."""
    seen = []
    for name in ("cuModuleLoadData", "cuModuleLoadDataEx"):
        real = getattr(stub, name)
        setattr(stub, name, lambda image, *rest, name=name, real=real: seen.append((name, bytes(image))) or
                real(image, *rest))
    return seen


def warpgroup_ptx(ptx: str) -> str:
    """`ptx` as if it were a warpgroup kernel's (it trades registers: `whole_program`)."""
    return ptx.replace("ret;", "setmaxnreg.inc.sync.aligned.u32 240;\n\tret;", 1)


def test_only_warpgroup_kernels_are_whole_programs():
    ptx = ptx_for_module(axpy_ir(), "sm_90a")
    assert not module.whole_program(ptx)
    assert module.whole_program(warpgroup_ptx(ptx))
    assert not module.whole_program(ptx.replace("ret;", "// setmaxnreg.inc is not in this kernel\n\tret;"))


def test_the_drivers_jit_links_a_kernel_and_compiles_a_warpgroup_kernel_whole(stub):
    """Without ptxas: the driver's JIT linker makes relocatable code of a kernel's PTX and links
    it; a warpgroup kernel's PTX is compiled as a whole program."""
    ctx = get_context()
    ptx = ptx_for_module(axpy_ir(), "sm_90a")
    seen = loaded_images(stub)
    with config.override(cuda_ptxas=False):
        ModuleCache(ctx).load(ptx)
        ModuleCache(ctx).load(warpgroup_ptx(ptx))
    assert seen == [("cuModuleLoadData", b"linked " + ptx.encode() + b"\0"),
                    ("cuModuleLoadDataEx", warpgroup_ptx(ptx).encode() + b"\0")]


@needs_ptxas
def test_under_cuda_ptxas_ptxas_compiles_a_kernel_once_and_the_disk_keeps_it(stub, monkeypatch):
    """For the arch its PTX targets: an H100's kernels target sm_90a, and ptxas refuses them
    for the device's own name, sm_90 (which once sent every kernel to the JIT). Relocatable
    code, which the driver's linker links; a warpgroup kernel whole."""
    ctx = get_context()
    assert ctx.device.arch == "sm_90"
    ptx = ptx_for_module(axpy_ir(), "sm_90a")
    compiled = []
    real_cubin = module.cubin
    monkeypatch.setattr(module, "cubin", lambda text, arch, relocatable: compiled.append((arch, relocatable)) or
                        real_cubin(text, arch, relocatable))
    seen = loaded_images(stub)
    with config.override(cuda_ptxas=True):
        for _ in range(2):  # the second, a new process's cache: the machine code comes from the disk
            ModuleCache(ctx).load(ptx)
            ModuleCache(ctx).load(warpgroup_ptx(ptx))
    assert compiled == [("sm_90a", True), ("sm_90a", False)]
    assert [call for call, _ in seen] == ["cuModuleLoadData"] * 4
    linked, whole = seen[0][1], seen[1][1]
    assert linked.startswith(b"linked " + ELF) and whole.startswith(ELF)
    assert [image for _, image in seen[2:]] == [linked, whole]


@needs_ptxas
def test_code_the_driver_will_not_load_goes_to_its_jit(stub):
    ctx = get_context()
    ptx = ptx_for_module(axpy_ir(), "sm_90a")
    seen = loaded_images(stub)
    refused = stub.cuModuleLoadData
    stub.cuModuleLoadData = lambda image: refused(image) and (222,) if image.startswith(b"linked \x7fELF") \
        else refused(image)  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION for ptxas's code
    with config.override(cuda_ptxas=True):
        ModuleCache(ctx).load(ptx)
    (_, refused_code), (_, jitted) = seen
    assert refused_code.startswith(b"linked " + ELF) and jitted == b"linked " + ptx.encode() + b"\0"
