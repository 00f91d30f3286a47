"""Streams, CUDA graphs and the lean call path on a GPU (every test is marked `cuda`): replayed
graphs and direct multi-stream launches both match the reference, independent branches run on
two streams, a donated input's buffer holds the output, a training loop replays its graph, and
`glue.profile` shows each stream's kernels."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.ir import dtypes as dt
from glue.testing.strategies import graph_inputs, programs
from tests.backend_cuda.cases import assert_matches_reference

pytestmark = pytest.mark.cuda
EXAMPLES = int(os.environ.get("GLUE_CUDA_EXAMPLES", "200")) // 2


@given(st.data())
@settings(max_examples=EXAMPLES, deadline=None)
def test_replayed_graphs_and_direct_launches_match_the_reference(data):
    graph = data.draw(programs(dtypes=(dt.float32, dt.int32, dt.bfloat16), max_eqns=12, max_side=6))
    inputs = [device_put(a).buffer for a in data.draw(graph_inputs(graph))]
    streams = data.draw(st.sampled_from([1, 4]), label="streams")
    exe = CudaBackend().lower(graph, name="random", streams=streams).compile()
    exe.poison = 0xFF
    exe.use_graphs = False
    assert_matches_reference(graph, inputs, exe(*inputs), "direct launches")
    exe.use_graphs = True
    for n in range(4):  # the outputs alternate between two addresses: two captures, two replays
        assert_matches_reference(graph, inputs, exe(*inputs), f"graph call {n}")
    if exe._steps:
        assert exe.graph_stats.captures >= 1 and exe.graph_stats.replays >= 1


def device_put(x):
    return glue.device_put(x, "cuda")


def _branches(a, b):
    return gnp.tanh(a @ a).sum(axis=1), gnp.exp(b).sum(axis=0)


def test_independent_branches_run_on_two_streams_and_replay():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((32, 128)).astype(np.float32)
    f = glue.jit(_branches, backend="cuda", backend_options={"streams": 2})
    da, db = device_put(a), device_put(b)
    for _ in range(5):
        out = f(da, db)
    exe = next(iter(f._compiled.values())).executable
    assert len(exe.streams) == 2
    assert exe.graph_stats.replays >= 2 and exe.graph_stats.captures <= 3
    np.testing.assert_allclose(np.asarray(out[0]), np.tanh(a.astype(np.float64) @ a).sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out[1]), np.exp(b.astype(np.float64)).sum(0), rtol=1e-5)


def test_numpy_inputs_are_uploaded_and_each_call_sees_its_own_values():
    f = glue.jit(_branches, backend="cuda")
    rng = np.random.default_rng(1)
    for _ in range(4):
        a = rng.standard_normal((16, 16)).astype(np.float32)
        b = rng.standard_normal((8, 16)).astype(np.float32)
        got = f(a, b)
        np.testing.assert_allclose(np.asarray(got[1]), np.exp(b.astype(np.float64)).sum(0), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(got[0]), np.tanh(a.astype(np.float64) @ a).sum(1),
                                   rtol=1e-4, atol=1e-4)


def test_a_donated_input_buffer_holds_the_output():
    f = glue.jit(lambda x: gnp.tanh(x) * 2.0, backend="cuda", donate_argnums=0)
    host = np.linspace(-2, 2, 4096, dtype=np.float32)
    x = device_put(host)
    ptr = x.device_buffer.ptr
    y = f(x)
    assert y.device_buffer.ptr == ptr
    np.testing.assert_allclose(np.asarray(y), np.tanh(host) * 2, rtol=2e-6, atol=1e-6)


def _loss(ws, x, y):
    h = x
    for w in ws:
        h = gnp.tanh(h @ w)
    return ((h - y) ** 2).mean()


def _sgd(ws, x, y):
    loss, gs = glue.value_and_grad(_loss)(ws, x, y)
    return [w - 0.1 * g for w, g in zip(ws, gs)], loss


@pytest.mark.parametrize("donate", [False, True])
def test_a_training_loop_replays_its_graph_and_matches_the_reference(donate):
    rng = np.random.default_rng(2)
    ws0 = [(rng.standard_normal((32, 32)) * 0.2).astype(np.float32) for _ in range(3)]
    x, y = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32)
    step = glue.jit(_sgd, backend="cuda", donate_argnums=(0,) if donate else ())
    ref = glue.jit(_sgd, backend="reference")
    ws, want = [device_put(w) for w in ws0], list(ws0)
    dx, dy = device_put(x), device_put(y)
    for _ in range(6):
        ws, loss = step(ws, dx, dy)
        want, want_loss = ref(want, x, y)
    for got, w in zip(ws, want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-4)
    exe = next(iter(step._compiled.values())).executable
    stats = exe.graph_stats
    assert stats.replays >= 3 and stats.captures <= 3, stats  # the loss alternates between two blocks
    assert exe.dependent_launches > 0  # its chain of kernels launches early on sm_90


def _scaled_step(w, lr, t, bias):
    return w - lr * gnp.tanh(w @ w) / t + bias


def test_host_scalars_that_change_every_call_still_replay_the_graphs():
    """An optimizer step's learning rate and step count arrive as host values each call: they
    are copied into buffers the executable keeps, so the addresses (and the graphs) repeat."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    bias = np.zeros(64, np.float32)
    step = glue.jit(_scaled_step, backend="cuda", donate_argnums=(0,))
    ref = glue.jit(_scaled_step, backend="reference")
    w, want = device_put(w0), w0
    for t in range(1, 9):
        lr, bias = np.float32(0.5 / t), bias + np.float32(0.01 * t)
        w = step(w, lr, np.float32(t), bias)
        want = ref(want, lr, np.float32(t), bias)
    np.testing.assert_allclose(np.asarray(w), np.asarray(want), rtol=1e-4, atol=1e-5)
    stats = next(iter(step._compiled.values())).executable.graph_stats
    assert stats.replays >= 5 and stats.direct == 0, stats


