"""Fused attention (issue #15): glue.nn.dot_product_attention against the unfused math, on the
reference, the CPU and the CUDA lowering (through the emulator); its gradients against the
unfused program's and finite differences; vmap; recognition of hand-written attention, and
the reasons it gives when it does not match; no T x S buffer in a long causal plan. The CPU
runs short attention as the plain math (`cpu_unfused_attention_bytes`): here it tiles all of it,
so that the scans are what these tests run, but for the test of that threshold itself."""
from __future__ import annotations

import math

import numpy as np
import pytest

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.ir import dtypes as dt
from glue.settings import config
from tests.backend_cuda import emulator

BIG = -0.7 * float(np.finfo(np.float32).max)


@pytest.fixture(autouse=True)
def cpu_tiles_all_attention():
    with config.override(cpu_unfused_attention_bytes=0):
        yield


def unfused(q, k, v, bias=None, mask=None, causal=False):
    """jax.nn.dot_product_attention written out with glue.numpy (B, T, N, H)."""
    group = q.shape[2] // k.shape[2]
    k, v = gnp.repeat(k, group, axis=2), gnp.repeat(v, group, axis=2)
    s = gnp.einsum("btnh,bsnh->bnts", gnp.astype(q, gnp.float32), gnp.astype(k, gnp.float32)) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + gnp.astype(bias, gnp.float32)
    keep = np.ones((1, 1, q.shape[1], k.shape[1]), bool) if mask is None else mask
    if causal:
        keep = keep & np.tril(np.ones((q.shape[1], k.shape[1]), bool))
    p = nn.softmax(gnp.where(keep, s, BIG))
    return gnp.astype(gnp.einsum("bnts,bsnh->btnh", p, gnp.astype(v, gnp.float32)), q.dtype)


def _case(rng, b, t, s, n, kv, h, dtype, bias, mask):
    shape = lambda heads, length: (b, length, heads, h)  # noqa: E731
    q, k, v = (rng.standard_normal(x).astype(np.float32) for x in (shape(n, t), shape(kv, s), shape(kv, s)))
    args = [gnp.astype(glue.numpy.asarray(x), dtype) for x in (q, k, v)]
    extra = {}
    if bias:
        extra["bias"] = gnp.astype(glue.numpy.asarray(rng.standard_normal((1, n, t, s)).astype(np.float32)), dtype)
    if mask:
        extra["mask"] = rng.random((b, 1, t, s)) > 0.3
    return [np.asarray(a) for a in args], extra


CASES = [  # b, t, s, n, kv, h, causal, bias, mask, dtype
    (2, 7, 9, 4, 2, 8, True, True, True, dt.float32),
    (1, 17, 40, 3, 3, 8, False, True, False, dt.bfloat16),
    (1, 12, 12, 2, 1, 8, True, False, True, dt.float16),
]
TOL = {dt.float32: 2e-5, dt.bfloat16: 3e-2, dt.float16: 3e-3}


def _close(got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("min_tile", [None, 8], ids=["tiles as planned", "tiles of 8 rows"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:9])) + f"-{c[9].name}")
def test_forward_and_gradients_match_the_unfused_math(case, min_tile, monkeypatch):
    """Also with tiles of 8 rows (these lengths are one tile as planned): several tiles, the
    causal diagonal inside some, the last tile partial (the plan cache is off there: it does
    not know the tile size was changed)."""
    if min_tile is not None:
        from glue.scheduler import attention

        monkeypatch.setattr(attention, "MIN_TILE", min_tile)
        monkeypatch.setattr(attention, "TILE_ELEMENTS", 1)
        monkeypatch.setattr(attention, "MAX_TILES", 1 << 20)
        with glue.config.override(cache_dir=""):
            _forward_and_gradients(case)
    else:
        _forward_and_gradients(case)


def _forward_and_gradients(case):
    b, t, s, n, kv, h, causal, bias, mask, dtype = case
    (q, k, v), extra = _case(np.random.default_rng(len(case) + t), b, t, s, n, kv, h, dtype, bias, mask)
    fused = lambda q, k, v, **e: nn.dot_product_attention(q, k, v, **e, is_causal=causal)  # noqa: E731
    plain = lambda q, k, v, **e: unfused(q, k, v, **e, causal=causal)  # noqa: E731
    want = glue.jit(plain, backend="reference")(q, k, v, **extra)
    for backend in ("reference", "cpu"):
        _close(glue.jit(fused, backend=backend)(q, k, v, **extra), want, dtype)
    loss = lambda fn: lambda q, k, v, **e: gnp.sum(gnp.sin(gnp.astype(fn(q, k, v, **e), gnp.float32)))  # noqa: E731
    argnums = (0, 1, 2)
    want = glue.jit(glue.grad(loss(plain), argnums=argnums), backend="reference")(q, k, v, **extra)
    got = glue.jit(glue.grad(loss(fused), argnums=argnums), backend="cpu")(q, k, v, **extra)
    for g, w in zip(got, want):
        _close(g, w, dtype)


