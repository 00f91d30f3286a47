"""The cpu backend on the fused kernels that matter (softmax, norms, losses, bias+gelu, an MLP)
against NumPy in float64, in every dtype, and the fusion decisions behind them."""
import ml_dtypes
import numpy as np
import pytest

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.frontend.tracing import bind
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch

RNG = np.random.default_rng(1234)
F32 = dt.float32


def _data(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * w + b


def _rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def _logsumexp(x):
    m = x.max(-1, keepdims=True)
    return (np.log(np.exp(x - m).sum(-1, keepdims=True)) + m)[..., 0]


def _gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


def _xent(logits, labels):
    lse = _logsumexp(logits)
    return np.mean(lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0])


def _close(got, want, dtype=F32, scale=1.0):
    problem = mismatch(np.asarray(got), np.asarray(want), dtype, scale)
    assert problem is None, problem


def _kernels(fn, *args):
    return glue.jit(fn, backend="cpu").lower(*args).compile().kernels


# Shapes with a ragged last dim (not a multiple of the vector width) and a long one.
SHAPES = [(3, 5), (7, 67), (4, 1000)]


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_is_one_reduction_kernel_and_matches_numpy(shape):
    x = _data(*shape, scale=3.0)
    _close(glue.jit(nn.softmax, backend="cpu")(x), _softmax(_f64(x)))
    kernels = _kernels(nn.softmax, x)
    assert [k.kind for k in kernels] == ["reduction"]


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_is_one_kernel(shape):
    x, w, b = _data(*shape), _data(shape[-1]), _data(shape[-1])
    fn = lambda x, w, b: nn.layer_norm(x, w, b)  # noqa: E731
    _close(glue.jit(fn, backend="cpu")(x, w, b), _layernorm(_f64(x), _f64(w), _f64(b)), scale=4.0)
    assert [k.kind for k in _kernels(fn, x, w, b)] == ["reduction"]


@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_is_one_kernel(shape):
    x, w = _data(*shape), _data(shape[-1])
    fn = lambda x, w: nn.rms_norm(x, w)  # noqa: E731
    _close(glue.jit(fn, backend="cpu")(x, w), _rmsnorm(_f64(x), _f64(w)), scale=4.0)
    assert [k.kind for k in _kernels(fn, x, w)] == ["reduction"]


def test_logsumexp_and_log_softmax():
    x = _data(6, 33, scale=4.0)
    _close(glue.jit(lambda x: nn.logsumexp(x, -1), backend="cpu")(x), _logsumexp(_f64(x)))
    _close(glue.jit(nn.log_softmax, backend="cpu")(x), np.log(_softmax(_f64(x))), scale=4.0)
    assert [k.kind for k in _kernels(nn.log_softmax, x)] == ["reduction"]


def test_cross_entropy():
    logits = _data(8, 50, scale=3.0)
    labels = RNG.integers(0, 50, 8).astype(np.int32)
    _close(glue.jit(nn.cross_entropy, backend="cpu")(logits, labels), _xent(_f64(logits), labels), scale=4.0)


def test_cross_entropy_reads_the_logits_in_one_row_kernel():
    logits, labels = _data(8, 50), RNG.integers(0, 50, 8).astype(np.int32)
    kernels = _kernels(nn.cross_entropy, logits, labels)
    assert sum(any(b.type.shape == logits.shape for b in k.kernel.inputs) for k in kernels) == 1


def test_bias_gelu_is_one_pointwise_kernel():
    x, b = _data(16, 77), _data(77)
    fn = lambda x, b: nn.gelu(x + b)  # noqa: E731
    _close(glue.jit(fn, backend="cpu")(x, b), _gelu(_f64(x) + _f64(b)), scale=2.0)
    assert [k.kind for k in _kernels(fn, x, b)] == ["pointwise"]


def _mlp(x, ws, bs):
    for w, b in zip(ws, bs):
        x = gnp.tanh(x @ w + b)
    return x


def test_mlp_layers_are_contractions_with_fused_bias_and_activation():
    x = _data(32, 64)
    ws = [_data(64, 64, scale=0.2) for _ in range(3)]
    bs = [_data(64) for _ in range(3)]
    want = _f64(x)
    for w, b in zip(ws, bs):
        want = np.tanh(want @ _f64(w) + _f64(b))
    _close(glue.jit(_mlp, backend="cpu")(x, ws, bs), want, scale=8.0)
    kernels = _kernels(_mlp, x, ws, bs)
    assert [k.kind for k in kernels] == ["contraction"] * 3
    assert all({"add", "tanh"} <= set(k.kernel.ops) for k in kernels)


def test_attention_is_three_kernels():
    q, k, v = _data(2, 8, 16), _data(2, 12, 16), _data(2, 12, 16)

    def attention(q, k, v):
        return nn.softmax(gnp.einsum("bqd,bkd->bqk", q, k) / 4.0) @ v

    s = np.einsum("bqd,bkd->bqk", _f64(q), _f64(k)) / 4.0
    _close(glue.jit(attention, backend="cpu")(q, k, v), _softmax(s) @ _f64(v), scale=4.0)
    assert [k.kind for k in _kernels(attention, q, k, v)] == ["contraction", "reduction", "contraction"]


# --- dtypes --------------------------------------------------------------------------------

LOW = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


