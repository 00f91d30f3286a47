"""Memory plans as the cpu backend runs them: a long chain needs far less than one buffer per
value, and no two arena buffers that are live at once overlap (except an output written in
place over an input that dies in that same elementwise kernel) — checked over random programs,
which then also run correctly from their arena."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cpu import CpuBackend
from glue.ir import dtypes as dt
from glue.scheduler.memory import reads_only_where_written
from glue.testing import check_graph, graph_inputs, programs


def _mlp(x, ws):
    for w in ws:
        x = gnp.tanh(x @ w)
    return x


def test_a_long_chain_peaks_far_below_one_buffer_per_value():
    x = np.ones((64, 128), np.float32)
    ws = [np.full((128, 128), 0.01, np.float32) for _ in range(12)]
    compiled = glue.jit(_mlp, backend="cpu").lower(x, ws).compile()
    m = compiled.memory_analysis()
    assert len(compiled.kernels) == 12
    assert m.arena_bytes <= 2 * x.nbytes  # two activations alive at a time
    assert m.peak_bytes - m.argument_bytes <= 3 * x.nbytes
    assert m.naive_bytes - m.argument_bytes >= 12 * x.nbytes
    got = np.asarray(compiled(x, ws))
    want = x.astype(np.float64)
    for w in ws:
        want = np.tanh(want @ w)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _in_place(plan, a: int, b: int) -> bool:
    """Whether value b is written over value a by the kernel where a dies (or the reverse)."""
    for k, kernel in enumerate(plan.kernels):
        ins = [buf.value_id for buf in kernel.inputs]
        outs = [buf.value_id for buf in kernel.outputs]
        for x, y in ((a, b), (b, a)):
            if x in ins and y in outs and plan.memory.lifetimes[x][1] == k and \
                    reads_only_where_written(kernel, ins.index(x), outs.index(y)):
                return True
    return False


def _arena_overlaps(plan):
    arena = {v: p for v, p in plan.memory.placements.items() if p.kind == "arena"}
    live = plan.memory.lifetimes
    found = []
    for a, pa in arena.items():
        for b, pb in arena.items():
            if a >= b:
                continue
            (sa, ea), (sb, eb) = live[a], live[b]
            same_time = sa <= eb and sb <= ea
            same_bytes = pa.slot < pb.slot + pb.type.nbytes and pb.slot < pa.slot + pa.type.nbytes
            if same_time and same_bytes and not _in_place(plan, a, b):
                found.append((a, b))
    return found


@st.composite
def _programs_with_inputs(draw):
    graph = draw(programs(dtypes=(dt.float32, dt.int32, dt.bool_, dt.bfloat16), max_eqns=14, max_inputs=2))
    return graph, draw(graph_inputs(graph))


@settings(max_examples=max(100, settings.default.max_examples))
@given(_programs_with_inputs())
def test_live_arena_buffers_never_overlap(case):
    graph, inputs = case
    lowered = CpuBackend().lower(graph)
    plan = lowered["plan"]
    assert not _arena_overlaps(plan), plan.as_text("memory")
    assert plan.memory.arena_bytes <= sum(p.type.nbytes + 256 for p in plan.memory.placements.values()
                                          if p.kind == "arena")
    check_graph(graph, inputs, backends=["cpu"])


def test_a_weight_update_after_its_gradient_writes_over_the_donated_weight():
    """The update fused into the gradient's contraction epilogue reads the old weight only at
    the element it writes, so the new weight takes the donated buffer: no fresh output."""
    def sgd(w, x, g):
        return w - 0.1 * (x.T @ g)

    w, x, g = (np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in ((32, 16), (64, 32), (64, 16)))
    want = w - 0.1 * (x.T @ g)
    compiled = glue.jit(sgd, backend="cpu", donate_argnums=0).lower(w, x, g).compile()
    assert compiled.memory_analysis().output_bytes == 0
    np.testing.assert_allclose(np.asarray(compiled(w.copy(), x, g)), want, rtol=1e-5, atol=1e-6)


def test_memory_analysis_itemises_what_is_live_at_the_peak():
    def loss(ws, x):
        for w in ws:
            x = gnp.tanh(x @ w)  # the line every saved activation comes from
        return (x * x).sum()

    x, ws = np.ones((64, 128), np.float32), [np.full((128, 128), 0.01, np.float32) for _ in range(6)]
    m = glue.jit(glue.grad(loss), backend="cpu").lower(ws, x).compile().memory_analysis()
    assert m.peak_bytes == m.argument_bytes + m.arena_bytes + m.output_bytes
    assert m.arena_bytes <= m.live_peak_bytes + 4096 and 0 <= m.peak_kernel
    assert sum(v.nbytes for v in m.live_at_peak) == m.live_peak_bytes
    (line, nbytes, count), *_ = m.by_source()
    here = loss.__code__.co_firstlineno + 2
    assert line.endswith(f"test_cpu_memory.py:{here}") and count >= 5 and nbytes >= 5 * x.nbytes, m.report()
    assert "live in the arena" in m.report() and "tanh" in m.report()
