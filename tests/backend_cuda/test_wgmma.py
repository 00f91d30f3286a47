"""The warpgroup kernel of sm_90a (glue/backend_cuda/codegen/wgmma.py): which contractions take
it and which stay on mma.sync, its tensor maps, ptxas's report on every layout and width, TF32
products and the K-major copies of their operands; on an H100/H200, its results against the
reference over layouts, batches, edges that are not multiples of the tile, 16-bit types, TF32
and fused epilogues, with poisoned outputs."""
import re

import ml_dtypes
import numpy as np
import pytest

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend, detected_arch
from glue.backend_cuda.ptx import assemble, ptxas_available
from tests.backend_cuda.cases import check_outputs, contraction_outputs_on_gpu

BF16 = ml_dtypes.bfloat16

# (function, operand shapes as functions of (m, k, n))
FORMS = {
    "NN": (lambda a, b: a @ b, lambda m, k, n: [(m, k), (k, n)]),
    "NT": (lambda a, b: a @ b.T, lambda m, k, n: [(m, k), (n, k)]),
    "TN": (lambda a, b: a.T @ b, lambda m, k, n: [(k, m), (k, n)]),
    "TT": (lambda a, b: a.T @ b.T, lambda m, k, n: [(k, m), (n, k)]),
    "batched": (lambda a, b: a @ b, lambda m, k, n: [(3, m, k), (3, k, n)]),
    "shared weight": (lambda a, b: a @ b, lambda m, k, n: [(3, m, k), (k, n)]),
    "bias gelu": (lambda a, b: nn.gelu(a @ b + 1.5), lambda m, k, n: [(m, k), (k, n)]),
    "residual f32 out": (lambda a, b: glue.lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                           preferred_element_type=gnp.float32) * 0.5 + 1.0,
                         lambda m, k, n: [(m, k), (k, n)]),
}
LAYOUTS = {"NN": "ko", "NT": "kk", "TN": "oo", "TT": "ok"}


def _update_like(a, b):
    """Three outputs of many operations each from the product, as a fused optimizer update has:
    an epilogue long enough to run as a loop (wgmma.LOOPED_EPILOGUE)."""
    g = (a @ b).astype(gnp.float32)
    m = 0.1 * g + 0.5
    v = 0.001 * g * g + 0.25
    step = m / (gnp.sqrt(v / 0.999) + 1e-8)
    return g * 0.99 - 0.01 * step + gnp.tanh(m) * gnp.exp(-v), m, v


FORMS["update-like epilogue"] = (_update_like, lambda m, k, n: [(m, k), (k, n)])


def _lower(fn, args, arch="sm_90a", autotune=False):
    """The program lowered for glue's own kernels; with `autotune` off, in the cost model's
    tilings alone (no raced variants)."""
    closed = glue.make_ir(fn)(*args)
    with glue.config.override(autotune=autotune):
        low = CudaBackend().lower(closed.graph, name="wg", arch=arch, gemm="codegen")
        low["llvm"]  # (stages are built when first read)
    return closed, low


def _contractions(low):
    return [launch for launch in low["llvm"].launches if launch.kind == "contraction"]


def _strategy(fn, shapes, dtype=BF16, arch="sm_90a") -> str:
    return _contractions(_lower(fn, [np.ones(s, dtype) for s in shapes], arch)[1])[0].strategy


@pytest.mark.parametrize("form", sorted(LAYOUTS))
def test_every_layout_is_read_in_place_by_tma(form):
    fn, shapes = FORMS[form]
    strategy = _strategy(fn, shapes(1024, 512, 1152))
    assert strategy.startswith("wgmma bf16 128x"), strategy
    assert f"staged {LAYOUTS[form]} " in strategy


