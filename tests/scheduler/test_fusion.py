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
from glue.scheduler import fusion
from glue.scheduler.lowering import FusionRefused, lower_group
from glue.scheduler.passes import optimize
from glue.scheduler.plan import STAGES, schedule
from glue.testing import programs, programs_and_inputs, tolerance_dtypes

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


def test_identical_kernels_on_unrelated_data_stay_apart_and_compile_once():
    # Neighbours that share no data merge to save a launch, but not when they compute the same
    # thing (a model's layers): apart they are one compiled kernel, merged one that grows with
    # each layer.
    def layers(*xs):
        return [gnp.log(x) * 2.0 + 1.0 for x in xs]
    xs = [np.abs(f32(16, 32)) + 0.5 for _ in range(4)]
    plan, args, closed = plan_of(layers, *xs)
    assert kinds(plan) == ["pointwise"] * 4
    assert "compute the same thing on data they do not share" in str(plan.fusion)
    assert_plan_matches(plan, args, closed)
    exe = glue.jit(layers, backend="cpu").lower(*xs).compile()
    assert len(exe.kernels) == 4 and sum(exe.compile_stats()["cache"].values()) == 1  # one distinct kernel


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


# --- legality from summaries, scores, refusals ------------------------------------------------

class _CheckedFuser(fusion._Fuser):
    """A fuser that checks each legality decision it takes from group summaries against
    building the candidate kernel, as lowering would."""

    def _agree(self, eqns, outputs, refusal):
        try:
            lower_group([self.eqns[j] for j in sorted(eqns)], outputs, "check")
        except FusionRefused as why:
            assert refusal == str(why), (refusal, str(why), self.graph)
            return
        assert refusal is None, (refusal, self.graph)

    def _trial(self, i, group, as_home):
        (var,) = self.eqns[i].outvars
        output = as_home and var.id not in group.outputs and self.needed(var, group.gid)
        outputs = list(group.outputs.values()) + ([var] if output else [])
        try:
            trial = super()._trial(i, group, as_home)
        except FusionRefused as why:
            self._agree(group.members | {i}, outputs, str(why))
            raise
        self._agree(group.members | {i}, outputs, None)
        return trial

    def _merge_walk(self, gk, gg, passed, dropped):
        outputs = [v for g in (gk, gg) for v in g.outputs.values() if v.id not in dropped]
        try:
            walk = super()._merge_walk(gk, gg, passed, dropped)
        except FusionRefused as why:
            self._agree(gk.members | gg.members, outputs, str(why))
            raise
        self._agree(gk.members | gg.members, outputs, None)
        return walk


@settings(max_examples=80)
@given(programs(max_eqns=14))
def test_legality_from_summaries_agrees_with_building_the_kernel(graph):
    _CheckedFuser(optimize(graph)).run()


def _refusals(plan, reason):
    return [r for r in plan.fusion.refusals if reason in r.reason]


def test_each_final_kernel_is_lowered_at_most_once(monkeypatch):
    from glue.scheduler import lowering

    calls = []

    def counting(eqns, outputs, name):
        calls.append(name)
        return lower_group(eqns, outputs, name)

    monkeypatch.setattr(lowering, "lower_group", counting)
    plan, _, _ = plan_of(lambda x, w, g: glue.vjp(lambda x, w: nn.layer_norm(x, w, w), x, w)[1](g),
                         f32(16, 32), f32(32), f32(16, 32))
    assert 0 < len(calls) <= len(plan.kernels) and len(set(calls)) == len(calls)


def test_recomputing_a_producer_that_reads_more_than_it_saves_is_refused_as_not_profitable():
    def f(a, b, c):
        p = a + b  # both kernels would read a and b instead of p, and do the add again
        return (p * c).sum(axis=0), gnp.exp(p).sum(axis=1)

    plan, args, closed = plan_of(f, f32(8, 16), f32(8, 16), f32(8, 16))
    assert _refusals(plan, "not profitable: recomputing add"), plan.as_text("fusion")
    assert "not profitable: recomputing add" in plan.as_text("fusion")
    assert sum("add" in k.ops for k in plan.kernels) == 1
    assert_plan_matches(plan, args, closed)


def test_a_cheap_producer_whose_operands_each_kernel_reads_anyway_is_recomputed():
    def f(x):
        h = x * 2.0
        return (h * x).sum(axis=0), (h + x).max(axis=1)

    plan, args, closed = plan_of(f, f32(8, 16))
    assert sum("mul" in k.ops for k in plan.kernels) == 2 and not plan.fusion.refusals
    assert_plan_matches(plan, args, closed)


def test_a_refused_sibling_merge_is_recorded_with_its_reason():
    def f(x, w):
        s = x.sum(axis=1)  # a row reduction of x ...
        m = (s[:, None] * x) @ w  # ... that a contraction needs ...
        return s, (x * m).sum(axis=1)  # ... before a second row reduction of x

    plan, args, closed = plan_of(f, f32(8, 16), f32(16, 16))
    assert _refusals(plan, "reads the other through a third"), plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)