@pytest.mark.parametrize("name", ["bf16", "f16"])
def test_16_bit_floats_compute_in_f32_and_round_on_store(name):
    x = _data(5, 40).astype(LOW[name])
    got = glue.jit(nn.softmax, backend="cpu")(x)
    assert np.asarray(got).dtype == LOW[name]
    _close(got, _softmax(_f64(x)), dt.BY_NAME[name])
    y = glue.jit(lambda x: (x * 3 + 1).astype(gnp.float32), backend="cpu")(x)
    np.testing.assert_array_equal(np.asarray(y), (x * 3 + 1).astype(LOW[name]).astype(np.float32))


def test_casts_between_every_pair_of_dtypes():
    x = np.array([[-3.75, -1.5, -0.5, 0.0, 0.25, 1.0, 2.5, 100.0]], np.float32)
    names = ["bool", "i32", "i64", "f16", "bf16", "f32", "f64"]
    for src in names:
        for dst in names:
            def cast(x, src=src, dst=dst):
                return x.astype(dt.BY_NAME[src].numpy).astype(dt.BY_NAME[dst].numpy)
            got = glue.jit(cast, backend="cpu")(x)
            want = glue.jit(cast, backend="reference")(x)
            assert np.asarray(got).dtype == np.asarray(want).dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{src} -> {dst}")


def test_integer_and_bool_programs_are_exact():
    a = RNG.integers(-50, 50, (6, 37)).astype(np.int32)
    b = RNG.integers(-5, 5, (6, 37)).astype(np.int32)

    def f(a, b):
        q = a // b + a % b
        mixed = gnp.where(a > 0, a, -b).astype(gnp.int64).max(0)
        return q.sum(-1), gnp.any(a > b, -1), gnp.argmax(a * b, -1), mixed

    got = glue.jit(f, backend="cpu")(a, b)
    want = glue.jit(f, backend="reference")(a, b)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_argmax_ties_and_nan_follow_numpy():
    x = np.array([[1, 3, 3, 2], [np.nan, 1, np.nan, 5], [-np.inf] * 4, [2, 2, 2, 2]], np.float32)
    np.testing.assert_array_equal(np.asarray(glue.jit(lambda x: gnp.argmax(x, -1), backend="cpu")(x)),
                                  np.argmax(x, -1))
    np.testing.assert_array_equal(np.asarray(glue.jit(lambda x: gnp.argmin(x, 0), backend="cpu")(x)),
                                  np.argmin(x, 0))
    got = np.asarray(glue.jit(lambda x: x.max(-1), backend="cpu")(x))
    np.testing.assert_array_equal(got, np.max(x, -1))


def test_scatter_add_accumulates_duplicates_in_order():
    table = _data(10, 3)
    idx = np.array([1, 4, 1, 1, 9, 0, 4], np.int32)
    upd = _data(7, 3)
    fn = lambda t, i, u: bind("scatter_add", t, i, u, axis=0, batch_dims=0)  # noqa: E731
    want = table.copy()
    np.add.at(want, idx, upd)
    np.testing.assert_array_equal(np.asarray(glue.jit(fn, backend="cpu")(table, idx, upd)), want)


def test_outputs_that_are_inputs_or_constants_and_empty_arrays():
    x = _data(3, 4)
    a, b, c = glue.jit(lambda x: (x, 2.0, x * 0), backend="cpu")(x)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert float(b) == 2.0
    np.testing.assert_array_equal(np.asarray(c), x * 0)
    empty = np.zeros((0, 5), np.float32)
    got = glue.jit(lambda x: (x + 1, x.sum(0), x.sum(1)), backend="cpu")(empty)
    assert [np.asarray(g).shape for g in got] == [(0, 5), (5,), (0,)]
    np.testing.assert_array_equal(np.asarray(got[1]), np.zeros(5, np.float32))


def _loop_hints(fn, x) -> set[str]:
    text = glue.jit(fn, backend="cpu").lower(x).as_text("llvm")
    return {line.split("=", 1)[1].strip() for line in text.splitlines() if "llvm.loop.vectorize.width" in line
            or "llvm.loop.interleave.count" in line}


def test_a_long_math_body_is_one_wide_vector_where_vectors_are_256_bits():
    """Two vector iterations in flight hide a math function's latency; a long body (a chain of
    20 tanh) asks instead for vectors twice as wide on a 256-bit host, one copy of the body for
    LLVM's passes, and computes the same values; a short one keeps the two iterations."""
    from glue.backend_cpu.target import host

    x = np.linspace(-3, 3, 1000, dtype=np.float32)

    def chain(v):
        for i in range(20):
            v = gnp.tanh(v * 1.01 + 0.1 * (i % 3))
        return v

    want = x.astype(np.float64)
    for i in range(20):
        want = np.tanh(want * 1.01 + 0.1 * (i % 3))
    assert mismatch(np.asarray(glue.jit(chain, backend="cpu")(x)), want, dt.float32) is None
    two_in_flight = {'!{ !"llvm.loop.interleave.count", i32 2 }'}
    wide = {'!{ !"llvm.loop.vectorize.width", i32 16 }', '!{ !"llvm.loop.interleave.count", i32 1 }'}
    assert _loop_hints(chain, x) == (wide if host().vector_bits == 256 else two_in_flight)
    assert _loop_hints(lambda v: gnp.sin(v) * gnp.cos(v), x) == two_in_flight