def test_what_stays_on_mma_sync():
    fn, shapes = FORMS["NN"]
    big = shapes(1024, 512, 1152)
    assert _strategy(fn, big, np.float16).startswith("wgmma f16")
    assert _strategy(fn, big, arch="sm_90").startswith("mma bf16")          # no wgmma without sm_90a
    assert _strategy(fn, big, np.float32).startswith("mma tf32")            # TF32 with B MN-major: mma.sync
    assert _strategy(fn, shapes(1024, 100, 1152)).startswith("mma bf16")    # 200-byte rows: not TMA's 16
    assert not _strategy(fn, shapes(256, 512, 256)).startswith("wgmma")      # too few blocks
    cast = lambda a, b: a @ b.astype(BF16)  # noqa: E731  (a rounding prologue: computed, not a view)
    x, w = np.ones((1024, 512), BF16), np.ones((512, 1152), np.float32)
    assert _contractions(_lower(cast, [x, w])[1])[0].strategy.startswith("mma bf16")
    with glue.config.override(cuda_mma_tile="128x128x32/2x2"):
        assert _strategy(fn, big).startswith("mma bf16")


def test_tf32_takes_the_warpgroup_kernel_where_both_operands_are_k_major():
    """`wgmma` reads TF32 tiles K-major only: x @ w.T reads both in place (32 float32 values a
    128-byte stage row, k8 a wgmma); at precision "highest" float32 stays off tensor cores."""
    fn, shapes = FORMS["NT"]
    args = [np.ones(s, np.float32) for s in shapes(1024, 512, 1152)]
    _, low = _lower(fn, args)
    (launch,) = _contractions(low)
    assert launch.strategy.startswith("wgmma tf32 128x") and "x32 tma" in launch.strategy, launch.strategy
    assert " staged kk " in launch.strategy
    assert {m.dtype for m in launch.tensor_maps} == {"tf32"}  # (the copy engine rounds them to TF32)
    assert all(m.box[0] == 32 for m in launch.tensor_maps)
    ptx = low["ptx"].modules[launch.symbol]
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx and "k8.f32.tf32.tf32" in ptx
    highest = lambda a, b: gnp.matmul(a, b.T, precision="highest")  # noqa: E731
    assert not _contractions(_lower(highest, args)[1])[0].strategy.startswith("wgmma")


@pytest.mark.parametrize("form", ["NN", "TN", "TT", "batched"])
def test_a_large_tf32_product_writes_its_mn_major_operands_k_major_first(form):
    """Past wgmma.COPY_FLOPS, a TF32 product with an operand `wgmma` cannot read in place runs
    as a tiled transpose of each such operand into the stream's scratch region, then the
    warpgroup kernel reading both K-major; its split-K partials lie past the copies."""
    fn, shapes = FORMS[form]
    m, k, n = 776, 4096, 776
    _, low = _lower(fn, [np.ones(s, np.float32) for s in shapes(m, k, n)])
    copies = [launch for launch in low["llvm"].launches if launch.kind == "pointwise"]
    (product,) = _contractions(low)
    copied = {"NN": 1, "TN": 2, "TT": 1, "batched": 1}[form]
    assert len(copies) == copied
    assert all(c.strategy.startswith("transpose") for c in copies), [c.strategy for c in copies]
    assert product.strategy.startswith("wgmma tf32") and " staged kk " in product.strategy, product.strategy
    written = [p for c in copies for p in c.params if p.kind == "scratch"]
    assert written == [p for p in product.params if p.kind == "scratch"][:copied]
    copy_bytes = (3 if form == "batched" else 1) * m * k * 4  # (m == n: either operand)
    assert [p.offset for p in written] == [i * copy_bytes for i in range(copied)]
    partials = [p for p in product.params if p.kind == "scratch"][copied:]
    assert ("split-k" in product.strategy) == bool(partials)
    assert all(p.offset >= copied * copy_bytes for p in partials)
    assert low["llvm"].scratch[0] >= copied * copy_bytes
    small = _lower(fn, [np.ones(s, np.float32) for s in shapes(512, 512, 512)])[1]  # under COPY_FLOPS
    assert [launch.kind for launch in small["llvm"].launches] == ["contraction"]