def test_independent_kernels_over_one_domain_merge_to_save_a_launch():
    def f(a, b):
        return gnp.exp(a).sum(axis=1), (b * b).sum(axis=1)

    plan, args, closed = plan_of(f, f32(8, 16), f32(8, 16))
    assert kinds(plan) == ["reduction"], plan.as_text("fusion")
    assert_plan_matches(plan, args, closed)


def test_a_kernel_stops_growing_where_it_would_compile_slower_than_fusing_saves():
    def chain(x):
        for _ in range(fusion.MAX_KERNEL_SIZE):
            x = x * 0.75 + 0.125
        return x

    plan, args, closed = plan_of(chain, f32(4, 8))
    assert len(plan.kernels) >= 2 and _refusals(plan, "compiles slower than fusing saves")
    assert_plan_matches(plan, args, closed)


def test_identical_groups_are_lowered_once(monkeypatch):
    """Each layer of a model makes the same groups; the second and later are the first's
    kernel with their own buffers, names and source lines, exactly what lowering them makes."""
    from glue.backend.kernel_key import kernel_structure
    from glue.scheduler import lowering

    def layer(x, w, b):
        return nn.gelu(nn.softmax(x @ w) * w.sum(0) + b) + (x * x).mean(-1, keepdims=True)

    def model(x, ws, bs):
        for w, b in zip(ws, bs):
            x = layer(x, w, b)
        return x.sum()

    ws, bs = [f32(16, 16) for _ in range(4)], [f32(16) for _ in range(4)]
    graph = optimize(glue.make_ir(glue.grad(model))(f32(8, 16), ws, bs).graph)
    lowered = []
    monkeypatch.setattr(lowering, "lower_group", lambda *a: lowered.append(a) or lower_group(*a))
    result = fusion.fuse(graph)
    built = [k for k in result.kernels if k.call is None]
    assert len(lowered) < len(built)  # some groups were not lowered again
    for kernel, group, outs in zip(result.kernels, result.groups, result.outputs):
        fresh = lower_group([graph.eqns[i] for i in group], outs, kernel.name.rpartition("_")[2])
        assert (kernel.name, kernel.inputs, kernel.outputs, kernel.source, str(kernel)) == \
            (fresh.name, fresh.inputs, fresh.outputs, fresh.source, str(fresh))
        assert kernel_structure(kernel) == kernel_structure(fresh)


def test_reshape_reads_are_remembered_only_over_domain_dims():
    """A reshape's read of an index over the domain's dims is computed once and handed out as
    a tuple of its own each time; an index holding a value (a gather's) is computed afresh."""
    from glue.ir import Eqn, TensorType, Var
    from glue.ir import dtypes as dt
    from glue.scheduler import lowering
    from glue.scheduler.kernel_ir import Const, FromValue, Index

    x, y = Var(TensorType((4, 6), dt.float32)), Var(TensorType((24,), dt.float32))
    eqn = Eqn("reshape", (x,), (("new_sizes", (24,)), ("dimensions", None)), (y,))
    domain = lowering.Domain("pointwise", (24,), (), (24,))
    index = (Index.dim(0),)
    first = lowering._reshape_reads(domain, eqn, index, ())[0][1]
    hits = lowering._reshaped_affine.cache_info().hits
    again = lowering._reshape_reads(domain, eqn, index, ())[0][1]
    assert again == first == lowering._reshaped(index, (24,), (4, 6), (24,)) and again is not first
    assert lowering._reshaped_affine.cache_info().hits == hits + 1
    picked = (Index.of(FromValue(Const(3, dt.int32))),)
    asked = lowering._reshaped_affine.cache_info()
    lowering._reshape_reads(domain, eqn, picked, ())
    assert lowering._reshaped_affine.cache_info() == asked  # neither served nor stored


def test_literals_of_opposite_zero_signs_stay_apart():
    """0.0 and -0.0 compare equal in Python, but x * 0.0 and x * -0.0 are not the same value:
    a kernel computing both keeps both (it once stored the first for the second), and so do
    the cpu backend's code and results, also where its reads are moved (a slice)."""
    from glue.scheduler.kernel_ir import Const
    from glue.ir import dtypes as dt

    assert Const(0.0, dt.float32) != Const(-0.0, dt.float32)
    assert hash(Const(0.0, dt.float32)) != hash(Const(-0.0, dt.float32))
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    for fn in (lambda v: (v * 0.0, v * -0.0), lambda v: (v[1:] * -0.0, v[1:] * 0.0)):
        plan, args, closed = plan_of(fn, x)
        (kernel,) = plan.kernels
        assert kernel.stores[0].value != kernel.stores[1].value
        want = [np.signbit(o) for o in fn(x)]  # NumPy, in float32
        assert want[0].all() != want[1].all()
        for backend in ("reference", "cpu"):
            got = [np.signbit(np.asarray(o)) for o in glue.jit(fn, backend=backend)(x)]
            assert all((g == w).all() for g, w in zip(got, want)), backend