def _rotating(a, b, c):
    return b * 2.0, gnp.transpose(c) + gnp.transpose(a), c * 0.5


def test_outputs_that_cannot_take_their_own_donor_come_back_fresh_and_the_loop_replays():
    """The new a could take b's buffer, but that is the new b's own; no output takes another's
    own donor (a chain of such would make the addresses cycle with a long period), so the new a
    comes back fresh, and so does the new c, which the new b reads. Their own donors are spare:
    each call frees the previous call's output block, the blocks alternate, and from the third
    call on the graphs replay."""
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(3))
    f = glue.jit(_rotating, backend="cuda", donate_argnums=(0, 1, 2))
    got, want = [device_put(v) for v in (a, b, c)], (a, b, c)
    for _ in range(8):
        got = f(*got)
        want = (want[1] * 2.0, want[2].T + want[0].T, want[2] * 0.5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)
    exe = next(iter(f._compiled.values())).executable
    assert [r.kind for r in exe.program.results] == ["output", "donated", "output"], exe.program.plan.as_text("memory")
    assert exe.graph_stats.replays >= 4 and exe.graph_stats.direct == 0, exe.graph_stats


def test_a_donated_host_value_is_not_overwritten_by_the_next_call():
    f = glue.jit(lambda x, y: (x * 2.0, y + 1.0), backend="cuda", donate_argnums=(0,))
    first = f(np.full(16, 1.0, np.float32), np.float32(1.0))
    second = f(np.full(16, 5.0, np.float32), np.float32(7.0))
    np.testing.assert_array_equal(np.asarray(first[0]), np.full(16, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(second[0]), np.full(16, 10.0, np.float32))
    assert float(first[1]) == 2.0 and float(second[1]) == 8.0


def test_profile_shows_the_kernels_of_each_stream(tmp_path):
    f = glue.jit(_branches, backend="cuda", backend_options={"streams": 2})
    a, b = np.ones((64, 64), np.float32), np.ones((32, 128), np.float32)
    path = tmp_path / "trace.json"
    with glue.profile(str(path)):
        for _ in range(2):
            out = f(a, b)
        np.asarray(out[0])
    trace = json.loads(path.read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"
              and e["pid"] == 2}
    kernels = [e for e in trace if e["ph"] == "X" and e["cat"] == "kernel"]
    assert len(kernels) == 2 * len(next(iter(f._compiled.values())).kernels)
    assert {tracks[e["tid"]] for e in kernels} == {"compute 0", "compute 1"}
    copies = [e for e in trace if e["ph"] == "X" and e["cat"] == "copy" and e["pid"] == 2]
    # a and b, each call: small host values are copied in on the program's stream (staged)
    assert {tracks[e["tid"]] for e in copies} == {"compute 0", "copy d2h"}
    assert len([e for e in copies if e["name"].startswith("upload")]) == 2 * 2
    assert all(e["dur"] > 0 for e in kernels)
    host = {e["cat"] for e in trace if e["ph"] == "X" and e["pid"] == 1}
    assert {"compile", "call", "copy"} <= host
    calls = [e for e in trace if e.get("cat") == "call"]
    first_kernel = min(e["ts"] for e in kernels)
    assert calls[0]["ts"] <= first_kernel  # the device time base lines up with the host's


def test_a_call_records_no_event_until_its_result_is_waited_for():
    f = glue.jit(lambda x: x * 3.0, backend="cuda")
    x = device_put(np.arange(8, dtype=np.float32))
    y = f(x)
    assert y.device_buffer.event is None
    z = f(y)  # the same stream: ordered without an event
    assert y.device_buffer.event is None
    np.testing.assert_array_equal(np.asarray(z), np.arange(8) * 9)
    assert z.device_buffer.event is not None and z.device_buffer.is_ready()


def test_outputs_reuse_their_programs_blocks():
    f = glue.jit(lambda x: (x + 1.0, x * 2.0), backend="cuda")
    x = device_put(np.ones(1000, np.float32))
    first = f(x)
    ptr = first[0].device_buffer.ptr
    del first
    again = f(x)
    assert again[0].device_buffer.ptr == ptr
    np.testing.assert_array_equal(np.asarray(again[1]), np.full(1000, 2.0, np.float32))


def test_a_failed_capture_falls_back_to_direct_launches(monkeypatch, caplog):
    from glue.backend_cuda import executor
    from glue.backend_cuda.runtime.driver import CudaError

    def refuse(stream, enqueue):
        raise CudaError("cuStreamBeginCapture", 900)

    monkeypatch.setattr(executor, "capture", refuse)
    f = glue.jit(_branches, backend="cuda", backend_options={"streams": 2})
    a, b = np.ones((8, 8), np.float32), np.ones((4, 8), np.float32)
    with caplog.at_level("WARNING", logger="glue"):
        out = f(a, b)
        out = f(a, b)
    stats = next(iter(f._compiled.values())).executable.graph_stats
    assert stats.direct == 2 and stats.captures == 0
    assert "cannot be captured" in caplog.text
    np.testing.assert_allclose(np.asarray(out[1]), np.full(8, 4 * np.e, np.float32), rtol=1e-6)


def test_two_threads_calling_while_graphs_are_captured():
    import threading

    x = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)  # staged uploads
    fns = [glue.jit(lambda v, k=k: (gnp.tanh(v * k).sum(axis=0), gnp.exp(v).sum(axis=1)), backend="cuda")
           for k in (1.0, 2.0)]
    got, errors = {}, []

    def work(i):
        try:
            for n in range(20):
                out = fns[i](device_put(x) if n % 2 else x)
            got[i] = np.asarray(out[0])
        except Exception as exc:  # reported below, in the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, k in enumerate((1.0, 2.0)):
        np.testing.assert_allclose(got[i], np.tanh(x.astype(np.float64) * k).sum(0), rtol=1e-5, atol=1e-5)
