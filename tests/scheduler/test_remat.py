"""What a training step keeps for its backward: the rematerialisation cut, checkpointing, and
the memory plan run on poisoned memory (each value at its placement, everything else NaN)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.scheduler.fusion import fuse
from glue.scheduler.interpret import run_plan, run_plan_placed
from glue.scheduler.memory import plan_memory
from glue.scheduler.passes import optimize
from glue.scheduler.plan import Plan, schedule
from glue.scheduler.remat import fullest_gap, rematerialize
from glue.scheduler.streams import plan_streams
from glue.testing import programs_and_inputs, tolerance_dtypes

rng = np.random.default_rng(0)


def f32(*shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def unrematerialized(graph):
    """The Plan of `graph` as the scheduler made it before the rematerialisation pass."""
    optimized = optimize(graph)
    fusion = fuse(optimized)
    streams = plan_streams(fusion.kernels, 1)
    return Plan(optimized, fusion, streams, plan_memory(optimized, fusion.kernels, (), streams))


def matches_reference(plan, graph, args, run=run_plan):
    want = run_graph(graph, args, float64=True)
    for g, w, d in zip(run(plan, args), want, tolerance_dtypes(graph)):
        problem = mismatch(g, w, d, scale=4)
        assert problem is None, problem


def gelu_mlp_loss(params, x):
    for w1, w2 in params:
        x = x + nn.gelu(x @ w1, approximate=True) @ w2
    return (x * x).mean()


def mlp_params(depth=6, d=128, hidden=512):
    return [(f32(d, hidden), f32(hidden, d)) for _ in range(depth)]


def block(p, x):
    """A pre-LN transformer block: causal attention over 2 heads, a GELU MLP."""
    B, T, d = x.shape
    h = nn.layer_norm(x, p["g"], p["b"])
    q, k, v = (gnp.swapaxes((h @ p[n]).reshape(B, T, 2, d // 2), 1, 2) for n in ("wq", "wk", "wv"))
    s = gnp.where(gnp.tril(gnp.ones((T, T), dtype=bool)), q @ gnp.swapaxes(k, -1, -2) * 0.125, -1e9)
    o = gnp.swapaxes(nn.softmax(s, axis=-1) @ v, 1, 2).reshape(B, T, d)
    x = x + o @ p["wo"]
    return x + nn.gelu(nn.layer_norm(x, p["g"], p["b"]) @ p["w1"], approximate=True) @ p["w2"]


def block_params(d=64):
    return {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32), "wq": f32(d, d), "wk": f32(d, d),
            "wv": f32(d, d), "wo": f32(d, d), "w1": f32(d, 4 * d), "w2": f32(4 * d, d)}


def stack_loss(layer, params, x):
    for p in params:
        x = layer(p, x)
    return (x * x).mean()


def peak_and_results(fn, *args):
    """The planned peak of `fn` at `args`, and its results by the reference."""
    closed = glue.make_ir(fn)(*args)
    flat = [*closed.consts, *glue.tree_util.tree_leaves(args)]
    return schedule(closed.graph).memory.peak_bytes, run_graph(closed.graph, flat)


def assert_same(got, want, rtol):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)


def test_the_cut_keeps_less_across_the_forward_and_backward_and_results_stay():
    params, x = mlp_params(), f32(512, 128)
    closed = glue.make_ir(glue.value_and_grad(gelu_mlp_loss))(params, x)
    before, after = unrematerialized(closed.graph), schedule(closed.graph)
    assert fullest_gap(after.graph).bytes < fullest_gap(before.graph).bytes
    # per layer the GELU's tanh and product are recomputed from the pre-activation
    assert after.memory.peak_bytes < before.memory.peak_bytes - 4 * 512 * 512 * 4
    matches_reference(after, closed.graph, [*closed.consts, *[a for p in params for a in p], x])


def bf16_mlp_loss(params, x):
    """Mixed precision: float32 weights, cast to bfloat16 where they are used."""
    x = x.astype(gnp.bfloat16)
    for w1, w2 in params:
        x = x + nn.gelu(x @ w1.astype(gnp.bfloat16), approximate=True) @ w2.astype(gnp.bfloat16)
    return (x.astype(gnp.float32) ** 2).mean()


def test_the_16_bit_weights_are_kept_for_the_backward_not_cast_again():
    params, x = mlp_params(), f32(512, 128)
    closed = glue.make_ir(glue.value_and_grad(bf16_mlp_loss))(params, x)
    plan = schedule(closed.graph)
    assert len(plan.graph.eqns) > len(optimize(closed.graph).eqns)  # the cut made copies
    weights = {v.id for v in plan.graph.invars[:2 * len(params)]}
    casts = [e for e in plan.graph.eqns
             if e.primitive == "convert_element_type" and getattr(e.inputs[0], "id", None) in weights]
    assert len(casts) == len(weights)  # one cast per weight: the backward reads the forward's
    matches_reference(plan, closed.graph, [*closed.consts, *[a for p in params for a in p], x])


def test_small_programs_are_left_alone():
    closed = glue.make_ir(glue.grad(gelu_mlp_loss))(mlp_params(2, 8, 16), f32(4, 8))
    graph = optimize(closed.graph)
    assert rematerialize(graph) is graph


def test_checkpoint_lowers_the_peak_of_a_deep_mlp_with_the_same_gradients():
    params, x = mlp_params(), f32(512, 128)

    def layer(p, x):
        w1, w2 = p
        return x + nn.gelu(x @ w1, approximate=True) @ w2

    plain, want = peak_and_results(glue.value_and_grad(lambda ps, x: stack_loss(layer, ps, x)), params, x)
    saved, got = peak_and_results(glue.value_and_grad(lambda ps, x: stack_loss(glue.checkpoint(layer), ps, x)),
                                  params, x)
    assert saved < 0.8 * plain
    assert_same(got, want, 1e-6)


def test_checkpoint_lowers_the_peak_of_transformer_blocks_with_the_same_gradients():
    params, x = [block_params() for _ in range(4)], f32(2, 256, 64, scale=1.0)
    plain, want = peak_and_results(glue.grad(lambda ps, x: stack_loss(block, ps, x)), params, x)
    saved, got = peak_and_results(glue.grad(lambda ps, x: stack_loss(glue.checkpoint(block), ps, x)), params, x)
    assert saved < 0.8 * plain
    assert_same(got, want, 1e-6)


def test_a_training_step_runs_right_from_its_planned_memory():
    params, x = [block_params() for _ in range(2)], f32(4, 128, 64, scale=1.0)
    closed = glue.make_ir(glue.value_and_grad(lambda ps, x: stack_loss(block, ps, x)))(params, x)
    plan = schedule(closed.graph)
    args = [*closed.consts, *glue.tree_util.tree_leaves(params), x]
    for poison in (0xFF, 0x00):
        matches_reference(plan, closed.graph, args, lambda plan, args: run_plan_placed(plan, args, poison))


@settings(max_examples=60, deadline=None)
@given(programs_and_inputs(max_eqns=12), st.booleans(), st.sampled_from([0xFF, 0x00, 0x7F]))
def test_the_memory_plan_never_overlaps_two_live_values(case, donate, poison):
    """Every value lives where the plan puts it, in memory filled with poison: two live values
    sharing bytes, or a read of bytes nothing wrote, would change a result."""
    graph, inputs = case
    plan = schedule(graph, donated=tuple(range(len(graph.invars))) if donate else ())
    matches_reference(plan, graph, inputs, lambda plan, args: run_plan_placed(plan, args, poison))
