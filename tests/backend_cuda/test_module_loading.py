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


def test_a_kernel_goes_to_the_drivers_jit_as_ptx_by_default(stub):
    ctx = get_context()
    ptx = ptx_for_module(axpy_ir(), ctx.device.arch)
    seen = loaded_images(stub)
    ModuleCache(ctx).load(ptx)
    assert seen == [("cuModuleLoadDataEx", ptx.encode() + b"\0")]


@needs_ptxas
def test_under_cuda_ptxas_ptxas_compiles_a_kernel_once_and_the_disk_keeps_it(stub, monkeypatch):
    ctx = get_context()
    ptx = ptx_for_module(axpy_ir(), ctx.device.arch)
    compiled = []
    real_cubin = module.cubin
    monkeypatch.setattr(module, "cubin", lambda text, arch: compiled.append(arch) or real_cubin(text, arch))
    seen = loaded_images(stub)
    with config.override(cuda_ptxas=True):
        ModuleCache(ctx).load(ptx)
        ModuleCache(ctx).load(ptx)  # a new process's cache: the machine code comes from the disk
    assert compiled == [ctx.device.arch]
    assert [call for call, _ in seen] == ["cuModuleLoadData"] * 2
    assert all(image.startswith(ELF) for _, image in seen) and seen[0][1] == seen[1][1]


@needs_ptxas
def test_code_the_driver_will_not_load_goes_to_its_jit(stub):
    ctx = get_context()
    ptx = ptx_for_module(axpy_ir(), ctx.device.arch)
    seen = loaded_images(stub)
    refused = stub.cuModuleLoadData
    stub.cuModuleLoadData = lambda image: refused(image) and (222,)  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    with config.override(cuda_ptxas=True):
        ModuleCache(ctx).load(ptx)
    assert [call for call, _ in seen] == ["cuModuleLoadData", "cuModuleLoadDataEx"]
