"""The lean call of a jitted function on the cuda backend (no GPU needed: the driver is a stub,
tests/backend_cuda/stub_driver.py, so these test what the host does, not the values).

A loop's cached call runs Jitted.__call__, the program's lean call, the executable's and its
replay, and one graph launch (and one copy of its host scalars, if it passes any); donated
arguments are deleted as on the usual path. A program of one argument takes a loop's call
passing one Array of its argument type object to the one-argument path (`lean_one`,
`lean_call_one`), which hands any other call to the lean call's lists. Every call the lean call cannot serve
as the usual call would takes the usual path, which these tests check case by case (an Array
passed twice, a donated scalar, changed arguments, host values, profiling, debug timing,
poisoning, graphs off, an argument written elsewhere, a result waited for, a trace, ...), and
a property compares donated steps with and without the lean call."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import glue
from glue.backend_cuda.executor import GRAPH_CACHE
from glue.backend_cuda.runtime.device_array import OutputSets
from glue.ir import TensorType
from glue.settings import config
from glue.testing.host import traced
from tests.backend_cuda import stub_driver

LEAN = {"Jitted.__call__", "_lean_call.<locals>.replay"}  # (the replay runs on no other path)
ONE = {"_lean_call.<locals>.lean_one", "_lean_call.<locals>.lean_call_one"}  # the one-argument path
LISTS = {"_lean_call.<locals>.lean", "_lean_call.<locals>.lean_call"}  # the lean call's lists
GENERAL = "CudaExecutable.__call__"
# Bytecodes of glue's own a cached tiny call may run (CPython 3.11 ran 489 on the usual path
# and runs 220 on the lean one; later versions run fewer): a guard against the lean path
# growing back, not a measurement.
MAX_OPCODES = 240


@pytest.fixture
def stub():
    with stub_driver.installed() as driver:
        yield driver


def device(x):
    return glue.device_put(np.asarray(x, np.float32), "cuda")


def executable(f):
    (compiled,) = f._compiled.values()
    return compiled.executable


def warm_loop(f, z, calls=4):
    """`z = f(z)` a few times: the loop's two output sets are known by then."""
    for _ in range(calls):
        z = f(z)
    return z


def runs_lean(call):
    """(the result of `call()`, whether the lean call served it: a lean call that finds it cannot
    serve a call has done nothing, and the usual path runs after it)."""
    result, names, _ = traced(call)
    return result, LEAN <= names and GENERAL not in names and "Jitted._call" not in names