def test_the_cuda_lowering_runs_on_the_emulator():
    if not emulator.available():
        pytest.skip("needs a C compiler")
    (q, k, v), extra = _case(np.random.default_rng(3), 2, 7, 9, 4, 2, 8, dt.float32, True, True)
    args = [q, k, v, extra["bias"], extra["mask"]]
    fwd = lambda q, k, v, b, m: nn.dot_product_attention(q, k, v, b, m, is_causal=True)  # noqa: E731
    grad = glue.grad(lambda *a: gnp.sum(gnp.sin(fwd(*a))), argnums=(0, 1, 2, 3))
    for fn in (fwd, grad):
        got = emulator.run_program(glue.jit(fn, backend="cuda").lower(*args).lowering["llvm"], args)
        want = glue.tree_flatten(glue.jit(fn, backend="reference")(*args))[0]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-5)


def test_bias_gradient_and_finite_differences():
    rng = np.random.default_rng(5)
    (q, k, v), extra = _case(rng, 1, 4, 5, 2, 1, 4, dt.float64 if glue.config.jax_enable_x64 else dt.float32,
                             True, False)
    bias = np.asarray(extra["bias"])
    f = lambda q, k, v, bias: gnp.sum(gnp.sin(nn.dot_product_attention(q, k, v, bias, is_causal=True)))  # noqa: E731
    grads = glue.jit(glue.grad(f, argnums=(0, 1, 2, 3)), backend="cpu")(q, k, v, bias)
    args, eps = [q, k, v, bias], 1e-2
    for i, g in enumerate(grads):
        direction = rng.standard_normal(args[i].shape).astype(np.float32)
        up = [a + eps * direction if j == i else a for j, a in enumerate(args)]
        down = [a - eps * direction if j == i else a for j, a in enumerate(args)]
        reference = glue.jit(f, backend="reference")
        numeric = (float(reference(*up)) - float(reference(*down))) / (2 * eps)
        assert abs(float(np.sum(np.asarray(g) * direction)) - numeric) < 2e-3 * max(1.0, abs(numeric))


def test_jvp_and_vmap():
    (q, k, v), extra = _case(np.random.default_rng(6), 2, 6, 6, 2, 2, 4, dt.float32, False, True)
    mask = extra["mask"]
    fused = lambda q, k, v: nn.dot_product_attention(q, k, v, mask=mask)  # noqa: E731
    plain = lambda q, k, v: unfused(q, k, v, mask=mask)  # noqa: E731
    tangents = tuple(np.ones_like(x) * 0.1 for x in (q, k, v))
    _close(glue.jvp(fused, (q, k, v), tangents)[1], glue.jvp(plain, (q, k, v), tangents)[1], dt.float32)
    qs = np.stack([q, 2 * q])
    got = glue.jit(glue.vmap(lambda q: fused(q, k, v)), backend="cpu")(qs)
    _close(got, np.stack([np.asarray(glue.jit(plain, backend="reference")(x, k, v)) for x in qs]), dt.float32)


def test_bad_operands_name_the_op_and_shapes():
    q = np.ones((1, 4, 3, 8), np.float32)
    with pytest.raises(glue.GlueError, match=r"attention.*3 key/value heads|3 query heads.*2"):
        glue.jit(nn.dot_product_attention)(q, np.ones((1, 4, 2, 8), np.float32), np.ones((1, 4, 2, 8), np.float32))
    with pytest.raises(glue.GlueError, match="dot_product_attention"):
        nn.dot_product_attention(q[0, 0], q[0, 0], q[0, 0])


# --- recognition -----------------------------------------------------------------------------

D = 8


def causal_bhtd(q, k, v):
    s = q @ k.swapaxes(-1, -2) * (1 / math.sqrt(D))
    t = q.shape[-2]
    return nn.softmax(gnp.where(gnp.tril(gnp.ones((t, t), bool)), s, -1e9)) @ v


def lse_bthd(q, k, v):
    s = gnp.einsum("bthd,bshd->bhts", q * (1 / math.sqrt(D)), k)
    p = gnp.exp(s - nn.logsumexp(s, axis=-1, keepdims=True))
    return gnp.einsum("bhts,bshd->bthd", p, v)


