"""The stream plan: independent kernels on separate streams, every dependency ordered by stream
order or an event, and a memory plan that never lets one stream overwrite what another reads."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.scheduler.memory import reads_only_where_written
from glue.scheduler.plan import schedule
from glue.scheduler import streams as stream_plan
from glue.scheduler.streams import JOIN_LAG, MAX_STREAMS
from glue.testing import programs


def plan_for(fn, *args, max_streams=MAX_STREAMS):
    return schedule(glue.make_ir(fn)(*args).graph, (), max_streams)


def happens_before(streams):
    """i -> the kernels that finish before kernel i starts, from the stream order and the waits
    alone (not from the plan's own `clocks`)."""
    preds = {k: set(w) for k, w in enumerate(streams.waits)}
    last = {}
    for k, s in enumerate(streams.streams):
        if s in last:
            preds[k].add(last[s])
        last[s] = k
    closure = {}
    for k in range(len(streams.streams)):
        closure[k] = set(preds[k])
        for p in preds[k]:
            closure[k] |= closure[p]
    return closure


def joins(streams):
    """The waits of stream-0 kernels on kernels they do not depend on (joins of side work)."""
    return [(k, w) for k, waits in enumerate(streams.waits) if streams.streams[k] == 0
            for w in waits if w not in streams.deps[k]]


def test_two_independent_branches_use_two_streams():
    def f(a, b):
        return gnp.tanh(a @ a).sum(axis=1), gnp.exp(b).sum(axis=0)

    plan = plan_for(f, np.ones((16, 16), np.float32), np.ones((8, 32), np.float32))
    s = plan.streams
    assert s.n_streams == 2, plan.as_text("streams")
    assert not any(s.waits), "independent branches need no events"
    text = plan.as_text("streams")
    assert "2 stream(s)" in text and "s0 joins s1" in text


def test_a_chain_stays_on_one_stream():
    def f(x):
        return gnp.exp(gnp.tanh(x @ x).sum(axis=1))

    plan = plan_for(f, np.ones((16, 16), np.float32))
    assert plan.streams.n_streams == 1 and not any(plan.streams.waits)


def test_a_join_waits_for_the_other_branch():
    def f(a, b):
        return (gnp.tanh(a @ a).sum(axis=1) + gnp.exp(b).sum(axis=0)).sum()

    plan = plan_for(f, np.ones((16, 16), np.float32), np.ones((4, 16), np.float32))
    s = plan.streams
    assert s.n_streams == 2
    (joiner,) = [k for k, w in enumerate(s.waits) if w]
    assert all(s.before(d, joiner) for d in s.deps[joiner])


def _mlp_step(ws, x, y):
    def loss(ws):
        h = x
        for w in ws:
            h = gnp.tanh(h @ w)
        return ((h - y) ** 2).mean()

    value, grads = glue.value_and_grad(loss)(ws)
    return [w - 0.1 * g for w, g in zip(ws, grads)], value


def test_the_longest_chain_stays_on_stream_0_and_side_work_branches_off():
    """In a training step the forward and the input-gradient chain are the critical path: each
    of its kernels continues its producer's stream (no event on it), while the loss and the
    weight updates that hang off it run on other streams."""
    ws = [np.ones((16, 16), np.float32)] * 3
    plan = plan_for(_mlp_step, ws, np.ones((4, 16), np.float32), np.ones((4, 16), np.float32))
    s = plan.streams
    height = {}
    for k in reversed(range(len(s.streams))):
        height[k] = 1 + max((height[c] for c in range(k + 1, len(s.streams)) if k in s.deps[c]), default=0)
    chain, k = [0], 0
    while any(k in d for d in s.deps):
        k = max((c for c, d in enumerate(s.deps) if k in d), key=lambda c: (height[c], -c))
        chain.append(k)
    assert len(chain) >= 6, plan.as_text("streams")
    # on the chain, the only waits are stream 0's joins of side work it has run past
    assert all(s.streams[k] == 0 and all(k - w >= JOIN_LAG for w in s.waits[k]) for k in chain), \
        plan.as_text("streams")
    assert s.n_streams > 1


def test_stream_0_joins_the_side_work_it_has_run_past_and_holds_less_memory(monkeypatch):
    """A value a side stream reads stays reserved until a wait orders the read before its memory
    is used again: stream 0 joins each side stream's work once JOIN_LAG kernels have run past it,
    so that the backward's activations are not all held to the end of the call."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(8)]
    x, y = rng.standard_normal((512, 256)).astype(np.float32), np.zeros((512, 256), np.float32)
    graph = glue.make_ir(_mlp_step)(ws, x, y).graph
    plan = schedule(graph, (), MAX_STREAMS)
    s = plan.streams
    assert s.n_streams > 1 and joins(s), plan.as_text("streams")
    main = [k for k, stream in enumerate(s.streams) if stream == 0]
    for t, stream in enumerate(s.streams):
        if stream:
            assert all(s.before(t, k) for k in main if k >= t + JOIN_LAG), plan.as_text("streams")
    monkeypatch.setattr(stream_plan, "JOIN_LAG", 1 << 30)
    unjoined = schedule(graph, (), MAX_STREAMS)
    assert plan.memory.peak_bytes < unjoined.memory.peak_bytes


def test_one_stream_when_asked():
    def f(a, b):
        return gnp.exp(a).sum(axis=0), gnp.exp(b).sum(axis=0)

    plan = plan_for(f, np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), max_streams=1)
    assert plan.streams.n_streams == 1


@settings(max_examples=60)
@given(programs(max_eqns=12))
def test_dependencies_are_ordered_and_no_stream_overwrites_what_another_reads(graph):
    check_stream_plan(graph)


@settings(max_examples=25)
@given(st.integers(3, 10), st.sampled_from([16, 64, 128]), st.sampled_from([8, 96]))
def test_training_steps_with_joins_keep_every_read_before_its_memory_is_reused(depth, width, batch):
    """Training steps are deep enough that stream 0 joins the side streams it has run past
    (JOIN_LAG), which lets the memory plan reuse what those streams read."""
    ws = [np.ones((width, width), np.float32)] * depth
    x = np.ones((batch, width), np.float32)
    plan = check_stream_plan(glue.make_ir(_mlp_step)(ws, x, x).graph)
    if plan.streams.n_streams > 1:
        assert joins(plan.streams)


def check_stream_plan(graph):
    """Every dependency is ordered, and no two values that share memory are both in use
    without one's users all finishing before the other's start."""
    plan = schedule(graph, (), MAX_STREAMS)
    streams, mem = plan.streams, plan.memory
    before = happens_before(streams)
    for k, deps in enumerate(streams.deps):
        assert set(deps) <= before[k], plan.as_text("streams")
        assert all(streams.before(d, k) for d in deps)
    users = {}
    for k, kernel in enumerate(plan.kernels):
        for b in kernel.inputs + kernel.outputs:
            users.setdefault(b.value_id, set()).add(k)
    in_place = {(inp.value_id, out.value_id)
                for kernel in plan.kernels
                for i, inp in enumerate(kernel.inputs) for o, out in enumerate(kernel.outputs)
                if reads_only_where_written(kernel, i, o)}
    arena = [(v, p) for v, p in mem.placements.items() if p.kind == "arena"]
    for n, (va, pa) in enumerate(arena):
        for vb, pb in arena[n + 1:]:
            if not (pa.slot < pb.slot + pb.type.nbytes and pb.slot < pa.slot + pa.type.nbytes):
                continue
            if (va, vb) in in_place or (vb, va) in in_place:
                continue
            a_first = all(i in before[j] for i in users[va] for j in users[vb])
            b_first = all(j in before[i] for i in users[va] for j in users[vb])
            assert a_first or b_first, (va, vb, plan.as_text("streams"), plan.as_text("memory"))
    return plan
