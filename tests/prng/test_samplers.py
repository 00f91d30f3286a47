"""glue.random's samplers: their distributions (moments and frequencies of large draws), the
shapes and dtypes they accept and return, JAX's conventions (randint's out-of-range maxval,
bernoulli's dtype of p, categorical's axes, choice with and without replacement), typed keys,
and the errors bad arguments give."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import glue
from glue import nn, random
from glue.errors import GlueError
from glue.settings import config

BF16 = np.dtype(ml_dtypes.bfloat16)
KEY = random.PRNGKey(1234)


def traced(fn, *args):
    """fn(*args) under jit on the reference backend (no native compile per shape)."""
    return np.asarray(glue.jit(fn, backend="reference")(*args))


def sample(fn, n=20000):
    return traced(lambda k: fn(k, (n,)), KEY).astype(np.float64)


def within(value, want, sigma, n, k=5.0):
    """`value`, an estimate from n draws with standard deviation sigma, is within k standard
    errors of `want`."""
    return abs(value - want) <= k * sigma / math.sqrt(n)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_uniform_moments_and_range(dtype):
    x = traced(lambda k: random.uniform(k, (20000,), dtype, minval=-1.0, maxval=3.0), KEY)
    assert x.dtype == dtype and x.min() >= -1.0 and x.max() < 3.0
    wide = x.astype(np.float64)
    assert within(wide.mean(), 1.0, 4 / math.sqrt(12), wide.size)
    assert abs(wide.var() - 16 / 12) < 0.05


def test_uniform_bounds_broadcast_and_carry_gradients():
    lo, hi = np.array([0.0, 10.0], np.float32), np.array([1.0, 20.0], np.float32)
    x = traced(lambda k, a, b: random.uniform(k, (500, 2), minval=a, maxval=b), KEY, lo, hi)
    assert (x[:, 0] < 1).all() and (x[:, 1] >= 10).all() and (x[:, 1] < 20).all()
    grad = glue.grad(lambda a, b: random.uniform(KEY, (3,), minval=a, maxval=b).sum(), argnums=(0, 1))
    d_lo, d_hi = grad(np.float32(2.0), np.float32(5.0))
    u = (traced(lambda k: random.uniform(k, (3,)), KEY)).astype(np.float64)
    assert float(d_hi) == pytest.approx(u.sum(), rel=1e-5)
    assert float(d_lo) == pytest.approx(3 - u.sum(), rel=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_normal_moments(dtype):
    x = traced(lambda k: random.normal(k, (40000,), dtype), KEY)
    assert x.dtype == dtype
    wide = x.astype(np.float64)
    assert within(wide.mean(), 0.0, 1.0, wide.size)
    assert abs(wide.std() - 1.0) < 0.02
    assert abs(np.mean(np.abs(wide) < 1.0) - 0.6827) < 0.01


def test_normal_of_a_large_shape_fuses_into_one_kernel():
    """The whole draw (hash, uniform floats, erf_inv) is elementwise over one iota: one kernel."""
    low = glue.jit(lambda k: random.normal(k, (1024, 1024))).lower(KEY)
    kernels = [line for line in low.as_text("kernels").splitlines() if line.startswith("kernel ")]
    assert len(kernels) == 1, kernels
    assert "pointwise parallel=[1024, 1024]" in kernels[0]


def test_truncated_normal_stays_inside_its_bounds():
    x = traced(lambda k: random.truncated_normal(k, -1.0, 2.0, (20000,)), KEY)
    assert x.min() > -1.0 and x.max() < 2.0
    # mean of a normal truncated to (a, b): (phi(a) - phi(b)) / (Phi(b) - Phi(a))
    phi = lambda t: math.exp(-t * t / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda t: 0.5 * (1 + math.erf(t / math.sqrt(2)))  # noqa: E731
    want = (phi(-1.0) - phi(2.0)) / (cdf(2.0) - cdf(-1.0))
    assert abs(x.astype(np.float64).mean() - want) < 0.02
    tight = traced(lambda k: random.truncated_normal(k, 0.0, 1e-6, (100,)), KEY)
    assert (tight > 0).all() and (tight < 1e-6).all()
    infinite = traced(lambda k: random.truncated_normal(k, -np.inf, np.inf, (1000,)), KEY)
    assert np.isfinite(infinite).all()


def test_truncated_normal_shape_comes_from_the_bounds():
    lower = np.zeros((3, 1), np.float32)
    x = traced(lambda k, lo: random.truncated_normal(k, lo, np.ones(4, np.float32)), KEY, lower)
    assert x.shape == (3, 4) and (x > 0).all() and (x < 1).all()


def test_bernoulli_frequencies_and_dtypes():
    x = traced(lambda k: random.bernoulli(k, 0.3, (20000,)), KEY)
    assert x.dtype == np.bool_
    assert within(x.mean(), 0.3, math.sqrt(0.21), x.size)
    p = np.array([0.0, 1.0, 0.5], np.float32)
    y = traced(lambda k, p: random.bernoulli(k, p), KEY, p)
    assert y.shape == (3,) and not y[0] and y[1]


def test_exponential_and_gumbel_moments():
    e = sample(random.exponential)
    assert e.min() >= 0 and within(e.mean(), 1.0, 1.0, e.size)
    g = sample(random.gumbel)
    assert within(g.mean(), 0.5772156649, math.pi / math.sqrt(6), g.size)


def test_randint_range_and_frequencies():
    x = traced(lambda k: random.randint(k, (30000,), -3, 4), KEY)
    assert x.dtype == np.int32 and x.min() == -3 and x.max() == 3
    counts = np.bincount(x + 3, minlength=7) / x.size
    assert np.all(np.abs(counts - 1 / 7) < 0.015)


@pytest.mark.parametrize("dtype, lo, hi", [(np.uint8, 0, 256), (np.int8, -128, 128), (np.uint16, 5, 70000),
                                           (np.int16, -2, 3), (np.uint32, 0, 2 ** 32)])
def test_randint_reaches_the_top_of_narrow_dtypes(dtype, lo, hi):
    """A maxval past the dtype's range means its largest value can be drawn (JAX's uint8 0..256)."""
    with config.override(enable_x64=True):
        x = traced(lambda k: random.randint(k, (6000,), lo, hi, dtype), KEY)
    info = np.iinfo(dtype)
    assert x.dtype == dtype and x.min() >= max(lo, info.min) and x.max() <= min(hi - 1, info.max)
    if hi - lo <= 256:
        assert len(np.unique(x)) == min(hi, info.max + 1) - lo


def test_randint_with_an_empty_span_gives_minval():
    x = traced(lambda k: random.randint(k, (10,), np.int32(5), np.array([5, 2, 6] * 3 + [9], np.int32)), KEY)
    assert x[:-1].tolist() == [5, 5, 5] * 3 and 5 <= x[-1] < 9


def test_bits_dtypes():
    assert traced(lambda k: random.bits(k, (3,)), KEY).dtype == np.uint32
    assert traced(lambda k: random.bits(k, (3,), np.uint8), KEY).dtype == np.uint8
    with config.override(enable_x64=True):
        assert traced(lambda k: random.bits(k, (3,)), KEY).dtype == np.uint64


def test_default_dtypes_follow_x64():
    assert traced(lambda k: random.normal(k, (2,)), KEY).dtype == np.float32
    assert traced(lambda k: random.randint(k, (2,), 0, 5), KEY).dtype == np.int32
    with config.override(enable_x64=True):
        assert traced(lambda k: random.normal(k, (2,)), KEY).dtype == np.float64
        assert traced(lambda k: random.uniform(k, (2,), np.float32), KEY).dtype == np.float32


@pytest.mark.parametrize("n", [1, 7, 50])
def test_permutation_is_a_permutation(n):
    p = traced(lambda k: random.permutation(k, n), KEY)
    assert sorted(p.tolist()) == list(range(n))
    if n == 50:
        assert p.tolist() != list(range(n))


def test_permutation_of_arrays_and_independent_rows():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    rows = traced(lambda k, x: random.permutation(k, x), KEY, x)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, x.tolist()))
    cols = traced(lambda k, x: random.permutation(k, x, axis=1, independent=True), KEY, x)
    assert all(sorted(row) == sorted(orig) for row, orig in zip(cols.tolist(), x.tolist()))
    p = traced(lambda k: random.permutation(k, 30), KEY)
    # a 1-d array is shuffled by the same sort keys as the range of its length
    assert traced(lambda k, v: random.permutation(k, v), KEY, np.arange(30) * 10).tolist() == (p * 10).tolist()


def test_choice_with_and_without_replacement():
    with_replacement = traced(lambda k: random.choice(k, 5, (4000,)), KEY)
    assert set(with_replacement.tolist()) == set(range(5))
    without = traced(lambda k: random.choice(k, 10, (10,), replace=False), KEY)
    assert sorted(without.tolist()) == list(range(10))
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    picked = traced(lambda k, a: random.choice(k, a, (2, 3), axis=1), KEY, a)
    assert picked.shape == (4, 2, 3) and set(np.unique(picked[0])) <= set(a[0])


def test_choice_with_probabilities():
    p = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    x = traced(lambda k, p: random.choice(k, 4, (20000,), p=p), KEY, p)
    freq = np.bincount(x, minlength=4) / x.size
    assert freq[1] == 0 and np.all(np.abs(freq - p) < 0.015)
    without = traced(lambda k, p: random.choice(k, 4, (3,), replace=False, p=p), KEY, p)
    assert len(set(without.tolist())) == 3 and 1 not in without.tolist()


def test_categorical_frequencies_and_axes():
    logits = np.log(np.array([[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]], np.float32))
    x = traced(lambda k, lg: random.categorical(k, lg, shape=(6000, 2)), KEY, logits)
    for row in range(2):
        freq = np.bincount(x[:, row], minlength=3) / x.shape[0]
        assert np.all(np.abs(freq - np.exp(logits[row])) < 0.03)
    along_0 = traced(lambda k, lg: random.categorical(k, lg, axis=0), KEY, logits)
    assert along_0.shape == (3,) and set(along_0.tolist()) <= {0, 1}
    distinct = traced(lambda k, lg: random.categorical(k, lg, shape=(3, 2), replace=False), KEY, logits)
    assert distinct.shape == (3, 2) and all(sorted(distinct[:, r].tolist()) == [0, 1, 2] for r in range(2))


def test_dropout_keeps_the_expectation():
    x = np.ones((200, 100), np.float32)
    y = traced(lambda k, x: nn.dropout(k, 0.25, x), KEY, x)
    kept = y != 0
    assert np.allclose(y[kept], 1 / 0.75) and abs(kept.mean() - 0.75) < 0.01
    mask = traced(lambda k: random.bernoulli(k, 0.75, x.shape), KEY)
    assert (kept == mask).all()  # the idiom: the same mask
    assert traced(lambda k, x: nn.dropout(k, 0.0, x), KEY, x).tolist() == x.tolist()
    assert not traced(lambda k, x: nn.dropout(k, 1.0, x), KEY, x).any()


def test_typed_keys():
    k = random.key(0)
    assert isinstance(k, random.KeyArray) and k.shape == () and k.dtype == "key<fry>"
    assert np.asarray(random.key_data(k)).tolist() == [0, 0]
    keys = random.split(k, (2, 3))
    assert keys.shape == (2, 3) and keys[1].shape == (3,) and keys[1, 2].shape == ()
    same = random.wrap_key_data(random.key_data(keys))
    assert np.asarray(random.key_data(same)).tolist() == np.asarray(random.key_data(keys)).tolist()
    # typed and raw keys give the same numbers
    assert traced(lambda d: random.normal(random.wrap_key_data(d), (3,)), random.key_data(k)).tolist() == \
        traced(lambda r: random.normal(r, (3,)), random.PRNGKey(0)).tolist()
    first, second = random.split(k)
    assert np.asarray(random.key_data(first)).tolist() != np.asarray(random.key_data(second)).tolist()


def test_typed_keys_enter_transforms_as_their_data():
    keys = random.split(random.key(5), 4)
    got = glue.vmap(lambda k: random.uniform(k, (2,)))(keys)
    want = [np.asarray(random.uniform(k, (2,))) for k in keys]
    assert np.asarray(got).tolist() == np.asarray(want).tolist()
    raw = glue.jit(lambda k: random.split(k))(random.key(5))
    assert np.asarray(raw).tolist() == np.asarray(random.key_data(random.split(random.key(5)))).tolist()


@pytest.mark.parametrize("call, fragment", [
    (lambda: random.normal(random.split(KEY, 3)), "needs a single key"),
    (lambda: random.normal(random.split(random.key(0), 3)), "typed keys of shape (3,)"),
    (lambda: random.normal(np.zeros(2, np.int32)), "raw uint32[2] key"),
    (lambda: random.normal(KEY, 3), "shape must be a sequence"),
    (lambda: random.normal(KEY, (2,), np.int32), "must be a float dtype"),
    (lambda: random.randint(KEY, (2,), 0, 3, np.float32), "must be an integer dtype"),
    (lambda: random.bits(KEY, (2,), np.int32), "unsigned"),
    (lambda: random.uniform(KEY, (2,), minval=np.zeros(3, np.float32)), "broadcast-compatible"),
    (lambda: random.PRNGKey(1.5), "must be an integer"),
    (lambda: random.PRNGKey(2 ** 70), "64 bits"),
    (lambda: random.key(0, impl="rbg"), "threefry2x32"),
    (lambda: random.choice(KEY, 3, (5,), replace=False), "larger sample"),
    (lambda: random.choice(KEY, 3, (2,), p=np.ones(4, np.float32)), "shape of a's axis"),
    (lambda: random.wrap_key_data(np.zeros(3, np.uint32)), "last axis of 2"),
    (lambda: random.fold_in(KEY, np.zeros(2, np.int32)), "integer scalar"),
    (lambda: nn.dropout(KEY, 1.5, np.ones(2, np.float32)), "rate"),
])
def test_bad_arguments_are_glue_errors(call, fragment):
    with pytest.raises(GlueError) as info:
        call()
    assert fragment in str(info.value) and "test_samplers.py" in str(info.value)