def test_the_width_follows_the_number_of_waves():
    fn, shapes = FORMS["NN"]
    assert " 128x256x64 " in _strategy(fn, shapes(4096, 512, 4096))   # 512 blocks of 128 x 256: 4 waves
    assert " 128x192x64 " in _strategy(fn, shapes(4096, 768, 2304))   # 384 blocks 192 wide: 3 waves (256: 3, 128: 5)
    assert " 128x192x64 " in _strategy(fn, shapes(4096, 3072, 768))   # 128 blocks: one wave (256: 96 blocks)
    assert " 128x128x64 " in _strategy(fn, shapes(768, 4096, 2304))   # 108 blocks (192: 72, 256: 54)


def test_tilings_the_cost_model_finds_close_are_raced_as_variants_of_their_own():
    """With autotune on, a large warpgroup product's other tilings within RACE_MARGIN of the
    model's choice are variants "codegen 128x<width>[ split-k <s>]" (each a kernel in that
    tiling, named by its strategy); with it off, or for a product under RACE_FLOPS, only the
    model's choice is built."""
    from glue.backend_cuda.codegen.wgmma import RACE_FLOPS, RACED_TILINGS

    fn, shapes = FORMS["NN"]
    args = [np.ones(s, BF16) for s in shapes(4096, 768, 3072)]  # mlp up: 256, 192 and 128 wide all close
    variants = {launch.variant: launch.strategy for launch in _contractions(_lower(fn, args, autotune=True)[1])}
    assert list(variants)[0] == "codegen" and 1 < len(variants) <= RACED_TILINGS
    for variant, strategy in variants.items():
        if variant != "codegen":
            width, _, split = variant.removeprefix("codegen ").partition(" split-k ")
            assert f" {width}x64 " in strategy and strategy.endswith(f"split-k {split}" if split else "persistent")
    assert len(set(variants.values())) == len(variants)
    # a split needs working memory sized before the race: no variant splits where the model's choice does not
    assert not any("split-k" in strategy for strategy in variants.values())
    assert {launch.variant for launch in _contractions(_lower(fn, args)[1])} == {"codegen"}
    small = [np.ones(s, BF16) for s in shapes(1024, 256, 1024)]
    assert 2 * 1024 * 256 * 1024 < RACE_FLOPS
    assert {launch.variant for launch in _contractions(_lower(fn, small, autotune=True)[1])} == {"codegen"}


def test_few_tiles_over_a_long_k_split_it():
    """A weight gradient of a GPT-width layer (768 x 768 over 4096 tokens) is 36 tiles: split
    in three, 108 blocks take 21 or 22 of K's 64 steps each; its partials and counters are the
    kernel's working memory (two parameters after its operands). Many tiles, or a short K, do
    not split."""
    fn, shapes = FORMS["TN"]
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(768, 4096, 768)])
    launch = _contractions(low)[0]
    assert launch.strategy.endswith(" 128x128x64 tma 6 stages staged oo warp-specialized 2+1 warpgroups "
                                    "persistent split-k 3"), launch.strategy
    assert launch.grid == 108
    # raced beside it: 128 x 192 tiles split in 5 (the partials of 120 units, 1.7 times as
    # many bytes) and 128 x 128 tiles split in 2
    raced = {launch.variant: launch.strategy for launch in
             _contractions(_lower(fn, [np.ones(s, BF16) for s in shapes(768, 4096, 768)], autotune=True)[1])}
    assert raced.keys() == {"codegen", "codegen 128x192 split-k 5", "codegen 128x128 split-k 2"}, raced
    assert raced["codegen 128x192 split-k 5"].endswith(" 128x192x64 tma 5 stages staged oo warp-specialized "
                                                       "2+1 warpgroups persistent split-k 5")
    assert [p.kind for p in launch.params[-2:]] == ["scratch", "counters"]
    assert low["llvm"].scratch == (3 * 36 * 128 * 128 * 4,)
    assert "split-k" not in _strategy(fn, shapes(4096, 4096, 4096))
    assert "split-k" not in _strategy(fn, shapes(768, 512, 768))  # 8 steps of K: too few to split


