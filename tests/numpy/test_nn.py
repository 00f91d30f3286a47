"""glue.nn against float64 NumPy reimplementations, eagerly and under glue.jit (reference
backend); numerical stability at extreme inputs; the one-pass structure of the row functions."""
from __future__ import annotations

import math

import numpy as np
import pytest
from gnp_checks import BF16, arrays, assert_matches, check, shapes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.nn as nn
from glue.errors import GlueTypeError

_erf = np.vectorize(math.erf)


def np_logsumexp(x, axis=None, keepdims=False):
    peak = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return out if keepdims else np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_layer_norm(x, w=None, b=None, eps=1e-5):
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def np_rms_norm(x, w=None, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1 if w is None else w)


def np_cross_entropy(logits, labels):
    logp = logits - np_logsumexp(logits, -1, keepdims=True)
    return -np.take_along_axis(logp, labels[..., None].astype(np.int64), -1).mean()


ACTIVATIONS = {
    "relu": (nn.relu, lambda x: np.maximum(x, 0)),
    "sigmoid": (nn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "silu": (nn.silu, lambda x: x / (1 + np.exp(-x))),
    "gelu_tanh": (nn.gelu, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "gelu_erf": (lambda x: nn.gelu(x, approximate=False), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    "softplus": (nn.softplus, lambda x: np.logaddexp(x, 0)),
    "log_sigmoid": (nn.log_sigmoid, lambda x: -np.logaddexp(-x, 0)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [np.float32, BF16])
@given(data=st.data())
def test_activations(name, dtype, data):
    fn, ref = ACTIVATIONS[name]
    check(fn, ref, data.draw(arrays(shapes(), dtype, -8, 8)), dtype=dtype, scale=4)


def test_gelu_defaults_to_the_tanh_form_like_jax():
    x = np.linspace(-3, 3, 13, dtype=np.float32)
    assert_matches(nn.gelu(x), ACTIVATIONS["gelu_tanh"][1](x.astype(np.float64)))
    assert np.abs(np.asarray(nn.gelu(x)) - np.asarray(nn.gelu(x, approximate=False))).max() > 1e-5


@st.composite
def rows(draw, dtype=np.float32, lo=-10, hi=10):
    x = draw(arrays(shapes(min_dims=1), dtype, lo, hi))
    return x, draw(st.integers(-x.ndim, x.ndim - 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@given(case=rows())
def test_softmax_family(dtype, case):
    x, axis = case
    x = x.astype(dtype)
    check(lambda a: nn.softmax(a, axis), lambda a: np_softmax(a, axis), x, dtype=dtype, scale=4)
    check(lambda a: nn.log_softmax(a, axis), lambda a: a - np_logsumexp(a, axis, True), x, dtype=dtype, scale=4)
    check(lambda a: nn.logsumexp(a, axis), lambda a: np_logsumexp(a, axis), x, dtype=dtype, scale=4)


@given(case=rows(), keepdims=st.booleans(), whole=st.booleans())
def test_logsumexp_axes(case, keepdims, whole):
    x, axis = case
    axes = None if whole else (axis, ) if x.ndim == 1 else (0, x.ndim - 1)
    check(lambda a: nn.logsumexp(a, axes, keepdims=keepdims), lambda a: np_logsumexp(a, axes, keepdims), x,
          dtype=np.float32)


def test_softmax_family_is_stable_at_extremes():
    x = np.array([[1e4, -1e4, 0.0], [-np.inf, 3.0, -np.inf], [88.0, 89.0, 90.0]], np.float32)
    x64 = x.astype(np.float64)
    for fn, ref in [(nn.softmax, np_softmax), (nn.log_softmax, lambda a: a - np_logsumexp(a, -1, True)),
                    (lambda a: nn.logsumexp(a, -1), lambda a: np_logsumexp(a, -1))]:
        for got in (fn(x), glue.jit(fn, backend="reference")(x)):
            assert_matches(got, ref(x64))
    ninf = np.full((2, 3), -np.inf, np.float32)
    assert np.all(np.asarray(nn.logsumexp(ninf, -1)) == -np.inf)
    assert np.isfinite(np.asarray(nn.cross_entropy(x[:1], np.array([1])))).all()


@given(data=st.data())
def test_one_hot(data):
    labels = data.draw(hnp.arrays(np.int32, shapes(max_dims=2), elements=st.integers(-2, 6)))
    c = data.draw(st.integers(1, 5))
    axis = data.draw(st.integers(-labels.ndim - 1, labels.ndim))
    ref = lambda a: np.moveaxis((a[..., None] == np.arange(c)).astype(np.float32), -1, axis)  # noqa: E731
    check(lambda a: nn.one_hot(a, c, axis=axis), ref, labels, dtype=np.float32)
    check(lambda a: nn.one_hot(a, c, dtype=BF16), lambda a: a[..., None] == np.arange(c), labels, dtype=BF16)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@given(data=st.data(), affine=st.booleans())
def test_norms(dtype, data, affine):
    x = data.draw(arrays(shapes(min_dims=1, min_side=2), dtype, -5, 5))
    d = x.shape[-1]
    w = data.draw(arrays((d,), dtype, -2, 2)) if affine else None
    b = data.draw(arrays((d,), dtype, -2, 2)) if affine else None
    # A nearly constant row amplifies input rounding; the scale follows 1 / its spread.
    spread = float(np.min(np.std(x.astype(np.float64), -1))) + 1e-3
    scale = 4 / min(1.0, spread)
    check(lambda *a: nn.layer_norm(*a), np_layer_norm, *([x] + ([w, b] if affine else [])), dtype=dtype,
          scale=scale)
    check(lambda *a: nn.rms_norm(*a), np_rms_norm, *([x] + ([w] if affine else [])), dtype=dtype, scale=4)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@given(data=st.data())
def test_cross_entropy(dtype, data):
    logits = data.draw(arrays(shapes(min_dims=2, max_dims=3), dtype, -10, 10))
    labels = data.draw(hnp.arrays(np.int32, logits.shape[:-1], elements=st.integers(0, logits.shape[-1] - 1)))
    check(nn.cross_entropy, np_cross_entropy, logits, labels, dtype=np.float32, scale=4)


def test_cross_entropy_reads_logits_in_one_row_pass():
    """Three row reductions of the logits, no gather: one row-reduction kernel can do it all."""
    ir = str(glue.make_ir(nn.cross_entropy)(np.zeros((4, 10), np.float32), np.zeros(4, np.int32)))
    assert "gather" not in ir
    assert ir.count("reduce_max[axes=(1,)]") == 1 and ir.count("reduce_sum[axes=(1,)]") == 2


def test_cross_entropy_label_errors():
    logits = np.zeros((4, 10), np.float32)
    for fn in (nn.cross_entropy, glue.jit(nn.cross_entropy, backend="reference")):
        with pytest.raises(GlueTypeError) as info:
            fn(logits, np.zeros((4, 1), np.int32))
        for part in ("cross_entropy", "f32[4,10]", "i32[4,1]", "test_nn.py"):
            assert part in str(info.value)
