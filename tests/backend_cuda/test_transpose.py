"""Pointwise kernels that transpose their input (transpose.py): which kernels take the tiled
strategy, their PTX (ptxas, sm_90 and sm_80), and their results on the host emulator against the
reference, over shapes past and short of whole tiles, every float dtype and batched layouts;
and, on a GPU, with poisoned outputs."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.backend_cuda.ptx import assemble, ptx_for_module, ptxas_available
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.testing.check import tolerance_dtypes
from tests.backend_cuda import emulator
from tests.backend_cuda.cases import BF16

needs_cc = pytest.mark.skipif(not emulator.available(), reason="no C compiler for the kernel emulator")
needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
TRANSPOSE = "transpose 32x32 tiles through shared memory"

CASES = {
    "matrix": (lambda x: x.T * 2.0 + 1.0, (100, 70), np.float32),
    "whole tiles": (lambda x: x.T, (64, 96), np.float32),
    "bf16 to f32": (lambda x: x.T.astype(gnp.float32), (40, 33), BF16),
    "f16": (lambda x: gnp.tanh(x.T), (48, 64), np.float16),
    "batched swap": (lambda x: gnp.swapaxes(x, 1, 2) - 0.5, (3, 40, 50), np.float32),
    "heads": (lambda x: gnp.transpose(x, (0, 2, 1)) * 3.0, (2, 96, 36), BF16),
    "f64": (lambda x: x.T + 1.0, (33, 65), np.float64),
    "bool": (lambda x: (x > 0.0).T, (40, 70), np.float32),
    "int8": (lambda x: x.astype(gnp.int8).T, (70, 40), np.float32),
    # heads merged back, transposed: the read index splits the tiled dim by a reshape
    "merged heads": (lambda x: x.reshape(72, 64).T * 1.5, (72, 2, 32), np.float32),
    # a concatenation's sources: one tile per load
    "concatenated": (lambda x: gnp.concatenate([x, x * 2.0, x[:, :17]], axis=1).T, (40, 50), np.float32),
}


def _lower(fn, x, arch="sm_90"):
    closed = glue.make_ir(fn)(x)
    return closed, CudaBackend().lower(closed.graph, name="transpose", arch=arch, gemm="codegen")


def _input(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _check(closed, x, got, label):
    want = run_graph(closed.graph, [x], float64=True)
    for g, w, d in zip(got, want, tolerance_dtypes(closed.graph, tf32=True)):
        problem = mismatch(np.asarray(g), w, d)
        assert problem is None, f"{label}: {problem}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_transposing_pointwise_kernel_runs_in_tiles(name):
    fn, shape, dtype = CASES[name]
    _, low = _lower(fn, _input(shape, dtype))
    assert [launch.strategy.split(" g")[0] for launch in low["llvm"].launches] == [TRANSPOSE]


def test_copies_along_the_same_dim_and_small_or_mixed_kernels_stay_plain():
    """Contiguous along the same dim (a head split's reshape), a dim under one tile, and two
    inputs read in different layouts keep the plain pointwise strategy."""
    cases = [(lambda x: gnp.transpose(x.reshape(4, 32, 2, 16), (0, 2, 1, 3)), [(128, 32)]),
             (lambda x: x.T + 1.0, [(16, 200)]),
             (lambda x, y: x.T + y, [(64, 48), (48, 64)])]
    for fn, shapes in cases:
        args = [_input(s, np.float32) for s in shapes]
        closed = glue.make_ir(fn)(*args)
        low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen")
        assert all(TRANSPOSE not in launch.strategy for launch in low["llvm"].launches), shapes


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_tiled_transpose_assembles_without_spills(arch):
    for name in ("matrix", "bf16 to f32", "f64"):
        fn, shape, dtype = CASES[name]
        _, low = _lower(fn, _input(shape, dtype), arch)
        for kernel in low["llvm"].kernels.values():
            info = assemble(ptx_for_module(kernel.llvm_ir, arch), arch)
            assert "spill" not in info or " 0 bytes spill" in info, (name, info)


@needs_cc
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tiled_transpose_computes_the_reference(name):
    fn, shape, dtype = CASES[name]
    x = _input(shape, dtype, 1)
    closed, low = _lower(fn, x)
    _check(closed, x, emulator.run_program(low["llvm"], [x], poison=0xFF), name)


@needs_cc
@settings(deadline=None)
@given(rows=st.integers(32, 130), cols=st.integers(32, 130), batch=st.integers(1, 3),
       dtype=st.sampled_from([np.float32, BF16, np.float16]))
def test_random_shapes_transpose_as_the_reference(rows, cols, batch, dtype):
    x = _input((batch, rows, cols), dtype, rows * cols)
    closed, low = _lower(lambda x: gnp.swapaxes(x, 1, 2) * 0.5, x)
    assert TRANSPOSE in low["llvm"].launches[0].strategy
    _check(closed, x, emulator.run_program(low["llvm"], [x], poison=0xFF), f"{batch}x{rows}x{cols} {dtype}")


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_the_gpu_the_tiled_transpose_computes_the_reference(name):
    fn, shape, dtype = CASES[name]
    x = _input(shape, dtype, 2)
    closed = glue.make_ir(fn)(x)
    with glue.config.override(cuda_poison=0xFF):
        exe = CudaBackend().lower(closed.graph, name="transpose", gemm="codegen").compile()
        _check(closed, x, [np.asarray(o) for o in exe(x)], name)