def test_a_split_tile_is_finished_by_the_last_warp_to_arrive_as_one_warp():
    """A split kernel's consumer warps count in through lane 0 and share its count (the 16-byte
    stores' quad shuffles need the whole warp on one branch); the last to arrive waits for the
    others' written partials (an acquiring load) and reads every split but its own, which it
    keeps in registers (predicated loads). An unsplit kernel has none of it."""
    fn, shapes = FORMS["TN"]
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(768, 4096, 768)])
    split = low["ptx"].modules[_contractions(low)[0].symbol]
    for text in ("shfl.sync.idx.b32", "ld.acquire.gpu.global.u32", "@!keep ld.global.f32", "bar.warp.sync",
                 "shfl.sync.bfly"):
        assert text in split, text
    assert "vote.sync" not in split
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(4096, 768, 768)])
    unsplit = low["ptx"].modules[_contractions(low)[0].symbol]
    assert "ld.acquire" not in unsplit and "@!keep" not in unsplit and "shfl.sync.bfly" in unsplit


@pytest.mark.parametrize("form", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16 out", "f32 out"])
def test_the_epilogue_stores_neighbouring_columns_as_one_vector(form, dtype):
    """Whatever the operands' layout (NT once stored every bf16 column alone: nothing it loads
    moves along N), a fragment's column pair is one store; a 16-bit output's tiles wholly inside
    it go further: each quad of lanes trades its words (shuffles) so that every lane stores 8
    columns of a row as one 16-byte vector (`AccumulatorStores.store_quads`), and only tiles on
    the edge store pairs."""
    fn, shapes = FORMS[form]
    for m, n, edges in ((4096, 768, False), (4104, 776, True)):
        _, low = _lower(lambda a, b: fn(a, b).astype(dtype), [np.ones(s, BF16) for s in shapes(m, 256, n)])
        ptx = low["ptx"].modules[_contractions(low)[0].symbol]
        stores = set(re.findall(r"st\.global\.[a-z0-9.]+", ptx))
        if dtype == BF16:
            assert stores == ({"st.global.v4.b32", "st.global.b32"} if edges else {"st.global.v4.b32"}), stores
            assert len(re.findall(r"shfl\.sync\.bfly", ptx)) == 4 * ptx.count("st.global.v4.b32")
        else:
            assert stores == {"st.global.v2.b32"}, stores


def test_tensor_maps_describe_each_operand_as_it_lies():
    fn, shapes = FORMS["batched"]
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(1000, 200, 1096)])
    launch = _contractions(low)[0]
    a, b = launch.tensor_maps
    assert (a.dims, a.strides, a.box) == ((200, 1000, 3), (400, 400_000), (64, 128, 1))   # K-major
    assert (b.dims, b.strides, b.box) == ((1096, 200, 3), (2192, 438_400), (64, 64, 1))   # N-major
    assert (a.param, b.param) == (0, 1)
    assert ".param .align 64 .b8" in low["ptx"].modules[launch.symbol]  # by value, in parameter space
    fn, shapes = FORMS["shared weight"]  # a weight shared by the batch: the batch folds into M
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(1000, 200, 1096)])
    a, b = _contractions(low)[0].tensor_maps
    assert (a.dims, b.dims) == ((200, 3000, 1), (1096, 200, 1))