def test_a_loop_call_is_three_frames_and_one_graph_launch(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    launches, replays = stub.calls["cuGraphLaunch"], exe.graph_stats.replays
    before = dict(stub.calls)
    z, names, opcodes = traced(lambda: add(z))
    assert isinstance(z, glue.Array) and z.shape == (16,) and z.aval is add._latest[0]._avals[0]
    assert LEAN <= names and GENERAL not in names and "Jitted._call" not in names
    assert ONE <= names and not LISTS & names
    assert opcodes <= MAX_OPCODES, f"{opcodes} bytecodes in glue for a cached tiny call"
    # one graph launch and no other driver call
    assert stub.calls["cuGraphLaunch"] == launches + 1
    assert {k: v for k, v in stub.calls.items() if k != "cuGraphLaunch"} == \
        {k: v for k, v in before.items() if k != "cuGraphLaunch"}
    assert exe.graph_stats.replays == replays + 1
    # the loop alternates between two output sets, and keeps doing so lean
    seen = set()
    for _ in range(6):
        argument = z
        z, lean = runs_lean(lambda: add(z))
        assert lean and z._device is not argument._device  # (not the set the argument holds)
        seen.add(z._device.ptr)
        del argument
    assert len(seen) == 2 and exe.graph_stats.captures == 2


def test_a_kept_result_and_a_fixed_argument_alternate_lean(stub):
    mul = glue.jit(lambda v: v * 2, backend="cuda")
    x = device(np.ones(8))
    y = mul(x)
    for _ in range(3):
        y = mul(x)  # y holds one set while the next call takes the other
    for _ in range(4):
        held = y
        y, lean = runs_lean(lambda: mul(x))
        assert lean and y._device is not held._device  # the set y holds is not taken


def test_a_calls_outputs_are_held_before_it_lets_the_lock_go(stub):
    """Another call (another thread's) coming in as soon as this one lets the enqueue lock go,
    before the caller's Arrays hold the outputs, finds them taken: here a call of the usual
    path while the graph launches, then two lean calls in a row."""
    two = glue.jit(lambda v: (v + 1, v * 2), backend="cuda")
    z = device(np.ones(16))
    for _ in range(4):
        z, _ = two(z)
    exe, nested = executable(two), []

    def another_call():
        del stub.hooks["cuGraphLaunch"]
        nested.append(exe(z._device)[0])

    for call, lean in ((lambda: two(z)[0]._device, True), (lambda: exe(z._device)[0], False)):
        stub.hooks["cuGraphLaunch"] = another_call
        out, names, _ = traced(call)
        assert ("Jitted._call" not in names and LEAN <= names) == lean  # (the lean call, then the usual)
        assert out is not nested.pop() and out is not z._device
    # what the lean call returns holds its set: a call right after it takes another, or none
    first, second = exe.lean_call([z._device]), exe.lean_call([z._device])
    assert first and (second is None or not {id(b) for b in first} & {id(b) for b in second})


def test_what_the_one_argument_path_declines_takes_the_lists_or_the_usual_path(stub, tmp_path):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    # an Array of an equal type, another object: the lists check it, and serve it
    z.aval = TensorType(z.aval.shape, z.aval.dtype)
    z, names, _ = traced(lambda: add(z))
    assert LEAN <= names and LISTS <= names and "_lean_call.<locals>.lean_call_one" not in names
    z, names, _ = traced(lambda: add(z))  # (its result has the program's type object)
    assert LEAN <= names and ONE <= names and not LISTS & names
    # another shape: the lists decline, and the usual path compiles it
    _, names, _ = traced(lambda: add(device(np.ones(8))))
    assert "_lean_call.<locals>.lean" in names and "Jitted._call" in names
    z = warm_loop(add, z)
    # a profile open: the backend declines, having launched nothing
    launches = stub.calls["cuGraphLaunch"]
    with glue.profile(str(tmp_path / "trace.json")):
        z, names, _ = traced(lambda: add(z))
    assert ONE <= names and "_lean_call.<locals>.replay" not in names and GENERAL in names
    assert stub.calls["cuGraphLaunch"] == launches
    z = warm_loop(add, z)
    # a deleted Array: the backend declines, and the usual path says where it went
    kept = z
    glue.jit(lambda v: v * 3, backend="cuda", donate_argnums=0)(z)
    launches = stub.calls["cuGraphLaunch"]
    assert kept.is_deleted and exe.lean_call_one(kept._device) is None
    with pytest.raises(glue.GlueError, match="donated to"):
        add(kept)
    assert stub.calls["cuGraphLaunch"] == launches
    # a host scalar: the lists copy it into its slot
    double = glue.jit(lambda s: s * 2.0, backend="cuda")
    for _ in range(4):
        double(np.float32(1.5))
    copies = stub.calls["cuMemcpyHtoDAsync"]
    _, names, _ = traced(lambda: double(np.float32(2.5)))
    assert LEAN <= names and LISTS <= names and stub.calls["cuMemcpyHtoDAsync"] == copies + 1


def test_donation_constants_and_more_arguments_take_the_lists(stub):
    donating = glue.jit(lambda v: v + 1, backend="cuda", donate_argnums=0)
    z = warm_loop(donating, device(np.ones(16)))
    old = z
    z, names, _ = traced(lambda: donating(z))
    assert LEAN <= names and LISTS <= names and not ONE & names and old.is_deleted
    w = device(np.ones(16))
    scaled = glue.jit(lambda v: v * w, backend="cuda")  # w is a captured constant
    z = warm_loop(scaled, z)
    z, names, _ = traced(lambda: scaled(z))
    assert LEAN <= names and LISTS <= names and not ONE & names
    pair = glue.jit(lambda a, b: a + b, backend="cuda")
    z = warm_loop(lambda v: pair(v, w), z)
    assert executable(pair).lean_call_one is None
    z, names, _ = traced(lambda: pair(z, w))
    assert LEAN <= names and LISTS <= names and not ONE & names


def test_lists_in_and_pytrees_out(stub):
    def step(ws, x):
        return [w - 0.5 * (x * w) for w in ws], {"loss": (x * 2).sum()}

    f = glue.jit(step, backend="cuda")
    ws, x = [device(np.ones((4, 4))) for _ in range(3)], device(np.ones((4, 4)))
    for _ in range(4):
        ws, out = f(ws, x)
    (ws, out), lean = runs_lean(lambda: f(ws, x))
    assert lean and isinstance(ws, list) and len(ws) == 3 and set(out) == {"loss"}
    assert out["loss"].shape == () and all(w.shape == (4, 4) for w in ws)
    # a list of another length or a tuple in its place is another signature
    _, lean = runs_lean(lambda: f(ws[:2], x))
    assert not lean
    _, lean = runs_lean(lambda: f(tuple(ws), x))
    assert not lean


def _sgd(ws, ms, x, lr):
    """A training step's shape: lists of weights and momenta (donated), an input, a scalar."""
    ms = [0.9 * m + w * x for m, w in zip(ms, ws)]
    return [w - lr * m for w, m in zip(ws, ms)], ms, (x * x).sum()


def _sgd_state(n=3):
    return [device(np.ones(16)) for _ in range(n)], [device(np.zeros(16)) for _ in range(n)], device(np.ones(16))


def test_a_donated_step_is_one_graph_launch_and_one_copy_of_its_scalars(stub):
    f = glue.jit(_sgd, backend="cuda", donate_argnums=(0, 1))
    ws, ms, x = _sgd_state()
    for t in range(4):
        ws, ms, loss = f(ws, ms, x, np.float32(0.1 / (t + 1)))
    exe = executable(f)
    before = dict(stub.calls)
    old_ws, old_buffers = ws, [w._device for w in ws]
    (ws, ms, loss), names, opcodes = traced(lambda: f(ws, ms, x, np.float32(0.01)))
    assert LEAN <= names and GENERAL not in names and "Jitted._call" not in names
    # one graph launch, one copy of the scalars, nothing else
    assert {k: stub.calls[k] - before.get(k, 0) for k in stub.calls if stub.calls[k] != before.get(k, 0)} == \
        {"cuGraphLaunch": 1, "cuMemcpyHtoDAsync": 1}
    assert exe.graph_stats.replays > 0
    # donated as the usual path donates: the Arrays deleted, their buffers results in place
    assert all(w.is_deleted for w in old_ws) and not any(w.is_deleted for w in ws)
    donated_in_place = {id(b) for b in old_buffers} & {id(w._device) for w in ws + ms}
    assert donated_in_place and all(b.event is None and b.written_on is b.waited_on is exe.stream for b in old_buffers)
    with pytest.raises(glue.GlueError, match="donated to"):
        f(old_ws, ms, x, np.float32(0.01))
    # the scalar went through its slot: a float of another class is another hot layout
    _, lean = runs_lean(lambda: f(ws, ms, x, 0.01))
    assert not lean


def test_an_array_at_a_donated_position_and_another_is_copied_on_the_usual_path(stub):
    f = glue.jit(lambda a, b: (a * 2, b + 1), backend="cuda", donate_argnums=0)
    a, b = device(np.ones(16)), device(np.ones(16))
    for _ in range(4):
        a, b = f(a, b)
    _, lean = runs_lean(lambda: f(a, b))
    assert lean
    z = device(np.ones(16))
    (p, q), lean = runs_lean(lambda: f(z, z))
    assert not lean and z.is_deleted and p._device is not q._device


def test_a_donated_scalar_takes_the_usual_path(stub):
    f = glue.jit(lambda v, s: (v * s, s + 1.0), backend="cuda", donate_argnums=1)
    v = device(np.ones(16))
    for _ in range(4):
        v, _ = f(v, np.float32(2.0))
    _, lean = runs_lean(lambda: f(v, np.float32(2.0)))
    assert not lean


@settings(max_examples=15)
@given(st.lists(st.sampled_from(["feed", "keep", "wait", "fresh", "deleted", "twice", "host", "float"]),
                min_size=3, max_size=14))
def test_donated_lean_calls_do_what_the_usual_path_does(actions):
    """A donated step run through a sequence of calls, with the lean call and without it (every
    call on the usual path): the same errors, the same results (types, which results hold a
    donated argument's buffer), the same Arrays deleted; and in both, a call's results never
    share memory with an Array the test still holds."""
    jit_module = sys.modules["glue.frontend.jit"]

    def run(lean):
        log, held = [], []
        with pytest.MonkeyPatch.context() as m, stub_driver.installed():
            if not lean:
                m.setattr(jit_module, "_lean_call", lambda *args: None)
            usual = jit_module.Jitted._call
            m.setattr(jit_module.Jitted, "_call", lambda *a: log.append("usual") or usual(*a))
            f = glue.jit(_sgd, backend="cuda", donate_argnums=(0, 1))
            ws, ms, x = _sgd_state(2)
            previous = ws
            for action in ["feed"] * 4 + actions:  # (the third and fourth lean)
                args = [ws, ms, x, np.float32(0.5)]
                if action == "fresh":
                    args[0] = [device(np.ones(16))] + ws[1:]
                elif action == "deleted":
                    args[0] = previous
                elif action == "twice":
                    args[0] = [ws[0], ws[0]]
                elif action == "host":
                    args[2] = np.ones(16, np.float32)
                elif action == "float":
                    args[3] = 0.5
                passed = [a for a in args[0] + args[1] + [args[2]] if isinstance(a, glue.Array)]
                # the donated Arrays' buffers, held until the results are compared (a freed
                # buffer's id may be a new result's)
                donated = [(i, a._device) for i, a in enumerate(args[0] + args[1]) if not a.is_deleted]
                try:
                    out = f(*args)
                except glue.GlueError as err:
                    log.append(("error", str(err).split(" (argument")[0][:60]))
                    continue
                results = out[0] + out[1] + [out[2]]
                log.append((action, [str(r.aval) for r in results],
                            [max((i for i, buffer in donated if buffer is r._device), default=-1) for r in results],
                            [a.is_deleted for a in passed]))
                live = [a for a in held + [x] if not a.is_deleted]
                assert not {r._device.ptr for r in results} & {a._device.ptr for a in live}
                if action == "wait":
                    out[2].block_until_ready()
                if action == "keep":
                    held += results
                previous = args[0]
                ws, ms = out[0], out[1]
        return log

    with_lean, without = run(True), run(False)
    assert [e for e in with_lean if e != "usual"] == [e for e in without if e != "usual"]
    assert with_lean.count("usual") < without.count("usual") == len(actions) + 4


def test_other_arguments_take_the_usual_path(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    for other in (np.ones(16, np.float32),                 # a host value: uploaded
                  glue.Array(np.ones(16, np.float32)),     # a host Array
                  device(np.ones(8)),                      # another shape: another program
                  1.0):                                    # a scalar
        _, lean = runs_lean(lambda: add(other))
        assert not lean
    _, lean = runs_lean(lambda: add(v=z))  # keywords
    assert not lean
    z, lean = runs_lean(lambda: add(z))  # (the latest program, of the keyword call, has no lean call)
    assert not lean
    z, lean = runs_lean(lambda: add(z))
    assert lean


def test_an_argument_written_elsewhere_is_waited_for_first(stub):
    add = glue.jit(lambda a, b: a + b, backend="cuda")
    a = device(np.ones(16))
    z = a
    for _ in range(4):
        z = add(a, z)
    fresh = device(np.ones(16))  # uploaded on the copy stream: stream 0 must wait for it
    waits = stub.calls["cuStreamWaitEvent"]
    _, lean = runs_lean(lambda: add(fresh, z))
    assert not lean and stub.calls["cuStreamWaitEvent"] == waits + 1
    for _ in range(3):
        z = add(fresh, z)
    z, lean = runs_lean(lambda: add(fresh, z))  # ordered on stream 0 now
    assert lean and stub.calls["cuStreamWaitEvent"] == waits + 1


def test_a_result_waited_for_is_pending_again_when_its_set_is_reused(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    for _ in range(4):
        z.block_until_ready()  # records an event after the write
        assert z._device.event is not None
        z, lean = runs_lean(lambda: add(z))
        assert lean and z._device.event is None and z._device.waited_on is z._device.stream
    records = stub.calls["cuEventRecord"]
    z.block_until_ready()
    assert stub.calls["cuEventRecord"] == records + 1  # a new event, after this call's write


def test_profiling_debug_timing_and_reference_checks_take_the_usual_path(stub, tmp_path):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    direct = exe.graph_stats.direct
    with glue.profile(str(tmp_path / "trace.json")):
        z, lean = runs_lean(lambda: add(z))
    assert not lean and exe.graph_stats.direct == direct + 1  # launched kernel by kernel, timed
    z = warm_loop(add, z)
    compiled = add._latest[0]
    compiled.debug = 1
    z, lean = runs_lean(lambda: add(z))
    assert not lean
    compiled.debug = 0
    z = warm_loop(add, z)
    _, lean = runs_lean(lambda: add(z))
    assert lean
    compiled.check = True  # (the stub computes nothing to compare: the lean call is off)
    assert compiled.lean((z,), None) is None
    compiled.check = False
    assert compiled.lean((z,), None) is not None


def test_poisoning_and_graphs_off_take_the_usual_path(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    exe.poison = 0xFF
    fills = stub.calls["cuMemsetD8Async"]
    for _ in range(3):
        z, lean = runs_lean(lambda: add(z))
        assert not lean
    assert stub.calls["cuMemsetD8Async"] > fills
    exe.poison = None
    z = warm_loop(add, z)
    exe.use_graphs = False
    for _ in range(3):
        z, lean = runs_lean(lambda: add(z))
        assert not lean
    with config.override(cuda_graphs=False):
        off = glue.jit(lambda v: v - 1, backend="cuda")
        y = warm_loop(off, z)
    for _ in range(3):
        y, lean = runs_lean(lambda: off(y))
        assert not lean
    assert executable(off).graph_stats.replays == 0


def test_a_set_let_go_or_a_graph_evicted_is_forgotten(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    assert exe._lean

    def remembered_sets_are_held_by_the_output_sets():
        for candidates in exe._lean.values():
            for outputs, block, graph, key in candidates:
                assert any(outputs is s for s in exe._outputs.sets) and key in exe._graphs

    kept = []
    for _ in range(2 * OutputSets.KEEP):  # every set held: new ones, and the oldest let go
        kept.append(add(z))
        remembered_sets_are_held_by_the_output_sets()


def test_a_graph_evicted_is_forgotten(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    exe = executable(add)
    remembered = [key for candidates in exe._lean.values() for *_, key in candidates]
    inputs = [device(np.ones(16)) for _ in range(GRAPH_CACHE)]  # new addresses: captured, evicting
    for x in inputs:
        add(x)
    assert exe.use_graphs and not set(remembered) <= set(exe._graphs)
    for candidates in exe._lean.values():
        for *_, key in candidates:
            assert key in exe._graphs
    z, lean = runs_lean(lambda: add(z))
    assert not lean  # its graph was evicted: captured again
    z = warm_loop(add, z)
    z, lean = runs_lean(lambda: add(z))
    assert lean


def test_an_argument_of_another_type_at_a_remembered_address_takes_the_usual_path(stub):
    """An entry is keyed by addresses alone; the types are the frontend's to check."""
    neg16, add = glue.jit(lambda v: -v, backend="cuda"), glue.jit(lambda v: v + 1, backend="cuda")
    x = neg16(device(np.ones(16)))  # a program's output: written on stream 0
    add(x), add(x)
    assert any(key[0] == x._device.ptr for key in executable(add)._lean)
    address, neg8, x8 = x._device.ptr, glue.jit(lambda v: -v, backend="cuda"), device(np.ones(8))
    del neg16, x  # the program lets its sets go, and x's block goes back to the allocator
    y = neg8(x8)  # float32[8] at the same address, ordered on stream 0
    assert y._device.ptr == address and y._device.waited_on is y._device.stream
    y, lean = runs_lean(lambda: add(y))
    assert not lean and y.shape == (8,)


def test_a_block_another_stream_used_goes_back_to_the_allocator(stub, monkeypatch):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    z._device.prepare_for(z._device.stream.ctx.compute_streams(2)[1])  # work on another stream reads z
    y = add(z)
    allocator, freed = executable(add)._outputs.allocator, []
    monkeypatch.setattr(allocator, "free", lambda block, free=allocator.free: freed.append(block) or free(block))
    block = z._device._block
    del z  # z's set is free now, but another stream used its block
    _, lean = runs_lean(lambda: add(y))
    assert not lean and freed == [block]


def test_inside_a_trace_a_jitted_call_is_inlined(stub):
    add = glue.jit(lambda v: v * 3.0, backend="cuda")
    z = warm_loop(add, device(np.ones(4)))
    launches = stub.calls["cuGraphLaunch"]
    ir = glue.make_ir(lambda: add(z).sum())()
    assert "mul" in str(ir) and stub.calls["cuGraphLaunch"] == launches  # traced through, not run


def test_changed_settings_take_the_usual_path(stub):
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = warm_loop(add, device(np.ones(16)))
    with config.override(enable_x64=True):  # a setting tracing reads
        z, lean = runs_lean(lambda: add(z))
        assert not lean
    z, lean = runs_lean(lambda: add(z))
    assert not lean
    z, lean = runs_lean(lambda: add(z))
    assert lean


@pytest.mark.cuda
def test_on_the_gpu_a_loop_of_lean_calls_computes_what_numpy_does():
    """The values, on a GPU: a loop fed back its results, reading one now and then (events),
    with a second output, an argument kept fixed and a result kept alive across calls."""
    step = glue.jit(lambda h, x: (h * 0.5 + x, (h * x).sum()), backend="cuda")
    rng = np.random.default_rng(0)
    h0, x0 = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    h, x = device(h0), device(x0)
    want_h, lean_calls = h0.astype(np.float64), 0
    for i in range(12):
        want_s = (want_h * x0).sum()
        (h, s), lean = runs_lean(lambda: step(h, x))
        lean_calls += lean
        want_h = want_h * 0.5 + x0
        if i % 3 == 0:
            np.testing.assert_allclose(float(s), want_s, rtol=1e-4)  # waits: an event on s
        if i == 4:
            kept, kept_want = h, want_h.copy()  # kept alive: its set is not reused
    assert lean_calls >= 6  # (7 with the stub driver: the calls after a kept result take the usual path)
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(kept), kept_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("captured", ["device Array", "NumPy array"])
def test_captured_values_are_copied_in_once(stub, captured):
    """A function that closes over a value (a loss's weights, a mask) gets it as a constant of
    the program: later calls copy nothing in, as with an argument already on the device (a
    captured device Array went through the host and back at every call), and take the lean
    call with the constant before the arguments."""
    w = np.arange(4096, dtype=np.float32)
    w = device(w) if captured == "device Array" else w
    f = glue.jit(lambda v: v * w, backend="cuda")
    z = warm_loop(f, device(np.ones(4096)))
    copies = {k: stub.calls[k] for k in ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync")}
    for _ in range(3):
        z, lean = runs_lean(lambda: f(z))
        assert lean
    assert {k: stub.calls[k] for k in copies} == copies
