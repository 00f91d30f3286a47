"""grad, value_and_grad, vjp, jvp, vmap and stop_gradient through the public API: JAX's
signatures and pytrees, composition with jit and with each other, the programs they produce,
a small training run, and the errors users get."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
from glue.errors import GlueError, GlueTypeError
from glue.frontend.transforms import TransformError

# Derivatives are checked in float64.
pytestmark = pytest.mark.usefixtures("x64")

HERE = "test_transforms.py"


def ref_jit(fn, **kwargs):
    return glue.jit(fn, backend="reference", **kwargs)


def f_scalar(x):
    return gnp.sum(gnp.sin(x) * x)


def df_scalar(x):
    return np.cos(x) * x + np.sin(x)


def d2f_scalar(x):  # the diagonal of f_scalar's Hessian
    return -np.sin(x) * x + 2 * np.cos(x)


vectors = hnp.arrays(np.float64, st.integers(1, 4), elements=st.floats(-2, 2))


# --- composition ----------------------------------------------------------------------------

@given(x=vectors)
def test_grad_composes_with_jit_both_ways(x):
    for g in (glue.grad(f_scalar), ref_jit(glue.grad(f_scalar)), glue.grad(ref_jit(f_scalar))):
        np.testing.assert_allclose(np.asarray(g(x)), df_scalar(x), rtol=1e-12)


@given(x=st.floats(-2, 2))
def test_grad_of_grad_of_a_scalar_function(x):
    f = lambda v: gnp.sin(v) * v  # noqa: E731
    x = np.float64(x)
    assert float(glue.grad(glue.grad(f))(x)) == pytest.approx(d2f_scalar(x), rel=1e-9, abs=1e-12)
    assert float(ref_jit(glue.grad(glue.grad(glue.grad(f))))(x)) == \
        pytest.approx(-np.cos(x) * x - 3 * np.sin(x), rel=1e-9, abs=1e-12)


@given(xs=hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4)), elements=st.floats(-2, 2)))
def test_vmap_of_grad_and_jvp_of_grad(xs):
    np.testing.assert_allclose(np.asarray(glue.vmap(glue.grad(f_scalar))(xs)), df_scalar(xs), rtol=1e-12)
    jitted = ref_jit(glue.vmap(glue.grad(f_scalar)))
    np.testing.assert_allclose(np.asarray(jitted(xs)), df_scalar(xs), rtol=1e-12)
    x = xs[0]
    out, tangent = glue.jvp(glue.grad(f_scalar), (x,), (np.ones_like(x),))
    np.testing.assert_allclose(np.asarray(out), df_scalar(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent), d2f_scalar(x), rtol=1e-9, atol=1e-12)


def test_grad_of_vmap_and_nested_vmap():
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    per_row = glue.vmap(lambda r: gnp.sum(gnp.exp(r)) * 2.0)
    total = lambda m: gnp.sum(per_row(m))  # noqa: E731
    np.testing.assert_allclose(np.asarray(glue.grad(total)(x)), 2 * np.exp(x), rtol=1e-12)
    outer = glue.vmap(glue.vmap(lambda a, b: a * b, in_axes=(0, None)), in_axes=(None, 0))
    np.testing.assert_allclose(np.asarray(outer(np.arange(3.0), np.arange(4.0))),
                               np.outer(np.arange(4.0), np.arange(3.0)))


def test_nested_grads_keep_their_variables_apart():
    # d/dx [x * d/dy (x * y)] = d/dx x**2 = 2x: the inner grad must not see the outer x.
    g = glue.grad(lambda x: x * glue.grad(lambda y: x * y)(np.float64(3.0)))
    assert float(g(np.float64(1.5))) == pytest.approx(3.0)


def test_forward_mode_agrees_with_reverse_mode_on_a_jacobian():
    w = np.array([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]])
    f = lambda x: gnp.tanh(gnp.matmul(w, x))  # noqa: E731
    x = np.array([0.2, -0.4, 0.9])
    forward = np.stack([np.asarray(glue.jvp(f, (x,), (e,))[1]) for e in np.eye(3)], axis=1)
    _, pullback = glue.vjp(f, x)
    reverse = np.stack([np.asarray(pullback(e)[0]) for e in np.eye(2)])
    expected = (1 - np.tanh(w @ x) ** 2)[:, None] * w
    np.testing.assert_allclose(forward, expected, rtol=1e-12)
    np.testing.assert_allclose(reverse, expected, rtol=1e-12)


# --- signatures and pytrees -----------------------------------------------------------------

def test_argnums_has_aux_and_value_and_grad():
    def f(a, b, c):
        return gnp.sum(a * b) + c, {"prod": a * b}

    a, b = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    (value, aux), (ga, gb) = glue.value_and_grad(f, argnums=(0, 1), has_aux=True)(a, b, 0.5)
    assert float(value) == pytest.approx(1.5)
    np.testing.assert_allclose(np.asarray(aux["prod"]), a * b)
    np.testing.assert_allclose(np.asarray(ga), b)
    np.testing.assert_allclose(np.asarray(gb), a)
    gb_only, aux = glue.grad(f, argnums=-2, has_aux=True)(a, b, 0.5)
    np.testing.assert_allclose(np.asarray(gb_only), a)


def test_grad_with_respect_to_a_dict_of_params_and_keyword_arguments():
    params = {"w": np.array([[1.0, 2.0], [3.0, 4.0]]), "b": np.array([0.5, -0.5])}

    def loss(p, x, *, scale):
        return gnp.sum((gnp.matmul(x, p["w"]) + p["b"]) ** 2) * scale

    x = np.array([[1.0, -1.0]])
    grads = glue.grad(loss)(params, x, scale=2.0)
    assert set(grads) == {"w", "b"}
    residual = x @ params["w"] + params["b"]
    np.testing.assert_allclose(np.asarray(grads["b"]), 4 * residual[0])
    np.testing.assert_allclose(np.asarray(grads["w"]), 4 * x.T @ residual)


def test_vjp_and_jvp_with_pytrees_and_integer_values():
    def f(x, idx):
        return {"picked": gnp.take(x, idx), "count": gnp.sum(idx)}

    x, idx = np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2], np.int32)
    out, pullback = glue.vjp(f, x, idx)
    np.testing.assert_allclose(np.asarray(out["picked"]), [3.0, 1.0, 3.0])
    gx, gidx = pullback({"picked": np.array([1.0, 10.0, 100.0]), "count": np.int32(0)})
    np.testing.assert_allclose(np.asarray(gx), [10.0, 0.0, 101.0])
    assert np.asarray(gidx).dtype == np.int32 and not np.asarray(gidx).any()
    _, scalar_pullback = glue.vjp(lambda v: gnp.sum(v * v), x)
    np.testing.assert_allclose(np.asarray(scalar_pullback(1.0)[0]), 2 * x)  # a Python scalar cotangent
    primal, tangent = glue.jvp(f, (x, idx), (np.ones(3), np.zeros(3, np.int32)))
    np.testing.assert_allclose(np.asarray(tangent["picked"]), np.ones(3))
    assert np.asarray(tangent["count"]).dtype == np.int32 and int(np.asarray(tangent["count"])) == 0


def test_vmap_in_axes_and_out_axes_pytrees():
    def f(p, x):
        return {"y": gnp.matmul(x, p["w"]) + p["b"], "w": p["w"]}

    p = {"w": np.arange(6.0).reshape(3, 2), "b": np.arange(8.0).reshape(4, 2)}
    xs = np.arange(12.0).reshape(3, 4)  # batch on axis 1
    out = glue.vmap(f, in_axes=({"w": None, "b": 0}, 1), out_axes={"y": 1, "w": None})(p, xs)
    expected = np.stack([xs[:, i] @ p["w"] + p["b"][i] for i in range(4)], axis=1)
    np.testing.assert_allclose(np.asarray(out["y"]), expected)
    np.testing.assert_allclose(np.asarray(out["w"]), p["w"])
    broadcast = glue.vmap(lambda x, y: y * 2.0, in_axes=(0, None), out_axes=1)(np.zeros(4), np.ones(3))
    np.testing.assert_allclose(np.asarray(broadcast), 2 * np.ones((3, 4)))
    scaled = glue.vmap(lambda x, s: x * s, in_axes=(0, None))(np.ones((2, 3), np.float16), 3.0)
    assert scaled.dtype == np.float16  # an unmapped Python scalar stays weakly typed


def test_vmap_maps_keyword_arguments_along_axis_0_and_keeps_shared_tables_unbatched():
    table, idx = np.arange(12.0).reshape(4, 3), np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    lookup = glue.vmap(lambda i, *, scale: gnp.take(table, i, axis=0) * scale)
    np.testing.assert_allclose(np.asarray(lookup(idx, scale=np.array([1.0, 2.0, 3.0]))),
                               table[idx] * np.array([1.0, 2.0, 3.0])[:, None, None])
    closed = glue.make_ir(glue.vmap(lambda i: gnp.take(table, i, axis=0)))(idx)
    gathers = [e for e in closed.graph.eqns if e.primitive == "gather"]
    # it gathers from the table itself, not from a copy per example
    assert len(gathers) == 1 and gathers[0].inputs[0].type.shape == (4, 3)


def test_eager_results_are_glue_arrays():
    g = glue.grad(lambda x: x)(np.float32(2.0))
    assert isinstance(g, glue.Array) and g.dtype == np.float32 and float(g) == 1.0
    assert isinstance(glue.vmap(lambda x: x)(np.ones(2)), glue.Array)


def test_low_precision_gradients_keep_their_dtype():
    for dtype in (np.float16, gnp.bfloat16, np.float32):
        x = np.array([0.5, -1.0], dtype)
        g = glue.grad(lambda v: gnp.sum(gnp.exp(v)))(x)
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_allclose(np.asarray(g).astype(np.float64), np.exp(x.astype(np.float64)), rtol=1e-2)


def test_ties_share_the_gradient_equally():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])
    np.testing.assert_allclose(np.asarray(glue.grad(lambda v: gnp.sum(gnp.max(v, axis=1)))(x)),
                               [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    gx, gy = glue.grad(lambda a, b: gnp.sum(gnp.maximum(a, b)), argnums=(0, 1))(
        np.array([1.0, 2.0]), np.array([1.0, 5.0]))
    np.testing.assert_allclose(np.asarray(gx), [0.5, 0.0])
    np.testing.assert_allclose(np.asarray(gy), [0.5, 1.0])


def test_reduce_prod_gradient_is_exact_with_zeros():
    x = np.array([[2.0, 0.0, 3.0, 0.5], [0.0, 0.0, 1.0, 4.0]])
    np.testing.assert_allclose(np.asarray(glue.grad(lambda v: gnp.sum(gnp.prod(v, axis=1)))(x)),
                               [[0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


# --- stop_gradient --------------------------------------------------------------------------

def test_stop_gradient_in_grad_jvp_vjp_and_through_jit():
    x = np.array([0.5, -2.0])
    f = lambda v: gnp.sum(v * glue.stop_gradient(v * v))  # noqa: E731
    for g in (glue.grad(f), glue.grad(ref_jit(f)), ref_jit(glue.grad(f))):
        np.testing.assert_allclose(np.asarray(g(x)), x * x)
    _, tangent = glue.jvp(lambda v: v * glue.stop_gradient(v), (x,), (np.ones(2),))
    np.testing.assert_allclose(np.asarray(tangent), x)
    np.testing.assert_allclose(np.asarray(glue.stop_gradient(x)), x)
    per_example = glue.vmap(glue.grad(lambda v: gnp.sum(v * glue.stop_gradient(gnp.exp(v)))))
    xs = np.stack([x, 2 * x])
    np.testing.assert_allclose(np.asarray(per_example(xs)), np.exp(xs))
    # stopped inside an inner grad, the outer variable gets no derivative through it
    g = glue.grad(lambda a: glue.grad(lambda b: glue.stop_gradient(a) * a * b)(np.float64(1.0)))
    assert float(g(np.float64(3.0))) == pytest.approx(3.0)


def test_stop_gradient_of_a_pytree():
    tree = glue.stop_gradient({"a": np.ones(2), "b": (np.zeros(1), None)})
    assert set(tree) == {"a", "b"} and tree["b"][1] is None


# --- the programs transforms produce --------------------------------------------------------

def _primitives(closed):
    return [e.primitive for e in closed.graph.eqns]


def test_make_ir_of_grad_prints_the_backward_program():
    text = str(glue.make_ir(glue.grad(f_scalar))(np.ones(3)))
    assert "cos" in text and "sin" in text and HERE in text
    # The forward value sin(x) is reused by the backward program, not recomputed.
    assert text.count("= sin ") == 1


def test_symbolic_zeros_are_never_materialised():
    x, idx = np.ones((4, 3)), np.array([1, 3], np.int32)
    closed = glue.make_ir(glue.grad(lambda t, i: gnp.sum(gnp.take(t, i, axis=0) * 2.0)))(x, idx)
    prims = _primitives(closed)
    # One broadcast of 0 feeds the scatter_add of gather's transpose; nothing else is zero-filled.
    zero_fills = [e for e in closed.graph.eqns if e.primitive == "broadcast_in_dim"
                  and any(getattr(a, "value", None) == 0 for a in e.inputs)]
    assert len(zero_fills) == 1 and "scatter_add" in prims
    only_zero = glue.make_ir(glue.grad(lambda a, b: gnp.sum(a), argnums=1))(x, x)
    assert _primitives(only_zero) == ["reduce_sum", "broadcast_in_dim"]


def test_backward_of_a_bias_add_uses_reduce_sum():
    def loss(w, b, x):
        return gnp.sum(gnp.tanh(gnp.matmul(x, w) + b))

    closed = glue.make_ir(glue.grad(loss, argnums=(0, 1)))(np.ones((3, 2)), np.ones(2), np.ones((5, 3)))
    prims = _primitives(closed)
    assert prims.count("dot_general") == 2  # forward, and the one for w (x gets no cotangent)
    assert "reduce_sum" in prims and "tanh" in prims and prims.count("tanh") == 1


# --- a training run -------------------------------------------------------------------------

def test_mlp_loss_falls_under_jitted_value_and_grad():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = np.tanh(0.5 * x @ np.array([1.0, -2.0, 0.5, 1.5], np.float32))[:, None]
    params = {"w1": (rng.normal(size=(4, 16)) * 0.5).astype(np.float32), "b1": np.zeros(16, np.float32),
              "w2": (rng.normal(size=(16, 1)) * 0.5).astype(np.float32), "b2": np.zeros(1, np.float32)}

    def loss(p, x, y):
        h = gnp.tanh(gnp.matmul(x, p["w1"]) + p["b1"])
        return gnp.mean((gnp.matmul(h, p["w2"]) + p["b2"] - y) ** 2)

    step = ref_jit(glue.value_and_grad(loss))
    losses = []
    for _ in range(50):
        value, grads = step(params, x, y)
        losses.append(float(value))
        params = {k: params[k] - 0.2 * np.asarray(grads[k]) for k in params}
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.1 * losses[0]


# --- errors ---------------------------------------------------------------------------------

def test_grad_of_an_integer_input_is_an_error():
    with pytest.raises(GlueTypeError, match=r"grad\(<lambda>\): argument 0 is i32\[3\].*floating-point.*"
                       + HERE):
        glue.grad(lambda i: gnp.sum(i * 1.0))(np.arange(3, dtype=np.int32))


def test_grad_of_a_non_scalar_output_is_an_error():
    def vector_valued(x):
        return x * 2.0

    with pytest.raises(GlueTypeError, match=r"grad\(vector_valued\).*scalar.*f32\[3\].*" + HERE):
        glue.grad(vector_valued)(np.ones(3, np.float32))
    with pytest.raises(GlueTypeError, match=r"has_aux=True.*pair"):
        glue.grad(lambda x: gnp.sum(x), has_aux=True)(np.ones(3))
    with pytest.raises(TransformError, match=r"argnums=2 is out of range"):
        glue.grad(lambda x: gnp.sum(x), argnums=2)(np.ones(3))


def test_mismatched_in_axes_are_errors():
    def add(a, b):
        return a + b

    with pytest.raises(TransformError, match=r"vmap\(add\): the mapped axes have different sizes: "
                       r"args\[0\] \(f64\[3\]\) axis 0 has size 3; "
                       r"args\[1\] \(f64\[2,5\]\) axis 1 has size 5.*" + HERE):
        glue.vmap(add, in_axes=(0, 1))(np.ones(3), np.ones((2, 5)))
    with pytest.raises(TransformError, match=r"in_axes has 1 entries but .* 2 positional"):
        glue.vmap(add, in_axes=(0,))(np.ones(3), np.ones(3))
    with pytest.raises(TransformError, match=r"in_axes for args\[1\] \(f64\[3\]\) is axis 1, out of range "
                                             r"for rank 1"):
        glue.vmap(add, in_axes=(0, 1))(np.ones(3), np.ones(3))
    with pytest.raises(TransformError, match=r"in_axes\[0\] = \{'w': 0\} does not match an array"):
        glue.vmap(add, in_axes=({"w": 0}, 0))(np.ones(3), np.ones(3))
    with pytest.raises(TransformError, match=r"maps no argument"):
        glue.vmap(add, in_axes=None)(np.ones(3), np.ones(3))
    with pytest.raises(TransformError, match=r"out_axes is None for output, but it varies"):
        glue.vmap(add, out_axes=None)(np.ones(3), np.ones(3))


def test_mismatched_tangents_and_cotangents_are_errors():
    with pytest.raises(TransformError, match=r"jvp\(<lambda>\): the tangent for primals\[0\] is f64\[2\], "
                                             r"but the primal is f64\[3\]"):
        glue.jvp(lambda x: x, (np.ones(3),), (np.ones(2),))
    _, pullback = glue.vjp(lambda x: x * 2.0, np.ones(3))
    with pytest.raises(TransformError, match=r"cotangent for output is f64\[4\], but that output is "
                                             r"f64\[3\]"):
        pullback(np.ones(4))
    assert issubclass(TransformError, GlueError)


def test_escaped_tracer_in_stop_gradient_is_an_error():
    leaked = []
    glue.grad(lambda x: (leaked.append(x), gnp.sum(x))[1])(np.ones(2))
    with pytest.raises(GlueError, match="escaped"):
        glue.grad(lambda x: gnp.sum(x * glue.stop_gradient(leaked[0])))(np.ones(2))