def test_a_long_epilogue_is_a_loop_over_accumulators_parked_in_local_memory():
    """Unrolled over a 256-wide tile's 64 register pairs, a fused update's epilogue made 100 KB
    of PTX that took ptxas seconds; looped, its stores appear once per half of the fragment."""
    fn, shapes = FORMS["update-like epilogue"]
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(4096, 512, 4096)])
    launch = _contractions(low)[0]
    assert " 128x256x64 " in launch.strategy
    ptx = low["ptx"].modules[launch.symbol]
    assert len(re.findall(r"st\.global\.", ptx)) == 3 * 2, ptx.count("st.global")
    assert len(re.findall(r"ld\.local\.", ptx)) == 2 * 2
    _, low = _lower(FORMS["bias gelu"][0], [np.ones(s, BF16) for s in shapes(4096, 512, 4096)])
    assert "ld.local" not in low["ptx"].modules[_contractions(low)[0].symbol]  # a short one stays unrolled


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("form", sorted(LAYOUTS))
@pytest.mark.parametrize("n", [4096, 1152])
def test_ptxas_accepts_every_layout_and_width_without_spilling(form, n):
    fn, shapes = FORMS[form]
    _, low = _lower(fn, [np.ones(s, BF16) for s in shapes(4096, 512, n)])
    launch = _contractions(low)[0]
    report = assemble(low["ptx"].modules[launch.symbol], "sm_90a")
    assert " 0 bytes spill stores" in report, report
    assert "serialized" not in report, report  # wgmma kept asynchronous (no C7515 warning)


@pytest.mark.cuda
@pytest.mark.skipif(detected_arch() != "sm_90a", reason="the warpgroup kernel needs an sm_90 GPU")
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("shape", [(1000, 2200, 1096), (776, 4096, 776), (64, 8192, 4104)],
                         ids=["edges", "split K, edges", "one tile row, long K"])
def test_on_the_gpu_tf32_warpgroup_kernels_compute_the_reference(form, shape):
    """float32 operands on TF32 (read K-major in place, or written K-major first), against the
    float64 reference at TF32's tolerance."""
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(12)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes(*shape)]
    closed = glue.make_ir(fn)(*args)
    outs, all_args = contraction_outputs_on_gpu(closed, args, "wgmma tf32", name="wg", gemm="codegen")
    check_outputs(closed, all_args, outs, f"{form} {shape}", tf32=True)


@pytest.mark.cuda
@pytest.mark.skipif(detected_arch() != "sm_90a", reason="the warpgroup kernel needs an sm_90 GPU")
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("shape", [(1000, 200, 1096), (1024, 64, 1152), (2048, 4096, 1024), (4096, 128, 760),
                                   (520, 2000, 392)],
                         ids=["edges", "one step", "long K", "192 wide, N edge", "split K, edges"])
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "f16"])
def test_on_the_gpu_warpgroup_kernels_compute_the_reference(form, shape, dtype):
    fn, shapes = FORMS[form]
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes(*shape)]
    closed = glue.make_ir(fn)(*args)
    outs, all_args = contraction_outputs_on_gpu(closed, args, "wgmma", name="wg", gemm="codegen")
    check_outputs(closed, all_args, outs, f"{form} {shape}")


@pytest.mark.cuda
@pytest.mark.skipif(detected_arch() != "sm_90a", reason="the warpgroup kernel needs an sm_90 GPU")
@pytest.mark.parametrize("form", ["NN", "TN", "bias gelu"])
@pytest.mark.parametrize("shape", [(4104, 776, 3080), (520, 8192, 1032), (768, 4096, 768)],
                         ids=["edges", "split K, edges", "uneven splits"])
def test_on_the_gpu_every_raced_tiling_computes_the_reference(form, shape):
    """Each variant of glue's own kernel the race may pick (`raced_tilings`) run alone, with
    poisoned outputs, against the reference."""
    from dataclasses import replace

    from glue.backend_cuda.executor import CudaExecutable

    fn, shapes = FORMS[form]
    rng = np.random.default_rng(13)
    args = [rng.standard_normal(s).astype(BF16) for s in shapes(*shape)]
    closed = glue.make_ir(fn)(*args)
    all_args = list(closed.consts) + args
    with glue.config.override(autotune=True, cuda_poison=0xFF):
        low = CudaBackend().lower(closed.graph, name="tilings", gemm="codegen")
        program, ptx = low["llvm"], low["ptx"]
        variants = sorted({launch.variant for launch in program.launches})
        assert len(variants) > 1, variants
        for variant in variants:
            raced = {launch.group for launch in program.launches if launch.variant == variant}
            alone = replace(program, launches=[replace(launch, variant="codegen") for launch in program.launches
                                               if launch.variant == variant or launch.group not in raced])
            outs = [np.asarray(o) for o in CudaExecutable(alone, ptx, "tilings")(*all_args)]
            check_outputs(closed, all_args, outs, f"{form} {shape} {variant}")


