"""Call kernels in the scheduler: an opaque equation is a kernel of its own whose memory its
plan describes (scan iterations in place on slices, carries alternating into the outputs,
bodies' results written or copied); the kernel-IR interpreter runs programs with calls as the
reference does."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import lax
from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.scheduler.calls import Ref, body_layout, call_plan, lower_call, scan_invocations
from glue.scheduler.interpret import run_plan
from glue.scheduler.plan import Result, schedule


def _graph(fn, *args):
    return glue.make_ir(fn)(*args).graph


def test_an_opaque_equation_is_a_kernel_of_its_own():
    def f(x):
        y = gnp.exp(x) * 2  # fuses on its own side ...
        c, ys = lax.scan(lambda c, v: (c + v, c * v), 0.0, y)
        return ys + 1  # ... and on the other
    plan = schedule(_graph(f, np.ones(4, np.float32)))
    kinds = [k.kind for k in plan.kernels]
    assert kinds == ["pointwise", "call", "pointwise"]
    call = plan.kernels[1]
    assert call.ops == ("scan",) and call.call.primitive == "scan"
    assert [b.type for b in call.outputs] == [v.type for v in call.call.outvars]
    assert "scan runs as a kernel of its own" in str(plan.fusion)
    placements = plan.memory.placements
    ins = {(placements[b.value_id].kind, placements[b.value_id].slot) for b in call.inputs}
    outs = {(placements[b.value_id].kind, placements[b.value_id].slot) for b in call.outputs}
    assert not ins & outs  # a call never writes over what it reads


def test_lower_call_takes_variables_once_and_literals_as_constants():
    graph = _graph(lambda x: lax.scan(lambda c, v: (c + v, None), 1.5, x)[0], np.ones(3, np.float32))
    (eqn,) = [e for e in graph.eqns if e.primitive == "scan"]
    kernel = lower_call(eqn, "7")
    assert kernel.kind == "call" and kernel.name == "scan_7" and len(kernel.inputs) == 1
    plan = call_plan(kernel)
    assert plan.operands == (Ref("literal", 0), Ref("input", 0)) and plan.literals[0].value == 1.5


@given(length=st.integers(0, 5), reverse=st.booleans(), n_carry=st.integers(1, 2))
def test_scan_invocations_read_and_write_slices_and_end_in_the_outputs(length, reverse, n_carry):
    def f(c, xs):
        return lax.scan(lambda c, x: (tuple(v + x for v in c), x * 2), c, xs, reverse=reverse)
    carries = tuple(np.full(3, k, np.float32) for k in range(n_carry))
    graph = _graph(f, carries, np.ones((length, 3), np.float32))
    plan = schedule(graph)
    (kernel,) = [k for k in plan.kernels if k.kind == "call"]
    call = call_plan(kernel)
    steps = scan_invocations(call)
    if length == 0:
        assert [s.body for s in steps] == [None] and steps[0].results == call.results[:n_carry]
        return
    assert len(steps) == length
    order = list(reversed(range(length))) if reverse else list(range(length))
    x_ref = call.operands[-1]
    assert [s.args[-1] for s in steps] == [Ref(x_ref.kind, x_ref.index, t * 12) for t in order]
    assert [s.results[-1].offset for s in steps] == [t * 12 for t in order]
    assert steps[-1].results[:n_carry] == call.results[:n_carry]
    for before, after in zip(steps, steps[1:]):  # each reads what the one before wrote, never its own output
        assert after.args[:n_carry] == before.results[:n_carry]
        assert set(after.args[:n_carry]).isdisjoint(after.results[:n_carry])


def test_body_layout_copies_inputs_and_fills_literals():
    t = TensorType((2,), dt.float32)
    layout = body_layout([Result("output", 0, t), Result("argument", 1, t), Result("output", 0, t),
                          Result("literal", -1, t, 3.0), Result("output", 1, t)])
    assert layout.slot_result == (0, 4)
    assert layout.copies == ((("argument", 1), 1), (("result", 0), 2))
    assert layout.fills == ((3, 3.0),)
    with pytest.raises(ValueError, match="donated"):
        body_layout([Result("donated", 0, t)])


@pytest.mark.parametrize("case", ["scan", "while", "cond", "barrier", "grad"])
def test_the_kernel_interpreter_runs_calls_like_the_reference(case):
    x = np.linspace(-1, 1, 6).reshape(2, 3).astype(np.float32)
    fns = {
        "scan": lambda x: lax.scan(lambda c, v: (gnp.tanh(c + v), c.sum()), x[0], x),
        "while": lambda x: lax.while_loop(lambda c: c.sum() < 20, lambda c: c * 2 + 1, x),
        "cond": lambda x: lax.cond(x.sum() > 0, lambda v: v * 3, lambda v: -v, x),
        "barrier": lambda x: lax.optimization_barrier((x, x * 2)),
        "grad": glue.grad(lambda x: lax.scan(lambda c, v: (gnp.sin(c) * v, None), x[0], x)[0].sum()),
    }
    closed = glue.make_ir(fns[case])(x)
    got = run_plan(schedule(closed.graph), [x])
    want = glue.tree_flatten(glue.jit(fns[case], backend="reference")(x))[0]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6)
