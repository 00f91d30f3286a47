"""The flash attention kernels (glue/backend_cuda/codegen/flash.py): which attention equations
take them, their results and gradients against the reference on the CPU emulator (ldmatrix,
mma.sync and cp.async lane by lane) over random lengths, head sizes, grouped-query heads,
layouts, 16-bit types, float32 on TF32 and the causal rule, with poisoned outputs; ptxas checks for sm_80 and
sm_90; the plan of a long attention holds no T x S buffer; on a GPU, the same against the
reference, and a training step's attention found where it is written out by hand."""
import math
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
from glue.backend_cuda.ptx import assemble, ptxas_available
from glue.reference import run_graph
from glue.reference.compare import mismatch, tolerance_dtypes
from glue.ir import dtypes as dt
from tests.backend_cuda import emulator

BF16 = ml_dtypes.bfloat16
needs_cc = pytest.mark.skipif(not emulator.available(), reason="the emulator needs a C compiler")


def _attention(causal: bool, layout: str):
    """Attention as a user writes it: glue.nn's (B, T, N, H), or by hand over (B, N, T, H)."""
    if layout == "BTNH":
        return lambda q, k, v: nn.dot_product_attention(q, k, v, is_causal=causal)

    def by_hand(q, k, v):
        t, s = q.shape[2], k.shape[2]
        scores = (q @ k.swapaxes(-1, -2)).astype(gnp.float32) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            scores = gnp.where(gnp.tril(gnp.ones((t, s), dtype=bool)), scores, -1e9)
        return nn.softmax(scores, axis=-1).astype(q.dtype) @ v
    return by_hand


def _program(causal, layout, backward, w):
    forward = _attention(causal, layout)
    if not backward:
        return forward
    return glue.grad(lambda q, k, v: (forward(q, k, v).astype(gnp.float32) * w).sum(), argnums=(0, 1, 2))


def _operands(rng, b, n, kv, t, s, h, layout, dtype):
    shape = (lambda heads, length: (b, length, heads, h)) if layout == "BTNH" else \
        (lambda heads, length: (b, heads, length, h))
    return [rng.standard_normal(shape(heads, length)).astype(dtype)
            for heads, length in ((n, t), (kv, s), (kv, s))]


def _lower(fn, args):
    closed = glue.make_ir(fn)(*args)
    return closed, CudaBackend().lower(closed.graph, name="flash", arch="sm_90", gemm="codegen")


def _flash(low) -> list[str]:
    return [launch.strategy for launch in low["llvm"].launches if launch.kind == "attention"]


def _check(closed, args, outs, label):
    want = run_graph(closed.graph, args, float64=True)
    # float32 at the default precision: TF32 products, whose tolerance is bfloat16's
    dtypes = tolerance_dtypes(closed.graph, tf32=True)
    for i, (got, w) in enumerate(zip(outs, want)):
        # P and dS round to the 16-bit type before their products, as FlashAttention's do: a
        # gradient sums hundreds of such products, and is off by about an ulp of its largest
        # element (float16's tolerance allows 0.8 of one at a scale of 8, bfloat16's 1.0)
        scale = 4.0 if i == 0 and len(outs) == 1 else 16.0 if dtypes[i] == dt.float16 else 8.0
        problem = mismatch(got, w, dtypes[i], scale=scale)
        assert problem is None, f"{label}, output {i}: {problem}"


@needs_cc
@settings(deadline=None, max_examples=6)
# (s >= 2: with one key the softmax is 1 and folds away before attention is recognised)
@given(t=st.integers(1, 140), s=st.integers(2, 140), h=st.sampled_from([16, 32, 64]), grouped=st.booleans(),
       causal=st.booleans(), layout=st.sampled_from(["BTNH", "BNTH"]), backward=st.booleans(),
       dtype=st.sampled_from([BF16, np.float16, np.float32]), seed=st.integers(0, 2**31))
def test_emulated_flash_kernels_compute_the_reference(t, s, h, grouped, causal, layout, backward, dtype, seed):
    if layout == "BNTH" and grouped:
        grouped = False  # by hand, the heads of q, k and v are one count
    rng = np.random.default_rng(seed)
    n, kv = 2, 1 if grouped else 2
    args = _operands(rng, 1, n, kv, t, s, h, layout, dtype)
    w = rng.standard_normal(args[0].shape).astype(np.float32)
    closed, low = _lower(_program(causal, layout, backward, w), args)
    parts = _flash(low)
    assert parts and all(p.startswith("flash") for p in parts), parts
    assert len(parts) == (3 if backward else 1)
    all_args = [np.asarray(c) for c in closed.consts] + args
    _check(closed, all_args, emulator.run_program(low["llvm"], all_args, poison=0xFF),
           f"t={t} s={s} h={h} kv={kv} causal={causal} {layout} backward={backward}")


