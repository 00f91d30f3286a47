"""custom_jvp and custom_vjp (JAX's documented examples: log1pexp, clip_gradient), checkpoint
with its policies, the Jacobians, eval_shape and ShapeDtypeStruct, block_until_ready and
debug.print: eagerly, under jit (reference and cpu), grad and vmap."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import lax


def _jit(fn, backend):
    return fn if backend == "eager" else glue.jit(fn, backend=backend)


BACKENDS = ["eager", "reference", "cpu"]


# --- custom_jvp: log1pexp from JAX's documentation -------------------------------------------

@glue.custom_jvp
def log1pexp(x):
    return gnp.log(1. + gnp.exp(x))


@log1pexp.defjvp
def log1pexp_jvp(primals, tangents):
    x, = primals
    x_dot, = tangents
    ans = log1pexp(x)
    ans_dot = (1 - 1 / (1 + gnp.exp(x))) * x_dot
    return ans, ans_dot


@pytest.mark.parametrize("backend", BACKENDS)
def test_log1pexp_is_stable_under_grad_jit_and_vmap(backend):
    x = np.array([-3.0, 0.0, 2.0, 100.0], np.float32)
    grads = np.asarray(_jit(glue.vmap(glue.grad(log1pexp)), backend)(x))
    np.testing.assert_allclose(grads, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    assert float(_jit(glue.grad(log1pexp), backend)(np.float32(100.0))) == 1.0  # naive autodiff gives nan
    _, tangent = glue.jvp(log1pexp, (np.float32(0.0),), (np.float32(2.0),))
    assert float(tangent) == pytest.approx(1.0)
    np.testing.assert_allclose(np.asarray(glue.vmap(log1pexp)(x[:3])), np.log1p(np.exp(x[:3])), rtol=1e-6)


def test_custom_jvp_with_defjvps_and_nondiff_argnums():
    @glue.custom_jvp
    def f(x, y):
        return gnp.sin(x) * y

    f.defjvps(lambda x_dot, ans, x, y: gnp.cos(x) * x_dot * y, lambda y_dot, ans, x, y: gnp.sin(x) * y_dot)
    gx, gy = glue.grad(f, argnums=(0, 1))(1.0, 2.0)
    assert float(gx) == pytest.approx(2 * np.cos(1.0)) and float(gy) == pytest.approx(np.sin(1.0))

    from functools import partial

    @partial(glue.custom_jvp, nondiff_argnums=(0,))
    def app(scale, x):
        return x * scale

    @app.defjvp
    def app_jvp(scale, primals, tangents):
        (x,), (t,) = primals, tangents
        return app(scale, x), t * scale * 10  # a deliberately different derivative

    assert float(glue.grad(lambda x: app(3.0, x))(1.0)) == pytest.approx(30.0)
    assert float(glue.jit(glue.grad(lambda x: app(3.0, x)), backend="cpu")(np.float32(1.0))) == pytest.approx(30.0)


def test_a_custom_jvp_function_compiles_inline():
    optimized = glue.jit(log1pexp, backend="cpu").lower(np.ones(3, np.float32)).lowering["plan"].graph
    assert "custom_jvp_call" not in {e.primitive for e in optimized.eqns}
    assert "custom_jvp_call" in str(glue.make_ir(log1pexp)(np.ones(3, np.float32)))


# --- custom_vjp: clip_gradient from JAX's documentation --------------------------------------

@glue.custom_vjp
def clip_gradient(lo, hi, x):
    return x  # identity function


def clip_gradient_fwd(lo, hi, x):
    return x, (lo, hi)  # save bounds as residuals


def clip_gradient_bwd(res, g):
    lo, hi = res
    return (None, None, gnp.clip(g, lo, hi))  # use None to indicate zero cotangents for lo and hi


clip_gradient.defvjp(clip_gradient_fwd, clip_gradient_bwd)


@pytest.mark.parametrize("backend", BACKENDS)
@given(x=st.floats(-3, 3))
def test_clip_gradient_under_grad_jit_and_vmap(backend, x):
    def loss(x):
        return clip_gradient(-0.75, 0.75, gnp.sin(x))

    got = float(_jit(glue.grad(loss), backend)(np.float32(x)))
    assert got == pytest.approx(np.clip(1.0, -0.75, 0.75) * np.cos(x), rel=1e-5, abs=1e-6)
    xs = np.array([x, -x, 0.5], np.float32)
    batched = np.asarray(_jit(glue.vmap(glue.grad(loss)), backend)(xs))
    np.testing.assert_allclose(batched, 0.75 * np.cos(xs), rtol=1e-5, atol=1e-6)
    inner = np.asarray(glue.grad(lambda v: glue.vmap(loss)(v).sum())(xs))  # vmap inside grad
    np.testing.assert_allclose(inner, 0.75 * np.cos(xs), rtol=1e-5, atol=1e-6)


def test_custom_vjp_refuses_forward_mode_and_checks_bwd():
    with pytest.raises(glue.GlueError, match="forward mode"):
        glue.jvp(lambda x: clip_gradient(-1.0, 1.0, x), (1.0,), (1.0,))

    @glue.custom_vjp
    def f(x):
        return x * 2

    f.defvjp(lambda x: (x * 2, None), lambda res, g: g)  # not a tuple
    with pytest.raises(glue.GlueTypeError, match="bwd must return a tuple"):
        glue.grad(f)(1.0)


def test_a_custom_vjp_function_closing_over_a_traced_value():
    def outer(w, x):
        @glue.custom_vjp
        def scaled(x):
            return x * w

        scaled.defvjp(lambda x: (x * w, None), lambda res, g: (g * w,))
        return scaled(x).sum()

    got = glue.jit(glue.grad(outer, argnums=1), backend="cpu")(np.float32(3.0), np.ones(2, np.float32))
    np.testing.assert_allclose(np.asarray(got), [3.0, 3.0])
    with pytest.raises(glue.GlueError, match="closes over a value that is being differentiated"):
        glue.grad(outer, argnums=0)(3.0, np.ones(2))


# --- checkpoint -----------------------------------------------------------------------------

def _block(x, w):
    return gnp.sin(gnp.tanh(x @ w) @ w)


@pytest.mark.parametrize("policy", [None, glue.checkpoint_policies.nothing_saveable,
                                    glue.checkpoint_policies.dots_saveable,
                                    glue.checkpoint_policies.dots_with_no_batch_dims_saveable,
                                    glue.checkpoint_policies.everything_saveable])
def test_checkpoint_gives_the_same_gradients(policy):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(3, 3))

    def loss(x, w, block):
        return (block(x, w) ** 2).sum()

    want = glue.grad(loss, argnums=(0, 1))(x, w, _block)
    remat = glue.checkpoint(_block, policy=policy)
    got = glue.grad(loss, argnums=(0, 1))(x, w, remat)
    compiled = glue.jit(glue.grad(lambda x, w: loss(x, w, remat), argnums=(0, 1)), backend="cpu")(
        x.astype(np.float32), w.astype(np.float32))
    for g, c, v in zip(got, compiled, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(c), np.asarray(v), rtol=1e-4, atol=1e-5)
    assert np.asarray(glue.vmap(remat, in_axes=(0, None))(np.stack([x, x]), w)).shape == (2, 4, 3)


def test_checkpoint_recomputes_the_forward_inside_the_backward():
    x, w = np.ones((4, 3)), np.ones((3, 3))

    def backward_ir(policy):
        remat = glue.checkpoint(_block, policy=policy)
        return glue.make_ir(glue.grad(lambda x: (remat(x, w) ** 2).sum()))(x)

    def count(ir, name):
        return sum(e.primitive == name for e in ir.graph.eqns)

    plain = glue.make_ir(glue.grad(lambda x: (_block(x, w) ** 2).sum()))(x)
    nothing = backward_ir(None)
    dots = backward_ir(glue.checkpoint_policies.dots_saveable)
    assert count(nothing, "tanh") == count(plain, "tanh") + 1  # computed again, from the inputs
    assert count(nothing, "optimization_barrier") == 1  # which CSE cannot merge with the forward
    assert count(dots, "dot_general") == count(plain, "dot_general")  # the products are kept
    assert count(nothing, "dot_general") == count(plain, "dot_general") + 2
    # under jit, with nothing to differentiate, checkpoint is just the function
    optimized = glue.jit(glue.checkpoint(_block), backend="cpu").lower(x, w).lowering["plan"].graph
    assert {e.primitive for e in optimized.eqns} == {"dot_general", "tanh", "sin"}


def test_remat_of_a_scanned_layer():
    rng = np.random.default_rng(3)
    ws, x = rng.normal(size=(3, 4, 4)) * 0.5, rng.normal(size=(2, 4))

    def loss(ws, x, layer):
        return (lax.scan(lambda h, w: (layer(h, w), None), x, ws)[0] ** 2).sum()

    layer = lambda h, w: gnp.tanh(h @ w)  # noqa: E731
    want = glue.grad(loss)(ws, x, layer)
    got = glue.grad(loss)(ws, x, glue.remat(layer))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


# --- Jacobians, eval_shape, block_until_ready ------------------------------------------------

@pytest.mark.usefixtures("x64")  # compared with float64 NumPy at 1e-12
@given(seed=st.integers(0, 2**31))
def test_jacobians_and_the_hessian(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=3), rng.normal(size=(2,))

    def f(x, y):
        return {"a": gnp.sin(x) * y.sum(), "b": (x ** 2).sum() * y}

    jf = glue.jacfwd(f, argnums=(0, 1))(x, y)
    jr = glue.jacrev(f, argnums=(0, 1))(x, y)
    want_a_x = np.diag(np.cos(x) * y.sum())
    np.testing.assert_allclose(np.asarray(jf["a"][0]), want_a_x, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jr["a"][1]), np.sin(x)[:, None] * np.ones((3, 2)), rtol=1e-12)
    for out in ("a", "b"):
        for k in range(2):
            np.testing.assert_allclose(np.asarray(jf[out][k]), np.asarray(jr[out][k]), rtol=1e-10, atol=1e-12)
    h = glue.hessian(lambda x: (x ** 3).sum() + x[0] * x[1])(x)
    want = np.diag(6 * x)
    want[0, 1] = want[1, 0] = 1
    np.testing.assert_allclose(np.asarray(h), want, rtol=1e-12)
    compiled = glue.jit(glue.jacrev(lambda x: gnp.tanh(x) * x), backend="cpu")(x.astype(np.float32))
    np.testing.assert_allclose(np.asarray(compiled), np.diag(np.tanh(x) + x * (1 - np.tanh(x) ** 2)),
                               rtol=1e-5, atol=1e-6)


def test_eval_shape_and_shape_dtype_structs():
    spec = glue.ShapeDtypeStruct((4, 3), np.float32)
    out = glue.eval_shape(lambda x, n: {"y": x @ x.T, "n": n + 1}, spec, 2)
    assert out == {"y": glue.ShapeDtypeStruct((4, 4), np.float32), "n": glue.ShapeDtypeStruct((), np.int32)}
    assert spec.ndim == 2 and spec.size == 12 and repr(spec) == "ShapeDtypeStruct(shape=(4, 3), dtype=float32)"
    compiled = glue.jit(lambda x: x * 2, backend="cpu").lower(spec).compile()  # a stand-in for an argument
    np.testing.assert_array_equal(np.asarray(compiled(np.ones((4, 3), np.float32))), 2 * np.ones((4, 3)))


def test_block_until_ready_takes_pytrees():
    tree = {"a": glue.jit(lambda x: x + 1, backend="cpu")(np.ones(2, np.float32)), "b": [np.ones(1), 3]}
    assert glue.block_until_ready(tree) is tree


# --- debug.print ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_debug_print_inside_jit_scan_and_cond(backend, capsys):
    def f(xs, p):
        glue.debug.print("start {}", xs.sum())

        def step(c, x):
            glue.debug.print("c={c} x={x}", c=c, x=x)
            return c + x, None

        c, _ = lax.scan(step, 0.0, xs)
        lax.cond(p, lambda v: glue.debug.print("big {}", v), lambda v: None, c)
        return c * 2

    out = _jit(f, backend)(np.array([1.0, 2.0, 3.0], np.float32), True)
    assert float(out) == 12.0
    assert capsys.readouterr().out.splitlines() == ["start 6.0", "c=0.0 x=1.0", "c=1.0 x=2.0", "c=3.0 x=3.0",
                                                    "big 6.0"]


def test_debug_print_under_vmap_and_grad(capsys):
    def f(x):
        glue.debug.print("x {}", x)
        return x * x

    glue.vmap(f)(np.array([1.0, 2.0]))
    assert capsys.readouterr().out.splitlines() == ["x 1.0", "x 2.0"]
    assert float(glue.jit(glue.grad(f), backend="cpu")(np.float32(3.0))) == 6.0
    assert capsys.readouterr().out.splitlines() == ["x 3.0"]
    text = str(glue.make_ir(f)(np.float32(1.0)))
    assert 'debug_print[fmt="x {}" names=()]' in text
    assert glue.ir.parse(text) == glue.make_ir(f)(np.float32(1.0)).graph


def test_debug_print_needs_arrays():
    with pytest.raises(glue.GlueTypeError, match="each argument must be an array"):
        glue.debug.print("{}", {"a": 1.0})
