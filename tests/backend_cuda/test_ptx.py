"""LLVM IR -> PTX for sm_90/sm_80/sm_75, checked by ptxas where it is installed; no GPU needed."""
import re

import pytest
from hypothesis import given, strategies as st

from glue.backend_cuda.ptx import PTX_FEATURES, assemble, ptx_for_module, ptxas_available
from glue.backend_cuda.runtime.module import entry_params
from glue.errors import BackendError
from tests.backend_cuda.kernels import PARAM_TYPES, axpy_ir, empty_ir, signature_ir

ARCHS = ["sm_90", "sm_80", "sm_75"]
needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_targets_the_arch_with_its_isa_version(arch):
    ptx = ptx_for_module(axpy_ir(), arch)
    version = PTX_FEATURES[arch].removeprefix("+ptx")
    assert re.search(rf"^\.version {version[0]}\.{version[1]}$", ptx, re.M)
    assert re.search(rf"^\.target {arch}$", ptx, re.M)
    assert ".visible .entry axpy(" in ptx


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_ptxas_assembles_the_kernel(arch):
    report = assemble(ptx_for_module(axpy_ir(), arch), arch)
    assert f"Compiling entry function 'axpy' for '{arch}'" in report
    assert "0 bytes spill stores" in report


def test_nvvm_annotations_still_mark_kernels():
    plain = axpy_ir().replace("define ptx_kernel void", "define void")
    annotated = plain + '\n!nvvm.annotations = !{!0}\n!0 = !{ptr @"axpy", !"kernel", i32 1}\n'
    assert ".entry axpy(" in ptx_for_module(annotated)


def test_module_without_kernel_is_an_error():
    with pytest.raises(BackendError, match="ptx_kernel"):
        ptx_for_module(axpy_ir().replace("define ptx_kernel void", "define void"))


def test_bad_ir_and_unknown_arch_are_backend_errors():
    with pytest.raises(BackendError, match="invalid LLVM IR"):
        ptx_for_module("define void @f( {")
    with pytest.raises(BackendError, match="sm_10"):
        ptx_for_module(empty_ir(), "sm_10")


@needs_ptxas
def test_ptxas_rejection_is_reported():
    bad = ptx_for_module(axpy_ir()).replace("add.rn.f32", "add.bogus.f32")
    with pytest.raises(BackendError, match="rejected"):
        assemble(bad)


@given(st.lists(st.sampled_from(sorted(PARAM_TYPES)), max_size=8))
def test_entry_params_read_back_the_signature(kinds):
    params = entry_params(ptx_for_module(signature_ir(kinds), opt_level=0))["sig"]
    assert [p.ptx_type for p in params] == [PARAM_TYPES[k][1] for k in kinds]
    assert [p.pointer for p in params] == [k == "ptr" for k in kinds]


def test_entry_params_of_an_aggregate_parameter():
    ptx = ".visible .entry k(\n\t.param .align 8 .b8 k_param_0[24],\n\t.param .f32 k_param_1\n)\n{ ret; }"
    agg, scalar = entry_params(ptx)["k"]
    assert (agg.ptx_type, agg.count, agg.align, agg.format) == ("b8", 24, 8, "24s")
    assert (scalar.ptx_type, scalar.count, scalar.align) == ("f32", 1, 0)
