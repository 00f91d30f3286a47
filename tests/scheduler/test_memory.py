"""The memory plan: arena packing, liveness, in-place reuse and donation."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.nn as nn
from glue.scheduler.memory import _best_fit, reads_only_where_written
from glue.scheduler.plan import schedule
from glue.testing import programs


def plan_for(fn, *args, donated=()):
    return schedule(glue.make_ir(fn)(*args).graph, donated)


def arena_conflicts(plan):
    """Pairs of arena values alive at the same time whose bytes overlap (in-place pairs aside)."""
    mem = plan.memory
    arena = [(vid, p) for vid, p in mem.placements.items() if p.kind == "arena"]
    in_place = set()
    for k, kernel in enumerate(plan.kernels):
        for i, inp in enumerate(kernel.inputs):
            for o, out in enumerate(kernel.outputs):
                if reads_only_where_written(kernel, i, o) and mem.lifetimes.get(inp.value_id, (0, -1))[1] == k:
                    in_place.add((inp.value_id, out.value_id))
    bad = []
    for a, (va, pa) in enumerate(arena):
        for vb, pb in arena[a + 1:]:
            (sa, ea), (sb, eb) = mem.lifetimes[va], mem.lifetimes[vb]
            live_together = sa <= eb and sb <= ea
            overlap = pa.slot < pb.slot + pb.type.nbytes and pb.slot < pa.slot + pa.type.nbytes
            if live_together and overlap and (va, vb) not in in_place and (vb, va) not in in_place:
                bad.append((va, vb))
    return bad


def test_a_long_chain_needs_far_less_than_one_buffer_per_value():
    def chain(x):
        for _ in range(12):
            x = nn.softmax(x, axis=0) * 2.0  # column softmax: each step is its own kernel
            x = nn.softmax(x, axis=1)
        return x

    x = np.ones((64, 64), np.float32)
    plan = plan_for(chain, x)
    mem = plan.memory.analysis()
    assert len(plan.kernels) >= 12
    assert mem["peak_bytes"] * 4 < mem["naive_bytes"], plan.as_text("memory")
    assert mem["arena_bytes"] <= 2 * x.nbytes + 4096  # two live activations and small row buffers
    assert not arena_conflicts(plan)


def test_donated_argument_holds_the_output():
    x = np.ones((32, 32), np.float32)
    plan = plan_for(lambda x: nn.softmax(x, axis=-1), x, donated=(0,))
    (out,) = [p for p in plan.memory.placements.values() if p.kind in ("output", "donated")]
    assert out.kind == "donated" and plan.memory.analysis()["output_bytes"] == 0


def test_memory_analysis_fields():
    plan = plan_for(lambda x, y: (x * y).sum(axis=0), np.ones((8, 4), np.float32), np.ones((8, 4), np.float32))
    mem = plan.memory.analysis()
    assert set(mem) == {"peak_bytes", "naive_bytes", "arena_bytes", "argument_bytes", "output_bytes"}
    assert mem["argument_bytes"] == 2 * 8 * 4 * 4 and mem["output_bytes"] == 4 * 4


@settings(max_examples=60)
@given(programs(max_eqns=12))
def test_no_two_live_arena_buffers_overlap(graph):
    plan = schedule(graph)
    assert not arena_conflicts(plan), plan.as_text("memory")


def _adam_state_update(g, p, m, v):
    m = 0.9 * m + 0.1 * g
    v = 0.99 * v + 0.01 * g * g
    return p - 0.01 * m / (glue.numpy.sqrt(v) + 1e-8), m, v


def _layers_update(x, dy, ps, ms, vs):
    """Bias gradients (column sums) with their updates fused after them, for several
    same-sized biases: each update's donors are all three of its kernel's old values."""
    new = [_adam_state_update((dy * (x + p)).sum(axis=0), p, m, v) for p, m, v in zip(ps, ms, vs)]
    return [n[0] for n in new], [n[1] for n in new], [n[2] for n in new]


def test_a_training_steps_state_comes_back_in_its_own_donated_buffers():
    """Every new p, m and v takes the donor at its own position (a loop then calls with the
    same addresses every time), none a fresh buffer, none another position's."""
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    state = [[rng.standard_normal(32).astype(np.float32) for _ in range(3)] for _ in range(3)]
    closed = glue.make_ir(_layers_update)(x, dy, *state)
    n = len(closed.graph.invars)
    plan = schedule(closed.graph, tuple(range(2, n)))
    results = plan.results()
    assert [r.kind for r in results] == ["donated"] * (n - 2), plan.as_text("memory")
    assert [r.slot for r in results] == list(range(len(closed.graph.constvars) + 2, len(closed.graph.constvars) + n))
    assert plan.memory.spare_donors == ()