@needs_cc
def test_emulated_adversarial_logits_stay_finite_and_exact():
    """Large logits (the online softmax's running max moves a long way between tiles) and a
    causal first row that sees one key."""
    rng = np.random.default_rng(1)
    q, k, v = _operands(rng, 1, 2, 2, 130, 130, 32, "BTNH", BF16)
    k[:, 70:] *= 8.0
    closed, low = _lower(_program(True, "BTNH", False, None), [q, k, v])
    out = emulator.run_program(low["llvm"], [q, k, v], poison=0xFF)
    assert np.isfinite(np.asarray(out[0], np.float32)).all()
    _check(closed, [q, k, v], out, "adversarial")


def test_what_takes_the_flash_kernels_and_what_stays_tiled():
    rng = np.random.default_rng(2)
    q, k, v = _operands(rng, 1, 2, 2, 64, 64, 64, "BTNH", BF16)
    assert _flash(_lower(_attention(True, "BTNH"), [q, k, v])[1]) == ["flash forward bf16 64x64 h64 causal"]
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    assert _flash(_lower(_attention(True, "BTNH"), f32)[1]) == ["flash forward tf32 64x64 h64 causal"]
    with glue.default_matmul_precision("highest"):  # exact products: the unfused math
        low = _lower(_attention(True, "BTNH"), f32)[1]
    assert _flash(low) == [] and 'precision "highest" needs exact products' in low.as_text("fusion")
    odd = _operands(rng, 1, 2, 2, 64, 64, 40, "BTNH", BF16)
    assert _flash(_lower(_attention(False, "BTNH"), odd)[1]) == []  # head size 40
    bias = rng.standard_normal((1, 2, 64, 64)).astype(BF16)
    biased = _lower(lambda q, k, v, bias: nn.dot_product_attention(q, k, v, bias), [q, k, v, bias])
    assert _flash(biased[1]) == []
    text = _lower(_attention(True, "BTNH"), [q, k, v])[1].as_text("fusion")
    assert "runs as one flash kernel" in text


def test_a_long_attention_and_its_gradient_hold_no_t_by_t_buffer():
    t = 4096
    q, k, v = (np.zeros((1, t, 2, 64), BF16) for _ in range(3))
    w = np.zeros((1, t, 2, 64), np.float32)
    for backward in (False, True):
        closed, low = _lower(_program(True, "BTNH", backward, w), [q, k, v])
        plan = low["plan"]
        largest = max(b.type.size for kernel in plan.kernels for b in kernel.inputs + kernel.outputs)
        assert largest < t * t, largest
        assert len(_flash(low)) == (3 if backward else 1)


@pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_flash_kernels_assemble_without_spills(arch, h, dtype):
    rng = np.random.default_rng(3)
    q, k, v = _operands(rng, 1, 2, 2, 128, 128, h, "BTNH", dtype)
    w = np.zeros(q.shape, np.float32)
    closed = glue.make_ir(_program(True, "BTNH", True, w))(q, k, v)
    low = CudaBackend().lower(closed.graph, name="flash", arch=arch, gemm="codegen")
    flash = [text for symbol, text in low["ptx"].modules.items() if low["llvm"].kernels[symbol].recipe.part]
    if dtype == np.float32 and arch == "sm_80" and h == 128:  # 6 float32 tiles of 136-word rows
        assert flash == [] and "bytes of shared memory, more than sm_80's" in low.as_text("fusion")
        return
    shape, fragments = ("m16n8k8", "cvt.rna.tf32.f32") if dtype == np.float32 else ("m16n8k16", "ldmatrix")
    assert len(flash) == 3 and all(f"mma.sync.aligned.{shape}" in text and fragments in text for text in flash)
    for text in flash:
        report = assemble(text, arch)
        if h == 64:
            assert "0 bytes spill stores" in report, report


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 1, 1, 64), (2, 100, 100, 64), (1, 257, 130, 32), (2, 512, 512, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_on_the_gpu_flash_kernels_compute_the_reference(shape, causal, backward, dtype):
    b, t, s, h = shape
    rng = np.random.default_rng(7)
    args = _operands(rng, b, 4, 2, t, s, h, "BTNH", dtype)
    w = rng.standard_normal(args[0].shape).astype(np.float32)
    closed = glue.make_ir(_program(causal, "BTNH", backward, w))(*args)
    with glue.config.override(cuda_poison=0xFF):
        low = CudaBackend().lower(closed.graph, name="flash", gemm="codegen")
        assert len(_flash(low)) == (3 if backward else 1)
        _runs_the_reference(closed, args, low, f"{shape} causal={causal} backward={backward}")


def _runs_the_reference(closed, args, low, label):
    """On the GPU, the lowered program's results against the reference, and a second call's
    bit for bit against the first (outputs poisoned by the caller's settings)."""
    exe = low.compile()
    all_args = [np.asarray(c) for c in closed.consts] + args
    outs = [np.asarray(o) for o in exe(*all_args)]
    again = [np.asarray(o) for o in exe(*all_args)]
    _check(closed, all_args, outs, label)
    for x, y in zip(outs, again):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


# --- the flash kernels on warpgroup tensor cores (flash_hopper.py, sm_90a) ---------------------

def _hopper_lower(fn, args, **settings):
    """The program lowered for sm_90a (its stages built under `settings`)."""
    closed = glue.make_ir(fn)(*args)
    with glue.config.override(**settings):
        low = CudaBackend().lower(closed.graph, name="flash", arch="sm_90a", gemm="codegen")
        low["ptx"]
    return closed, low


def test_the_sm90a_flash_kernels_take_warpgroups_where_they_serve():
    rng = np.random.default_rng(4)
    for h, dtype, name in ((64, BF16, "bf16"), (128, np.float16, "f16")):
        args = _operands(rng, 1, 2, 2, 200, 200, h, "BTNH", dtype)
        assert _flash(_hopper_lower(_attention(True, "BTNH"), args)[1]) == \
            [f"flash forward {name} wgmma 128x128 h{h} tma {4 if h == 64 else 3} stages warp-specialized "
             "2+1 warpgroups causal"]
    args = _operands(rng, 1, 2, 2, 200, 200, 64, "BTNH", BF16)
    assert _flash(_hopper_lower(_attention(False, "BTNH"), args, cuda_wgmma=False)[1]) == \
        ["flash forward bf16 64x64 h64"]
    # head 32, float32 (TF32) and the backward stay on mma.sync
    assert _flash(_hopper_lower(_attention(False, "BTNH"), _operands(rng, 1, 2, 2, 64, 64, 32, "BTNH", BF16))[1]) \
        == ["flash forward bf16 64x64 h32"]
    f32 = [x.astype(np.float32) for x in args]
    assert _flash(_hopper_lower(_attention(False, "BTNH"), f32)[1]) == ["flash forward tf32 64x64 h64"]
    w = np.zeros(args[0].shape, np.float32)
    parts = _flash(_hopper_lower(_program(False, "BTNH", True, w), args)[1])
    assert parts == ["flash forward bf16 wgmma 128x128 h64 tma 4 stages warp-specialized 2+1 warpgroups",
                     "flash dq bf16 wgmma 128x64 h64 tma 4 stages warp-specialized 2+1 warpgroups",
                     "flash dkv bf16 wgmma 128x64 h64 tma 4 stages warp-specialized 2+1 warpgroups"]


@pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["BTNH", "BNTH"])
def test_the_sm90a_kernels_assemble_without_spills_or_serialised_wgmma(h, causal, layout):
    rng = np.random.default_rng(5)
    args = _operands(rng, 1, 2, 2, 1000, 1000, h, layout, BF16)  # (a loop of key tiles, the last one ragged)
    _, low = _hopper_lower(_program(causal, layout, True, np.zeros(args[0].shape, np.float32)), args)
    launches = [launch for launch in low["llvm"].launches if "wgmma" in launch.strategy]
    assert [launch.strategy.split()[1] for launch in launches] == ["forward", "dq", "dkv"]
    for launch in launches:
        text = low["ptx"].modules[launch.symbol]
        assert "wgmma.mma_async" in text and "cp.async.bulk.tensor" in text
        report = assemble(text, "sm_90a")
        # every thread starts with 168 registers and the consumers take 240 (`setmaxnreg` applied)
        assert "Used 168 registers" in report and "ignored" not in report and "serialized" not in report, report
        spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
        # (dK, dV, S^T, dP^T and the queries' lse and delta of a head of 128 take more than 240
        # where a causal step masks: a few registers, reloaded once a step)
        assert spilled <= (48 if "dkv" in launch.strategy and h == 128 and causal else 0), report