def _tf32_nearest(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`x` (float32) rounded to TF32's 10 mantissa bits, to nearest: ties to even, ties away."""
    bits = x.view(np.uint32).astype(np.uint64)
    kept = lambda b: (b & 0xFFFFE000).astype(np.uint32).view(np.float32)  # noqa: E731
    return kept(bits + 0xFFF + ((bits >> 13) & 1)), kept(bits + 0x1000)


@pytest.mark.cuda
@pytest.mark.skipif(detected_arch() != "sm_90a", reason="the warpgroup kernel needs an sm_90 GPU")
@pytest.mark.parametrize("path", ["wgmma in place", "wgmma K-major copy", "mma.sync"])
def test_a_tf32_product_rounds_its_operands_to_nearest(path):
    """x times an identity at the default precision is x rounded to TF32: to nearest, on every
    path (the copy engine rounds what wgmma reads; mma.sync rounds its fragments). Dropping the
    low bits instead, as wgmma does with float32 as it lies, shrinks every product toward zero
    and moved a 10-step training loss by 1e-3."""
    m, k = 2048, 1024
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    if path == "wgmma in place":
        fn, eye = (lambda a, b: a @ b.T), np.eye(2048, k, dtype=np.float32)
    else:
        fn, eye = (lambda a, b: a @ b), np.eye(k, 2048, dtype=np.float32)
    settings = {"cuda_mma_tile": "128x128x32/2x2"} if path == "mma.sync" else {}
    with glue.config.override(**settings):
        f = glue.jit(fn, backend="cuda", backend_options={"gemm": "codegen"})
        got = np.asarray(f(x, eye))
        strategy = "; ".join(k.strategy for k in next(iter(f._compiled.values())).executable.kernels)
    assert ("mma tf32" if path == "mma.sync" else "wgmma tf32") in strategy, strategy
    assert ("transpose" in strategy) == (path == "wgmma K-major copy"), strategy
    even, away = _tf32_nearest(x)
    assert np.all(got[:, k:] == 0)
    off = (got[:, :k] != even) & (got[:, :k] != away)
    assert not off.any(), (f"{off.sum()} of {off.size} not rounded to nearest, "
                           f"e.g. {x[off][:3]} -> {got[:, :k][off][:3]}")


def test_a_gradient_at_highest_keeps_every_product_off_tf32():
    """The weight gradient of x @ w is a product transposed, which the layout pass swaps into
    B^T A^T; at "highest" the swapped product kept its precision, so no kernel takes TF32
    (weight gradients once did: the swap dropped the param)."""
    fn = glue.grad(lambda x, w: ((x @ w) ** 2).sum(), argnums=1)
    args = [np.ones((2048, 512), np.float32), np.ones((512, 1024), np.float32)]
    with glue.default_matmul_precision("highest"):
        _, low = _lower(fn, args)
    launches = _contractions(low)
    assert launches and all(launch.kernel.precision == "highest" for launch in launches)
    assert not any("tf32" in launch.strategy for launch in launches), [launch.strategy for launch in launches]
    _, low = _lower(fn, args)  # at the default precision the same gradient does take TF32
    assert any("tf32" in launch.strategy for launch in _contractions(low))


def test_only_a_recorded_precision_other_than_highest_allows_tf32():
    """A contraction kernel that records no precision is exact, as an attention equation's is:
    a pass that drops the param costs speed, never accuracy."""
    from dataclasses import replace

    fn, shapes = FORMS["NT"]
    _, low = _lower(fn, [np.ones(s, np.float32) for s in shapes(1024, 512, 1152)])
    (launch,) = _contractions(low)
    allowed = {p: replace(launch.kernel, precision=p).allows_tf32 for p in (None, "default", "high", "highest")}
    assert allowed == {None: False, "default": True, "high": True, "highest": False}
