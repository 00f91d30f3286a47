"""The memory plan: arena packing, liveness, in-place reuse and donation."""
import numpy as np
from hypothesis import given, settings

import glue
import glue.nn as nn
from glue.scheduler.memory import reads_only_where_written
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