def test_donors_are_matched_where_taking_them_in_order_would_leave_an_output_without():
    """Output a' may take only b's buffer (it reads a transposed), b' either: in output order
    a greedy choice could give b' the only donor a' can use; the matching gives both one."""
    from glue.scheduler.memory import _matching

    assert _matching({"a'": ["b"], "b'": ["b", "a"]}) == {"a'": "b", "b'": "a"}
    assert _matching({"b'": ["b", "a"], "a'": ["b"]}) == {"a'": "b", "b'": "a"}
    assert _matching({"x": ["d"], "y": ["d"]}) in ({"x": "d"}, {"y": "d"})
    chain = {f"o{i}": [f"d{i}", f"d{i + 1}"] for i in range(200)}  # a long augmenting path
    chain["o200"] = ["d0"]
    assert len(_matching(dict(reversed(list(chain.items()))))) == 201


def test_a_row_store_does_not_take_an_input_its_element_stores_read():
    """t = a row's sum is stored once per row, by one thread, while the row's other threads
    may still be storing x * s / t: t must not write over s (of t's size, read at the row)."""
    def f(x, s):
        t = x.sum(axis=1)
        return x * s[:, None] / t[:, None], t

    plan = plan_for(f, np.ones((64, 512), np.float32), np.ones(64, np.float32))
    (kernel,) = plan.kernels
    assert {st.level for st in kernel.stores} == {"element", "row"}, str(kernel)
    s_slot = next(i for i, b in enumerate(kernel.inputs) if b.type.shape == (64,))
    row_out = next(st.output for st in kernel.stores if st.level == "row")
    assert not reads_only_where_written(kernel, s_slot, row_out)


def test_no_output_takes_another_outputs_own_donor():
    """The new a could write over b (it reads b only where it writes), but b is the new b's
    own donor: it comes back fresh instead, and the new c (read transposed by the new b, so
    not in place) too; each keeps its own donor spare, none sits at another's position. In a
    GPT-style step, outputs taking each other's donors made chains (p' over m, m' over v, ...)
    whose addresses cycled from call to call, and no CUDA graph replayed."""
    def rotating(a, b, c):
        return b * 2.0, a.T + c.T, c * 0.5

    x = np.ones((32, 32), np.float32)
    plan = plan_for(rotating, x, x, x, donated=(0, 1, 2))
    results = plan.results()
    assert [(r.kind, r.slot) for r in results] == [("output", 0), ("donated", 1), ("output", 1)], \
        plan.as_text("memory")
    assert plan.memory.spare_donors == (0, 2)


def _smallest_gap(extents, size):
    """The packer's rule, one extent at a time: over the busy extents by start, the smallest gap
    of at least `size` below or between them (the lowest of equal ones), else past them all."""
    best, smallest, cursor = None, 0, 0
    for lo, hi in sorted(extents):
        gap = lo - cursor
        if gap >= size and (best is None or gap < smallest):
            best, smallest = cursor, gap
        cursor = max(cursor, hi)
    return cursor if best is None else best


@given(extents=st.lists(st.tuples(st.integers(0, 64), st.integers(1, 16)), max_size=24),
       size=st.integers(1, 24))
def test_best_fit_takes_the_smallest_gap_that_fits(extents, size):
    """`_best_fit` (NumPy, the packer's inner loop) against the rule written as a loop, over
    busy extents that overlap, nest, touch and repeat."""
    busy = [(lo, lo + length) for lo, length in extents]
    lo, hi = (np.array([e[i] for e in busy], np.int64) for i in (0, 1))
    assert _best_fit(lo, hi, size) == _smallest_gap(busy, size)
