"""Tensor-core contractions (glue/backend_cuda/codegen/mma.py): which contractions take them,
their results against the reference on the CPU emulator (which runs ldmatrix and mma.sync lane
by lane) over random shapes, operand layouts, batches, 16-bit types and fused epilogues, with
poisoned outputs; on a GPU, the same against the reference and beside the CUDA-core kernel."""
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.backend_cuda.codegen.mma import KNOWN_TILES
from glue.backend_cuda.ptx import assemble, ptxas_available
from tests.backend_cuda import emulator
from tests.backend_cuda.cases import check_outputs, contraction_outputs_on_gpu

BF16 = ml_dtypes.bfloat16
needs_cc = pytest.mark.skipif(not emulator.available(), reason="the emulator needs a C compiler")

# (function, operand shapes as functions of (m, k, n), dtype)
FORMS = {
    "NN": (lambda a, b: a @ b, lambda m, k, n: [(m, k), (k, n)]),
    "NT": (lambda a, b: a @ b.T, lambda m, k, n: [(m, k), (n, k)]),
    "TN": (lambda a, b: a.T @ b, lambda m, k, n: [(k, m), (k, n)]),
    "TT": (lambda a, b: a.T @ b.T, lambda m, k, n: [(k, m), (n, k)]),
    "batched": (lambda a, b: a @ b, lambda m, k, n: [(2, m, k), (2, k, n)]),
    "bias gelu": (lambda a, b: nn.gelu(a @ b + 1.5), lambda m, k, n: [(m, k), (k, n)]),
    "f32 out": (lambda a, b: glue.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=gnp.float32),
                lambda m, k, n: [(m, k), (k, n)]),
}


@pytest.fixture(autouse=True)
def small_products_on_tensor_cores():
    """The small products these tests use take tensor cores too (left alone, a product of fewer
    than MIN_MMA_BLOCKS tiles goes to the CUDA-core kernel): the smallest tile, named."""
    with glue.config.override(cuda_mma_tile="64x64x32/2x2"):
        yield


def _lower(fn, args, **options):
    closed = glue.make_ir(fn)(*args)
    return closed, CudaBackend().lower(closed.graph, name="mma", **{"arch": "sm_90", "gemm": "codegen", **options})


def _strategies(low) -> list[str]:
    return [l.strategy for l in low["llvm"].launches if l.kind == "contraction"]


def test_16_bit_products_take_tensor_cores_and_others_do_not():
    x, w = np.ones((64, 32), BF16), np.ones((32, 48), BF16)
    assert _strategies(_lower(lambda a, b: a @ b, [x, w])[1])[0].startswith("mma bf16")
    h, g = x.astype(np.float16), w.astype(np.float16)
    assert _strategies(_lower(lambda a, b: a @ b, [h, g])[1])[0].startswith("mma f16")
    f, e = x.astype(np.float32), w.astype(np.float32)
    assert _strategies(_lower(lambda a, b: a @ b, [f, e])[1])[0].startswith("mma tf32")     # float32, default
    highest = lambda a, b: gnp.matmul(a, b, precision="highest")  # noqa: E731
    assert _strategies(_lower(highest, [f, e])[1])[0].startswith("tiled")                   # full float32
    assert _strategies(_lower(lambda a, b: a @ b, [x, g])[1])[0].startswith("mma tf32")     # mixed 16-bit types
    assert _strategies(_lower(lambda a, b: a @ b, [x, w], arch="sm_75")[1])[0].startswith("tiled")
    with glue.config.override(cuda_tensor_cores=False):
        assert _strategies(_lower(lambda a, b: a @ b, [x, w])[1])[0].startswith("tiled")


def test_the_staged_layout_follows_each_operands_memory():
    x = np.ones((64, 32), BF16)
    assert _strategies(_lower(lambda a, b: a @ b, [x, x.T.copy()])[1])[0].endswith("staged ko cp.async 4 stages")
    assert _strategies(_lower(lambda a, b: a @ b.T, [x, x])[1])[0].endswith("staged kk cp.async 4 stages")
    assert _strategies(_lower(lambda a, b: a.T @ b, [x.T.copy(), x.T.copy()])[1])[0].endswith("staged oo cp.async 4 stages")


@pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
def test_a_fused_prologue_stages_through_registers_with_16_byte_loads():
    x, w = np.ones((64, 32), np.float32), np.ones((32, 48), BF16)
    closed, low = _lower(lambda a, b: a.astype(gnp.bfloat16) @ b, [x, w])
    assert _strategies(low)[0].endswith("through registers")
    assert "ld.global.nc.v4" in "".join(low["ptx"].modules.values())


@pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
@pytest.mark.parametrize("tile", sorted(KNOWN_TILES))
def test_ptxas_accepts_every_tile_without_spilling(tile):
    with glue.config.override(cuda_mma_tile=tile):
        _assemble_without_spills(512, 512)


def test_the_tile_follows_the_products_size_and_small_ones_stay_on_cuda_cores():
    with glue.config.override(cuda_mma_tile=None):
        for (m, n), want in [((2048, 2048), "128x128x32 warps 2x2"), ((1536, 1024), "128x64x32 warps 2x2"),
                             ((512, 512), "64x64x32 warps 2x2"), ((64, 256), "tiled")]:
            x, w = np.ones((m, 64), BF16), np.ones((64, n), BF16)
            assert want in _strategies(_lower(lambda a, b: a @ b, [x, w])[1])[0], (m, n)


def _assemble_without_spills(m, n):
    x, w = np.ones((m, 64), BF16), np.ones((64, n), BF16)
    closed, low = _lower(lambda a, b: nn.gelu(a @ b), [x, w])
    for ptx in low["ptx"].modules.values():
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "ldmatrix" in ptx
        assert "0 bytes spill stores" in assemble(ptx, "sm_90")


@needs_cc
@settings(deadline=None, max_examples=12)
@given(form=st.sampled_from(sorted(FORMS)), m=st.integers(1, 150), k=st.integers(1, 80), n=st.integers(1, 140),
       dtype=st.sampled_from([BF16, np.float16, np.float32]), seed=st.integers(0, 2**31))
def test_emulated_tensor_core_kernels_compute_the_reference(form, m, k, n, dtype, seed):
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes(m, k, n)]
    closed, low = _lower(fn, args)
    assert any(s.startswith("mma") for s in _strategies(low))
    all_args = list(closed.consts) + args
    outs = emulator.run_program(low["llvm"], all_args, poison=0xFF)
    check_outputs(closed, all_args, outs, f"{form} {m}x{k}x{n}", tf32=True)


@needs_cc
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32], ids=["bf16", "f16", "tf32"])
def test_emulated_16_byte_staging_computes_the_reference(form, dtype):
    """Extents that are multiples of 8 (but not of the tile) stage each chunk with 16-byte loads;
    a 16-bit output's tiles wholly inside it store 16-byte vectors after a quad's shuffles
    (`AccumulatorStores.store_quads`; the emulator runs the shuffles), its edge tiles pairs."""
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes(136, 48, 72)]
    closed, low = _lower(fn, args)
    ptx = "".join(low["ptx"].modules.values())
    assert "cp.async.cg.shared.global" in ptx and re.search(r"cp\.async\.wait_group\s+2;", ptx)
    sixteen_bit_out = dtype != np.float32 and form != "f32 out"
    assert ("st.global.v4.b32" in ptx and "shfl.sync.bfly" in ptx) == sixteen_bit_out
    all_args = list(closed.consts) + args
    check_outputs(closed, all_args, emulator.run_program(low["llvm"], all_args, poison=0xFF), form, tf32=True)


@needs_cc
@pytest.mark.parametrize("tile", sorted(KNOWN_TILES))
def test_emulated_every_tile_computes_the_reference(tile):
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(BF16) for s in [(72, 40), (40, 80)]]
    with glue.config.override(cuda_mma_tile=tile):  # stages are made when first asked for
        closed, low = _lower(lambda a, b: a @ b, args)
        program = low["llvm"]
    assert f"mma bf16 {tile.replace('/', ' warps ')}" in _strategies(low)[0]
    check_outputs(closed, args, emulator.run_program(program, args, poison=0xFF), tile, tf32=True)


