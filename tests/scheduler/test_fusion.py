"""Fusion decisions and the kernel IR they produce, checked by running Plans through the NumPy
interpreter of kernel IR against the Graph reference."""
import numpy as np
import pytest
from hypothesis import given, settings

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.scheduler.interpret import run_plan
from glue.scheduler.plan import STAGES, schedule
from glue.testing import programs_and_inputs, tolerance_dtypes

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def plan_of(fn, *args):
    closed = glue.make_ir(fn)(*args)
    return schedule(closed.graph), [np.asarray(c) for c in closed.consts] + list(args), closed


def assert_plan_matches(plan, args, closed):
    want = run_graph(closed.graph, args, float64=True)
    got = run_plan(plan, args)
    for g, w, d in zip(got, want, tolerance_dtypes(closed.graph)):
        assert mismatch(g, w, d, scale=4) is None


def kinds(plan):
    return [k.kind for k in plan.kernels]


def layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / gnp.sqrt(v + 1e-5) * w + b


def rmsnorm(x, w):
    return x / gnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def attention(q, k, v):
    s = q @ gnp.swapaxes(k, -1, -2) / np.float32(8.0)
    return nn.softmax(s, axis=-1) @ v


ONE_KERNEL = [
    ("softmax", lambda x: nn.softmax(x, axis=-1), [(8, 32)]),
    ("log_softmax", lambda x: nn.log_softmax(x, axis=-1), [(8, 32)]),
    ("logsumexp", lambda x: nn.logsumexp(x, axis=-1), [(8, 32)]),
    ("layernorm", layernorm, [(8, 32), (32,), (32,)]),
    ("rmsnorm", rmsnorm, [(8, 32), (32,)]),
    ("bias_gelu", lambda x, b: nn.gelu(x + b), [(8, 32), (32,)]),
]


@pytest.mark.parametrize("name,fn,shapes", ONE_KERNEL, ids=[c[0] for c in ONE_KERNEL])
def test_norms_and_softmaxes_are_one_kernel(name, fn, shapes):
    args = [f32(*s) for s in shapes]
    plan, all_args, closed = plan_of(fn, *args)
    assert len(plan.kernels) == 1, plan.as_text("fusion")
    assert plan.kernels[0].kind == ("pointwise" if name == "bias_gelu" else "reduction")
    # One kernel reads its input once: x is an input of the kernel exactly once.
    assert sum(b.type.shape == shapes[0] for b in plan.kernels[0].inputs) == 1
    assert_plan_matches(plan, all_args, closed)


def test_cross_entropy_is_one_row_kernel_and_a_mean():
    logits, labels = f32(16, 40), rng.integers(0, 40, 16).astype(np.int32)
    plan, args, closed = plan_of(nn.cross_entropy, logits, labels)
    assert kinds(plan).count("reduction") == len(plan.kernels) <= 2, plan.as_text("fusion")
    assert sum(b.type.shape == (16, 40) for k in plan.kernels for b in k.inputs) == 1
    assert_plan_matches(plan, args, closed)


def test_attention_is_two_contractions_around_one_softmax():
    q, k, v = f32(2, 8, 16), f32(2, 8, 16), f32(2, 8, 16)
    plan, args, closed = plan_of(attention, q, k, v)
    assert kinds(plan) == ["contraction", "reduction", "contraction"], plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)


def test_mlp_layers_fuse_bias_and_activation_into_the_contraction():
    def mlp(x, w1, b1, w2, b2):
        return gnp.tanh(nn.relu(x @ w1 + b1) @ w2 + b2)

    args = [f32(8, 16), f32(16, 32), f32(32), f32(32, 4), f32(4)]
    plan, all_args, closed = plan_of(mlp, *args)
    assert kinds(plan) == ["contraction", "contraction"], plan.as_text("fusion")
    assert "tanh" in plan.kernels[1].ops and "select" in plan.kernels[0].ops  # relu: x <= 0 ? 0 : x
    assert_plan_matches(plan, all_args, closed)


def test_expensive_work_is_not_recomputed_for_each_broadcast_element():
    def f(x, w):
        return x * gnp.exp(w)  # exp(w) per column, not per element

    plan, args, closed = plan_of(f, f32(64, 8), f32(8))
    exp_kernels = [k for k in plan.kernels if "exp" in k.ops]
    assert len(exp_kernels) == 1 and exp_kernels[0].parallel == (8,)
    assert "recomputed" in plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)


def test_a_value_used_by_two_kernels_is_computed_once_and_written():
    def f(x):
        h = gnp.exp(x)
        return h.sum(axis=0), h.max(axis=1)  # two reductions over different rows

    plan, args, closed = plan_of(f, f32(6, 10))
    assert sum("exp" in k.ops for k in plan.kernels) == 1
    assert_plan_matches(plan, args, closed)


def test_every_stage_has_text():
    plan, _, _ = plan_of(layernorm, f32(4, 8), f32(8), f32(8))
    texts = {stage: plan.as_text(stage) for stage in STAGES}
    assert "reduce_sum" in texts["optimized"] and "kernel 0 reduction" in texts["fusion"]
    assert "over r of" in texts["kernels"] and "peak" in texts["memory"]
    assert texts["graph"].startswith("digraph") and "subgraph cluster_0" in texts["graph"]


@settings(max_examples=60)
@given(programs_and_inputs(max_eqns=10))
def test_random_programs_run_the_same_through_kernels(case):
    graph, inputs = case
    plan = schedule(graph)
    got = run_plan(plan, inputs)
    want = run_graph(graph, inputs, float64=True)
    for g, w, d in zip(got, want, tolerance_dtypes(graph)):
        problem = mismatch(g, w, d)
        assert problem is None, f"{problem}\n{graph}\n{plan.as_text('kernels')}"


BACKWARDS = [
    ("softmax", lambda x, w, g: glue.vjp(lambda x: nn.softmax(x, axis=-1), x)[1](g), 1),
    ("log_softmax", lambda x, w, g: glue.vjp(lambda x: nn.log_softmax(x, axis=-1), x)[1](g), 1),
    ("layernorm", lambda x, w, g: glue.vjp(lambda x, w: nn.layer_norm(x, w, w), x, w)[1](g), 2),
    ("rmsnorm", lambda x, w, g: glue.vjp(lambda x, w: nn.rms_norm(x, w), x, w)[1](g), 2),
]


@pytest.mark.parametrize("name,fn,most", BACKWARDS, ids=[c[0] for c in BACKWARDS])
def test_norm_and_softmax_backwards_take_at_most_two_kernels(name, fn, most):
    # dx is one row kernel; weight gradients reduce over the rows, so they need a second one.
    plan, args, closed = plan_of(fn, f32(16, 32), f32(32), f32(16, 32))
    assert len(plan.kernels) <= most, plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)


def test_cross_entropy_gradient_is_one_kernel():
    logits, labels = f32(16, 40), rng.integers(0, 40, 16).astype(np.int32)
    plan, args, closed = plan_of(glue.grad(nn.cross_entropy), logits, labels)
    assert len(plan.kernels) == 1, plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)