def biased_triu_inf(q, k, v, bias):
    s = q @ k.swapaxes(-1, -2) / math.sqrt(D) + bias
    t = q.shape[-2]
    masked = gnp.where(gnp.triu(gnp.ones((t, t), bool), 1), -gnp.inf, s)
    e = gnp.exp(masked - gnp.max(masked, -1, keepdims=True))
    return (e / gnp.sum(e, -1, keepdims=True)) @ v


def masked_bhtd(q, k, v, m):
    return nn.softmax(gnp.where(m, q @ k.swapaxes(-1, -2), -1e9)) @ v


def _fusion(fn, *args):
    return glue.jit(fn).lower(*args).as_text("fusion")


@pytest.mark.parametrize("fn,note", [(causal_bhtd, "causal"), (lse_bthd, "no mask"), (masked_bhtd, "masked")])
def test_hand_written_attention_is_recognised(fn, note):
    rng = np.random.default_rng(7)
    x = [rng.standard_normal((2, 3, 16, D)).astype(np.float32) for _ in range(3)]
    extra = [rng.random((2, 3, 16, 16)) > 0.2] if fn is masked_bhtd else []
    text = _fusion(fn, *x, *extra)
    assert "attention recognised" in text and note in text, text
    assert "dot_general" not in text.split("recognised:")[0].split("scan[")[0]
    np.testing.assert_allclose(np.asarray(glue.jit(fn)(*x, *extra)),
                               np.asarray(glue.jit(fn, backend="reference")(*x, *extra)), rtol=1e-5, atol=1e-5)


def test_a_where_with_triu_and_minus_inf_reads_as_causal_with_a_bias():
    rng = np.random.default_rng(8)
    x = [rng.standard_normal((1, 2, 12, D)).astype(np.float32) for _ in range(3)]
    bias = rng.standard_normal((12, 12)).astype(np.float32)
    text = _fusion(biased_triu_inf, *x, bias)
    assert "attention recognised" in text and "causal, bias" in text, text
    np.testing.assert_allclose(np.asarray(glue.jit(biased_triu_inf)(*x, bias)),
                               np.asarray(glue.jit(biased_triu_inf, backend="reference")(*x, bias)), rtol=1e-5,
                               atol=1e-5)


def test_scores_used_elsewhere_are_not_rewritten_and_say_why():
    x = np.ones((1, 2, 8, D), np.float32)

    def returns_scores(q, k, v):
        s = q @ k.swapaxes(-1, -2)
        return nn.softmax(s) @ v, s

    def reuses_probabilities(q, k, v):
        p = nn.softmax(q @ k.swapaxes(-1, -2))
        return p @ v + gnp.sum(p)

    assert "the scores are an output of the program" in _fusion(returns_scores, x, x, x)
    assert "is also used by" in _fusion(reuses_probabilities, x, x, x)


@pytest.mark.parametrize("b,n,t,want", [(8, 4, 128, 64), (8, 12, 512, 128), (8, 12, 8192, 256), (1, 1, 512, 256),
                                         (1, 1, 4096, 256), (64, 16, 100, 64)])