@pytest.mark.skipif(not ptxas_available(), reason="needs ptxas")
@pytest.mark.parametrize("t", [1, 64, 300])
@pytest.mark.parametrize("h", [64, 128])
def test_warpgroup_kernels_start_with_the_registers_their_consumers_take(t, h):
    """A warpgroup's `setmaxnreg.inc` takes registers from the block's pool, which the launch
    sizes by the kernel's count at entry: a tiny program whose code needs few (ptxas gave such
    a dkv kernel 156) asked for more than 384 threads of them hold and trapped on the GPU."""
    rng = np.random.default_rng(6)
    args = _operands(rng, 1, 4, 2, t, t, h, "BTNH", BF16)
    _, low = _hopper_lower(_program(True, "BTNH", True, np.zeros(args[0].shape, np.float32)), args)
    launches = [launch for launch in low["llvm"].launches if "wgmma" in launch.strategy]
    assert len(launches) == 3
    for launch in launches:
        text = low["ptx"].modules[launch.symbol]
        assert ".maxnreg 168" in text and "setmaxnreg.inc.sync.aligned.u32 240;" in text, launch.strategy
        assert "Used 168 registers" in assemble(text, "sm_90a"), launch.strategy


@pytest.mark.cuda
@pytest.mark.parametrize("b,n,kv,t,s,h,layout,dtype,causal", [
    (1, 2, 2, 1, 1, 64, "BTNH", BF16, False),
    (2, 4, 2, 300, 300, 64, "BTNH", BF16, True),
    (1, 4, 1, 1000, 700, 128, "BTNH", BF16, False),
    (1, 4, 1, 700, 1000, 128, "BTNH", np.float16, True),
    (1, 2, 2, 192, 192, 64, "BNTH", BF16, True),
    (1, 2, 2, 129, 257, 128, "BNTH", np.float16, False),
    (2, 4, 4, 2048, 2048, 128, "BTNH", BF16, True),
    (1, 3, 3, 128, 384, 64, "BTNH", BF16, False),
    (1, 4, 2, 65, 65, 64, "BTNH", BF16, False),  # (lse rows not 16-byte aligned: T % 4 != 0)
    (1, 2, 2, 129, 257, 128, "BNTH", BF16, True),
])
@pytest.mark.parametrize("backward", [False, True])
def test_on_the_gpu_the_sm90a_kernels_compute_the_reference(b, n, kv, t, s, h, layout, dtype, causal, backward):
    rng = np.random.default_rng(8)
    args = _operands(rng, b, n, kv, t, s, h, layout, dtype)
    args[1][..., :1, :] *= 6.0  # a few large logits: the running max moves between tiles
    w = rng.standard_normal(args[0].shape).astype(np.float32)
    closed = glue.make_ir(_program(causal, layout, backward, w))(*args)
    with glue.config.override(cuda_poison=0xFF):
        low = CudaBackend().lower(closed.graph, name="flash", gemm="codegen")
        on_warpgroups = ["forward", "dq", "dkv"] if backward else ["forward"]
        assert [p.split()[1] for p in _flash(low) if "wgmma" in p] == on_warpgroups
        _runs_the_reference(closed, args, low, f"{(b, n, kv, t, s, h)} {layout} causal={causal} backward={backward}")


@pytest.mark.cuda
@pytest.mark.parametrize("backward", [False, True], ids=["output", "dv"])
def test_on_the_gpu_tf32_flash_rounds_what_it_loads_to_nearest(backward):
    """Float32 attention on TF32: the kernels round q, k, v and dO to nearest as they load them.
    Fed as they lie, the tensor cores drop their low 13 bits, which shrinks every product toward
    zero: with v and dO in [1, 2] the output and dV came out about 3e-4 low on average (the
    bias moved a 10-step training loss by 1e-3). Rounded, the mean error is near zero."""
    rng = np.random.default_rng(11)
    q, k = ((rng.standard_normal((2, 256, 4, 64)) * 0.5).astype(np.float32) for _ in range(2))
    v = rng.uniform(1, 2, q.shape).astype(np.float32)
    w = rng.uniform(1, 2, q.shape).astype(np.float32)
    closed = glue.make_ir(_program(False, "BTNH", backward, w))(q, k, v)
    low = CudaBackend().lower(closed.graph, name="flash", gemm="codegen")
    assert all("tf32" in strategy for strategy in _flash(low)) and _flash(low)
    args = [np.asarray(c) for c in closed.consts] + [q, k, v]
    got = np.asarray(low.compile()(*args)[-1], np.float64)  # the output, or dV
    want = run_graph(closed.graph, args, float64=True)[-1]
    bias = float(np.mean((got - want) / np.abs(want)))
    assert abs(bias) < 3e-5, f"mean relative error {bias:.2e}"