@needs_cc
@pytest.mark.parametrize("form", ["NN", "TT", "batched"])
@pytest.mark.parametrize("k", [32, 64, 160, 200])
def test_emulated_tiles_that_divide_the_product_compute_the_reference(form, k):
    """Where the tiles divide M and N (and the step K), the copies test no bound; K of 1, 2, 5
    and 7 steps (the last partial) runs the loop that copies ahead, the one that only
    multiplies, or both."""
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(k)
    args = [rng.standard_normal(s).astype(BF16) for s in shapes(128, k, 64)]
    with glue.config.override(cuda_mma_tile="64x64x32/2x2"):
        closed, low = _lower(fn, args)
        program = low["llvm"]
    assert "cp.async" in _strategies(low)[0]
    check_outputs(closed, args, emulator.run_program(program, args, poison=0xFF), f"{form} k={k}", tf32=True)


@needs_cc
@pytest.mark.parametrize("form", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("tile", ["128x128x32/2x2", "128x256x32/2x4", "256x128x32/4x2", "128x128x64/2x2", "64x64x32/2x2"])
@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16", "tf32"])
def test_emulated_fragment_loads_are_free_of_bank_conflicts(form, tile, dtype):
    """Every ldmatrix reads its eight rows from eight distinct groups of banks, whichever way
    each operand is staged (K fastest: 64- to 256-byte rows; M or N fastest: 128 to 512)."""
    fn, shapes = FORMS[form]
    args = [np.ones(s, dtype) for s in shapes(64, 64, 64)]
    with glue.config.override(cuda_mma_tile=tile):
        closed, low = _lower(fn, args)
        program = low["llvm"]
    emulator.ldmatrix_conflicts()
    emulator.run_program(program, args)
    assert emulator.ldmatrix_conflicts() == 0


def test_tf32_fragments_load_by_ldmatrix_where_k_is_fastest():
    """A K-fastest float32 operand's fragments load as matrices of 8 rows x 4 words (then round
    to TF32); an M- or N-fastest operand's load word by word."""
    x = np.ones((256, 256), np.float32)
    for fn, by_ldmatrix in ((lambda a, b: a @ b.T, 2), (lambda a, b: a @ b, 1), (lambda a, b: a.T @ b, 0)):
        with glue.config.override(cuda_mma_tile="64x64x32/2x2"):
            closed, low = _lower(fn, [x, x])
            ptx = "".join(low["ptx"].modules.values())
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx and "cvt.rna.tf32.f32" in ptx
        assert ("ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx) == (by_ldmatrix > 0)
        assert ("ld.shared.b32" in ptx) == (by_ldmatrix < 2)


def test_an_unknown_tile_is_a_glue_error():
    x = np.ones((8, 8), BF16)
    with glue.config.override(cuda_mma_tile="7x7x7/1x1"), pytest.raises(glue.GlueError, match="cuda_mma_tile"):
        _lower(lambda a, b: a @ b, [x, x])[1]["llvm"]


@needs_cc
def test_emulated_adversarial_values_stay_the_references():
    """Infinities and NaNs pass through the 16-bit staging as they are; zero-filled padding
    never turns into NaN (0 * inf) where the shape is not a multiple of the tile."""
    x = np.full((70, 40), 2.0, BF16)
    w = np.ones((40, 50), BF16)
    x[3, 5], x[9, 0], w[7, 2] = np.inf, np.nan, -np.inf
    closed, low = _lower(lambda a, b: a @ b, [x, w])
    check_outputs(closed, [x, w], emulator.run_program(low["llvm"], [x, w], poison=0xFF), "adversarial", tf32=True)


@pytest.mark.cuda
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 45, 29), (256, 512, 384), (1000, 768, 3072)])
@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16", "tf32"])
def test_on_the_gpu_tensor_core_kernels_compute_the_reference(form, shape, dtype):
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes(*shape)]
    closed = glue.make_ir(fn)(*args)
    outs, all_args = contraction_outputs_on_gpu(closed, args, "mma", name="mma", gemm="codegen")
    check_outputs(closed, all_args, outs, f"{form} {shape}", tf32=True)