def test_tiles_fit_their_scores_in_a_budget_but_are_few_and_not_small(b, n, t, want):
    """The small step's T=128 two tiles of 64 rows; GPT-2 width's T=512 four of 128, not the
    eight of 64 its scores' budget alone would cut (the scans' steps grow with their square);
    a long sequence tiles of MAX_TILE rows; one head's scores fit the budget in tiles of 512,
    capped at MAX_TILE."""
    from glue.ir import dtypes as dt
    from glue.scheduler.attention import Spec, forward_tiles

    spec = Spec(b, n, t, 64, n, t, 64, 0.125, True, "bthd", -1e30, False, False, dt.float32, "highest")
    assert forward_tiles(spec) == (min(want, -(-t // 8) * 8), min(want, -(-t // 8) * 8))


def test_long_causal_attention_plans_no_t_by_t_buffer():
    t, b, n, h = 4096, 1, 2, 32
    q = np.zeros((b, n, t, h), np.float32)
    for backend in ("cpu", "cuda"):
        for fn in (causal_bhtd, lambda q, k, v: nn.dot_product_attention(q, k, v, is_causal=True)):
            plan = glue.jit(fn, backend=backend).lower(q, q, q).lowering["plan"]
            biggest = max(p.type.size for p in plan.memory.placements.values())
            assert biggest < t * t // 8, (backend, biggest)


@pytest.mark.parametrize("bias_shape,causal", [((1, 1, 300, 1), True), ((1, 2, 300, 290), False)])
def test_several_tiles_and_every_bias_broadcast(bias_shape, causal):
    """Query and key tiles of 256 (two of each, the last partial), with the bias's gradient
    summed over whatever it broadcasts along."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 300, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 290, 1, 8)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    loss = lambda fn: lambda *a: gnp.sum(gnp.sin(fn(*a)))  # noqa: E731
    fused = lambda q, k, v, b: nn.dot_product_attention(q, k, v, b, is_causal=causal)  # noqa: E731
    plain = lambda q, k, v, b: unfused(q, k, v, b, causal=causal)  # noqa: E731
    grad = glue.jit(glue.grad(loss(fused), argnums=(0, 1, 2, 3)), backend="cpu")
    assert "tiled 256 x 256" in grad.lower(q, k, v, bias).as_text("fusion")
    want = glue.jit(glue.grad(loss(plain), argnums=(0, 1, 2, 3)), backend="reference")(q, k, v, bias)
    for g, w in zip(grad(q, k, v, bias), want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)


def test_the_cpu_runs_attention_with_scores_up_to_its_threshold_as_the_plain_math():
    """Scores of 2 x 3 x 16 x 16 float32 (6 KiB): the plain math at the default threshold, the
    tiled scans under a smaller one; either way the results of the reference."""
    rng = np.random.default_rng(10)
    x = [rng.standard_normal((2, 3, 16, D)).astype(np.float32) for _ in range(3)]
    want = np.asarray(glue.jit(causal_bhtd, backend="reference")(*x))
    for threshold, how in ((6 << 10, "unfused: its 16 x 16 scores in memory"), ((6 << 10) - 1, "scan[")):
        with config.override(cpu_unfused_attention_bytes=threshold):
            fn = glue.jit(causal_bhtd, backend="cpu")
            assert how in fn.lower(*x).as_text("fusion")
            np.testing.assert_allclose(np.asarray(fn(*x)), want, rtol=1e-5, atol=1e-5)


def _training_loss(dtype):
    """A GPT block's attention as a training step writes it: (B, N, T, H) scores in float32,
    the causal `where`, glue.nn.softmax (whose row max is a stop_gradient), back to `dtype`."""
    def loss(q, k, v, w):
        t = q.shape[2]
        s = (q @ gnp.swapaxes(k, -1, -2)).astype(gnp.float32) * (1.0 / math.sqrt(q.shape[-1]))
        s = gnp.where(gnp.tril(gnp.ones((t, t), dtype=bool)), s, -1e9)
        o = nn.softmax(s, axis=-1).astype(dtype) @ v
        return (o.astype(gnp.float32) * w).sum()
    return loss


@pytest.mark.parametrize("dtype", [dt.bfloat16, dt.float32])
def test_grad_recognises_attention_before_differentiating(dtype):
    """The gradient program holds attention and attention_bwd (never P), at the precision of
    the products as written, and gives the reference's gradients."""
    rng = np.random.default_rng(11)
    q, k, v = (np.asarray(gnp.astype(gnp.asarray(rng.standard_normal((2, 2, 24, 16)).astype(np.float32)), dtype))
               for _ in range(3))
    w = rng.standard_normal((2, 2, 24, 16)).astype(np.float32)
    grad = glue.grad(_training_loss(dtype), argnums=(0, 1, 2))
    text = str(glue.make_ir(grad)(q, k, v, w))
    assert "attention_bwd" in text and "precision=default" in text, text[:2000]
    got = glue.jit(grad, backend="cpu")(q, k, v, w)
    with glue.config.override(recognize_attention=False):
        want = glue.jit(grad, backend="reference")(q, k, v, w)
    for g, x in zip(got, want):
        _close(g, x, dtype)


@pytest.mark.parametrize("layers", [1, 3])
def test_expansions_simplified_once_leave_what_the_whole_program_simplified_would(layers):
    """Each distinct attention's expansion is simplified on its own and the program gets one
    more round of the passes (not a fixed point over the whole program again): the graph is
    then the one the whole-program fixed point gives, and is itself a fixed point."""
    from glue.scheduler.attention import expand_attention, tile_attention
    from glue.scheduler.passes import optimize

    def stacked(x, w):
        for _ in range(layers):
            x = x + nn.dot_product_attention(x, x, x, is_causal=True) @ w
        return (x * x).sum()

    x = np.random.default_rng(3).standard_normal((2, 16, 2, 8)).astype(np.float32)
    w = np.eye(8, dtype=np.float32)
    graph = glue.grad(stacked, argnums=(0, 1))
    passed = optimize(glue.make_ir(graph)(x, w).graph)
    tiled = tile_attention(passed).graph
    whole, _ = expand_attention(passed)
    assert str(optimize(tiled)) == str(tiled)
    assert str(optimize(whole)) == str(tiled)
