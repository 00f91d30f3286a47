"""Every glue.lax operation against NumPy: eagerly, under jit on the reference and cpu backends,
and its gradient against finite differences where it is differentiable."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
from glue import lax

# The NumPy references compute in float64, so the programs keep their float64 inputs wide.
pytestmark = pytest.mark.usefixtures("x64")

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 4))
Y = RNG.normal(size=(3, 4))
POS = RNG.uniform(0.5, 2.0, size=(3, 4))
UNIT = RNG.uniform(-0.9, 0.9, size=(3, 4))
_erf = np.vectorize(math.erf)


def _cumulative(fn, x, axis, reverse):
    x = np.flip(x, axis) if reverse else x
    out = fn(x, axis=axis)
    return np.flip(out, axis) if reverse else out


# name -> (function, arguments, NumPy's answer, differentiable in the float arguments)
CASES = {
    "add": (lax.add, [X, Y], X + Y, True),
    "sub": (lax.sub, [X, Y], X - Y, True),
    "mul": (lax.mul, [X, Y], X * Y, True),
    "div": (lax.div, [X, POS], X / POS, True),
    "max": (lax.max, [X, Y], np.maximum(X, Y), True),
    "min": (lax.min, [X, Y], np.minimum(X, Y), True),
    "pow": (lax.pow, [POS, Y], POS ** Y, True),
    "neg": (lax.neg, [X], -X, True),
    "abs": (lax.abs, [X], np.abs(X), True),
    "sign": (lax.sign, [X], np.sign(X), False),
    "exp": (lax.exp, [X], np.exp(X), True),
    "log": (lax.log, [POS], np.log(POS), True),
    "tanh": (lax.tanh, [X], np.tanh(X), True),
    "logistic": (lax.logistic, [X], 1 / (1 + np.exp(-X)), True),
    "sqrt": (lax.sqrt, [POS], np.sqrt(POS), True),
    "rsqrt": (lax.rsqrt, [POS], 1 / np.sqrt(POS), True),
    "square": (lax.square, [X], X * X, True),
    "erf": (lax.erf, [X], _erf(X), True),
    "erfc": (lax.erfc, [X], 1 - _erf(X), True),
    "erf_inv": (lax.erf_inv, [UNIT], None, True),  # checked through erf
    "integer_pow": (lambda x: lax.integer_pow(x, 3), [X], X ** 3, True),
    "integer_pow_negative": (lambda x: lax.integer_pow(x, -2), [POS], POS ** -2.0, True),
    "select": (lambda x, y: lax.select(x > y, x, y), [X, Y], np.where(X > Y, X, Y), True),
    "clamp": (lambda x: lax.clamp(-0.5, x, 0.5), [X], np.clip(X, -0.5, 0.5), True),
    "stop_gradient": (lambda x: lax.stop_gradient(x) * x, [X], X * X, True),
    "reduce_sum": (lambda x: lax.reduce_sum(x, (1,)), [X], X.sum(1), True),
    "reduce_max": (lambda x: lax.reduce_max(x, (0,)), [X], X.max(0), True),
    "reduce_min": (lambda x: lax.reduce_min(x, (0, 1)), [X], X.min(), True),
    "reduce_prod": (lambda x: lax.reduce_prod(x, (1,)), [X], X.prod(1), True),
    "broadcast_in_dim": (lambda x: lax.broadcast_in_dim(x[0], (2, 4), (1,)), [X], np.broadcast_to(X[0], (2, 4)),
                         True),
    "convert_element_type": (lambda x: lax.convert_element_type(x * 3, np.int32), [X], (X * 3).astype(np.int32),
                             False),
    "iota": (lambda x: lax.iota(np.int32, 5) + 0 * x.sum().astype(np.int32), [X], np.arange(5), False),
    "pad": (lambda x: lax.pad(x, 0.5, [(1, -1, 1), (0, 2, 0)]), [X], None, True),
    "concatenate": (lambda x, y: lax.concatenate([x, y], 1), [X, Y], np.concatenate([X, Y], 1), True),
    "slice": (lambda x: lax.slice(x, (0, 1), (3, 4), (2, 1)), [X], X[0:3:2, 1:4], True),
    "transpose": (lambda x: lax.transpose(x, (1, 0)), [X], X.T, True),
    "reshape": (lambda x: lax.reshape(x, (4, 3), dimensions=(1, 0)), [X], X.T.reshape(4, 3), True),
    "dot_general": (lambda x, y: lax.dot_general(x, y, (((1,), (1,)), ((), ()))), [X, Y], X @ Y.T, True),
    "dynamic_slice": (lambda x: lax.dynamic_slice(x, (1, 2), (2, 2)), [X], X[1:3, 2:4], True),
    "dynamic_slice_in_dim": (lambda x: lax.dynamic_slice_in_dim(x, 3, 2, axis=1), [X], X[:, 2:4], True),
    "dynamic_update_slice": (lambda x, y: lax.dynamic_update_slice(x, y[:2, :2], (2, 1)), [X, Y], None, True),
    "dynamic_update_slice_in_dim": (lambda x, y: lax.dynamic_update_slice_in_dim(x, y[:1], 1, axis=0), [X, Y], None,
                                    True),
    "top_k": (lambda x: lax.top_k(x, 2)[0], [X], -np.sort(-X, axis=1)[:, :2], True),
    "top_k_indices": (lambda x: lax.top_k(x, 3)[1], [X], np.argsort(-X, axis=1, kind="stable")[:, :3], False),
    "cumsum": (lambda x: lax.cumsum(x, axis=1), [X], np.cumsum(X, axis=1), True),
    "cumsum_reverse": (lambda x: lax.cumsum(x, axis=0, reverse=True), [X],
                       _cumulative(np.cumsum, X, 0, True), True),
    "cumprod": (lambda x: lax.cumprod(x, axis=1), [X], np.cumprod(X, axis=1), True),
    "cummax": (lambda x: lax.cummax(x, axis=1), [X], np.maximum.accumulate(X, axis=1), True),
    "cummin": (lambda x: lax.cummin(x, axis=0, reverse=True), [X],
               _cumulative(np.minimum.accumulate, X, 0, True), True),
}


def _expected(name, args):
    fn, _, want, _ = CASES[name]
    if want is not None:
        return want
    if name == "erf_inv":
        return None
    if name == "pad":
        out = np.full((5, 6), 0.5)  # (3, 4) with one between rows, one before and one fewer after
        spread = np.full((5, 4), 0.5)
        spread[::2] = args[0]
        out[1:, :4] = spread[:-1]
        return out
    x, y = args
    out = x.copy()
    if name == "dynamic_update_slice":  # start (2, 1) clamped to (1, 1) so the 2x2 update fits
        out[1:3, 1:3] = y[:2, :2]
    else:
        out[1:2] = y[:1]
    return out


@pytest.mark.parametrize("backend", ["eager", "reference", "cpu"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_lax_op_matches_numpy(name, backend):
    fn, args, _, _ = CASES[name]
    if backend == "cpu":
        args = [a.astype(np.float32) for a in args]
    got = np.asarray(fn(*args) if backend == "eager" else glue.jit(fn, backend=backend)(*args))
    want = _expected(name, args)
    tol = dict(rtol=1e-5, atol=1e-6) if backend == "cpu" else dict(rtol=1e-12, atol=1e-12)
    if name == "erf_inv":
        np.testing.assert_allclose(_erf(got.astype(np.float64)), args[0], **tol)
    else:
        np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[3]))
def test_lax_op_gradient_matches_finite_differences(name):
    fn, args, _, _ = CASES[name]
    weights = RNG.normal(size=np.shape(fn(*args)))

    def loss(*xs):
        return (fn(*xs) * weights).sum()

    grads = glue.grad(loss, argnums=tuple(range(len(args))))(*args)
    for k, (arg, g) in enumerate(zip(args, grads)):
        fd = np.zeros_like(arg)
        for i in np.ndindex(arg.shape):
            up = [a.copy() for a in args]
            down = [a.copy() for a in args]
            up[k][i] += 1e-6
            down[k][i] -= 1e-6
            fd[i] = (float(loss(*up)) - float(loss(*down))) / 2e-6
        if name == "stop_gradient":  # d(sg(x) x)/dx = sg(x)
            fd = args[0] * weights
        np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-6, err_msg=f"argument {k}")


@given(start=st.integers(-3, 7), size=st.integers(0, 4))
def test_dynamic_slices_clamp_traced_starts(start, size):
    x = np.arange(5.0)
    got = glue.jit(lambda x, s: lax.dynamic_slice(x, (s,), (size,)), backend="cpu")(x.astype(np.float32), np.int32(start))
    begin = min(max(start, 0), 5 - size)
    np.testing.assert_array_equal(np.asarray(got), x[begin:begin + size])
    update = np.full(size, -1.0, np.float32)
    out = glue.jit(lambda x, u, s: lax.dynamic_update_slice(x, u, (s,)), backend="reference")(
        x.astype(np.float32), update, np.int32(start))
    want = x.copy()
    want[begin:begin + size] = -1.0
    np.testing.assert_array_equal(np.asarray(out), want)


def test_lax_refuses_mixed_dtypes():
    with pytest.raises(glue.GlueTypeError, match="lax does not promote"):
        lax.add(np.ones(2, np.float32), np.ones(2, np.int32))
    assert np.asarray(lax.add(np.ones(2, np.float32), 1)).dtype == np.float32  # a Python scalar is weak
