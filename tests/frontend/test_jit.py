"""`glue.jit`: the signature cache and its retrace log, static and donated arguments, staged
lowering and compilation, dumps, GLUE_CHECK, inlining and escaped tracers."""
import importlib
import logging
import os

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue import GlueError
from glue.backend.reference import ReferenceBackend

jit_module = importlib.import_module("glue.frontend.jit")  # `glue.frontend.jit` is also the function
X = np.arange(3, dtype=np.float32)


def _counting(fn):
    """`fn`, jitted on the reference backend, with a list recording each trace."""
    traces = []

    def traced(*args, **kwargs):
        traces.append(1)
        return fn(*args, **kwargs)

    traced.__name__ = fn.__name__
    return traced, traces


def test_same_signature_traces_once(caplog):
    def double(x):
        return x * 2.0

    fn, traces = _counting(double)
    f = glue.jit(fn, backend="reference")
    with caplog.at_level(logging.INFO, logger="glue"):
        np.testing.assert_array_equal(f(X), X * 2)
        np.testing.assert_array_equal(f(X + 1), (X + 1) * 2)
        f(glue.Array(X))
    assert len(traces) == 1
    assert not caplog.records


def test_arrays_of_the_last_calls_types_skip_the_signature(monkeypatch):
    """A loop feeding results back in passes glue.Arrays whose types are the last call's own
    objects: that call needs no flattening or lookup. Anything else still goes through the
    signature: other types, other structures, NumPy arguments, keywords."""
    f = glue.jit(lambda x, y: (x + y, x * y), backend="cpu")
    a, b = f(X, X)
    a, b = f(a, b)
    calls = []
    split = f.spec.split
    monkeypatch.setattr(f.spec, "split", lambda *args: calls.append(1) or split(*args))
    a2, b2 = f(a, b)
    assert calls == []
    np.testing.assert_allclose(np.asarray(a2), np.asarray(a) + np.asarray(b))
    for args, kwargs, want in (((a, X), {}, np.asarray(a) + X), ((a,), {"y": b}, np.asarray(a) + np.asarray(b)),
                               ((glue.Array(np.ones((2, 3), np.float32)),) * 2, {}, np.full((2, 3), 2.0))):
        calls.clear()
        np.testing.assert_allclose(np.asarray(f(*args, **kwargs)[0]), want)
        assert calls  # (a first signature is split again when it is traced)


def test_flat_lists_of_arrays_also_skip_the_signature(monkeypatch):
    """The same for a training step's list of weights: a list of Arrays of the last call's types
    and length takes its program directly; a longer list, or a tuple, does not."""
    f = glue.jit(lambda ws, x: ([w * x for w in ws], x), backend="cpu")
    ws, x = f([X, X + 1], X)
    ws, x = f(ws, x)
    calls = []
    split = f.spec.split
    monkeypatch.setattr(f.spec, "split", lambda *args: calls.append(1) or split(*args))
    new, _ = f(ws, x)
    assert calls == [] and isinstance(new, list)
    np.testing.assert_allclose(np.asarray(new[1]), np.asarray(ws[1]) * np.asarray(x))
    for other in (ws + [ws[0]], tuple(ws)):
        calls.clear()
        assert len(f(other, x)[0]) == len(other) and calls




def test_scalars_whose_class_fixes_their_type_also_skip_the_signature(monkeypatch):
    """An optimizer step's bias corrections are NumPy scalars (or Python floats) that change
    every call: their class decides their type, so the call stays on the hot path. A Python int
    (whose dtype depends on its value) or a scalar of another class goes through the signature."""
    f = glue.jit(lambda ws, c, s: ([w * c for w in ws], s * 2), backend="cpu")
    ws, s = f([X, X + 1], np.float32(0.5), 1.5)
    ws, s = f(ws, np.float32(0.5), 1.5)
    calls = []
    split = f.spec.split
    monkeypatch.setattr(f.spec, "split", lambda *args: calls.append(1) or split(*args))
    new, s2 = f(ws, np.float32(3.0), 2.5)
    assert calls == []
    np.testing.assert_allclose(np.asarray(new[0]), np.asarray(ws[0]) * 3.0)
    assert float(np.asarray(s2)) == 5.0
    for c, scalar in ((np.float16(2.0), 1.5), (np.float32(2.0), 3), (np.float32(2.0), True)):
        calls.clear()
        out, s3 = f(ws, c, scalar)
        assert calls
        assert np.asarray(out[0]).dtype == np.float32 and float(np.asarray(s3)) == float(scalar) * 2
@pytest.mark.parametrize("first, second, reason", [
    (np.zeros(3, np.float32), np.zeros((2, 3), np.float32), "argument types changed: args[0] f32[3] -> f32[2,3]"),
    (np.zeros(3, np.float32), np.zeros(3, np.float16), "argument types changed: args[0] f32[3] -> f16[3]"),
    (np.zeros(3, np.float32), (np.zeros(3, np.float32),), "the argument structure changed"),
])
def test_a_new_signature_retraces_and_logs_what_changed(caplog, first, second, reason):
    def ident(x):
        return x

    fn, traces = _counting(ident)
    f = glue.jit(fn, backend="reference")
    with caplog.at_level(logging.INFO, logger="glue"):
        f(first)
        f(second)
    assert len(traces) == 2
    [record] = caplog.records
    assert record.name == "glue" and record.levelno == logging.INFO
    assert f"retracing ident because {reason}" in record.getMessage()


def test_static_argnums(caplog):
    def scale(x, n):
        return x * n

    fn, traces = _counting(scale)
    f = glue.jit(fn, backend="reference", static_argnums=1)
    with caplog.at_level(logging.INFO, logger="glue"):
        np.testing.assert_array_equal(f(X, 3), X * 3)
        f(X, 3)
        np.testing.assert_array_equal(f(X, 4), X * 4)
    assert len(traces) == 2
    assert "static arguments changed (1: 3 -> 4)" in caplog.records[0].getMessage()
    assert "mul a 3.0:f32" in str(glue.make_ir(scale, static_argnums=1)(X, 3))


def test_static_argnames_and_keyword_arguments():
    @glue.jit(backend="reference", static_argnames="mode")
    def f(x, *, y, mode):
        return x + y if mode == "add" else x * y

    np.testing.assert_array_equal(f(X, y=X, mode="add"), X + X)
    np.testing.assert_array_equal(f(X, y=X, mode="mul"), X * X)


def test_a_static_parameter_left_out_takes_its_default():
    # As in JAX: `@partial(jax.jit, static_argnames="n")` on `def f(x, n=2)`, called as f(x).
    def scale(x, n=2, *, mode="mul"):
        return x * n if mode == "mul" else x + n

    for f in (glue.jit(scale, backend="reference", static_argnames=("n", "mode")),
              glue.jit(scale, backend="reference", static_argnums=1)):
        np.testing.assert_array_equal(f(X), X * 2)
        np.testing.assert_array_equal(f(X, 3), X * 3)
        np.testing.assert_array_equal(f(X, n=4), X * 4)
    np.testing.assert_array_equal(glue.jit(scale, backend="reference", static_argnames="mode")(X, mode="add"), X + 2)
    with pytest.raises(GlueError, match=r"static_argnums names position 1 .*test_jit.py"):
        glue.jit(lambda x, n: x * n, backend="reference", static_argnums=1)(X)


def test_unhashable_static_argument_is_a_glue_error():
    f = glue.jit(lambda x, shape: x, backend="reference", static_argnums=1)
    with pytest.raises(GlueError, match=r"static arguments of <lambda> must be hashable; got \['list'\]"):
        f(X, [1, 2])


def test_make_ir_and_lowered_text():
    def f(x):
        return gnp.tanh(x) * 2.0

    text = str(glue.make_ir(f)(X))
    assert text.startswith("{ lambda ; a:f32[3] . let\n    b:f32[3] = tanh a")
    assert "c:f32[3] = mul b 2.0:f32" in text and text.endswith("in (c) }")
    lowered = glue.jit(f, backend="reference").lower(X)
    assert lowered.as_text("ir") == text
    assert "ir" in lowered.stages
    with pytest.raises(GlueError, match="stage 'ptx' is not produced by the reference backend"):
        lowered.as_text("ptx")


def test_compile_gives_a_callable_for_that_signature():
    f = glue.jit(lambda x, y: {"sum": x + y, "both": (x, None)}, backend="reference")
    compiled = f.lower(X, X).compile()
    out = compiled(X, 2 * X)
    np.testing.assert_array_equal(out["sum"], 3 * X)
    assert isinstance(out["sum"], glue.Array) and out["both"][1] is None
    assert compiled.kernels == []
    assert compiled.as_text("ir") == f.lower(X, X).as_text("ir")
    with pytest.raises(GlueError, match=r"compiled for other arguments: argument types changed: args\[1\] f32\[3\] -> f32\[4\]"):
        compiled(X, np.zeros(4, np.float32))


def test_glue_dump_writes_every_stage(monkeypatch, tmp_path):
    monkeypatch.setenv("GLUE_DUMP", str(tmp_path / "dump"))

    def dumped(x):
        return x + 1.0

    f = glue.jit(dumped, backend="reference")
    f(X)
    (name,) = os.listdir(tmp_path / "dump")
    assert name.endswith(".dumped.ir.txt")
    assert (tmp_path / "dump" / name).read_text() == f.lower(X).as_text("ir") + "\n"
    f(np.ones((2, 2), np.float32))  # a second signature gets files of its own
    assert len(os.listdir(tmp_path / "dump")) == 2


def test_glue_check_compares_with_the_reference(monkeypatch):
    monkeypatch.setenv("GLUE_CHECK", "1")
    compiled = glue.jit(lambda x: x * 3.0, backend="reference").lower(X).compile()
    np.testing.assert_array_equal(compiled(X), X * 3)
    compiled.executable = lambda *args: [np.asarray(args[0]) * 3.001]  # a backend gone wrong
    with pytest.raises(GlueError, match=r"GLUE_CHECK: output 0 of <lambda> \(f32\[3\]\) on the reference "
                                        r"backend disagrees with the reference: 2 of 3 elements differ"):
        compiled(X)


def test_glue_check_is_off_by_default(monkeypatch):
    monkeypatch.delenv("GLUE_CHECK", raising=False)
    compiled = glue.jit(lambda x: x, backend="reference").lower(X).compile()
    compiled.executable = lambda *args: [np.zeros(3, np.float32)]
    np.testing.assert_array_equal(compiled(X), np.zeros(3))


def test_donated_arguments_reach_the_backend_as_leaf_positions(monkeypatch):
    seen = []

    class Recording(ReferenceBackend):
        def lower(self, graph, *, donated=(), name="fn"):
            seen.append(donated)
            return super().lower(graph, donated=donated, name=name)

    monkeypatch.setattr(jit_module, "get_backend", lambda name=None: Recording())
    f = glue.jit(lambda pair, y, z: pair[0] + pair[1] + y + z, donate_argnums=(0, 2))
    np.testing.assert_array_equal(f((X, X), X, X), 4 * X)
    assert seen == [(0, 1, 3)]


def test_a_jitted_function_called_while_tracing_is_inlined():
    inner = glue.jit(lambda x: gnp.tanh(x) * 2.0, backend="reference")
    outer = glue.jit(lambda x: inner(x) + 1.0, backend="reference")
    graph = glue.make_ir(outer)(X).graph
    assert [e.primitive for e in graph.eqns] == ["tanh", "mul", "add"]
    np.testing.assert_allclose(outer(X), np.tanh(X) * 2 + 1, rtol=1e-6)
    assert not inner._compiled


def test_escaped_tracers_are_glue_errors():
    leaked = []

    @glue.jit(backend="reference")
    def keep(x):
        leaked.append(x)
        return x

    keep(X)
    with pytest.raises(GlueError, match="escaped the trace of keep"):
        gnp.add(leaked[0], 1.0)
    with pytest.raises(GlueError, match="escaped the trace of keep"):
        glue.jit(lambda y: y + leaked[0], backend="reference")(X)


def test_default_backend_runs():
    f = glue.jit(lambda x: x - 1.0)
    out = f(X)
    assert isinstance(out, glue.Array)
    np.testing.assert_allclose(out, X - 1)


def test_threads_trace_independently():
    """Each host thread has its own trace stack: a jitted call in one thread never lands in the
    trace another thread has open."""
    import threading

    start = threading.Barrier(2)
    results, errors = {}, []

    def work(k):
        try:
            start.wait()
            for n in range(40):
                f = glue.jit(lambda x, n=n: gnp.tanh(x * (k + n)).sum(), backend="reference")
                results[k, n] = float(f(np.ones(50, np.float32)))
        except Exception as exc:  # reported by the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    for (k, n), value in results.items():
        assert value == pytest.approx(50 * np.tanh(k + n), rel=1e-5)


def test_device_put_keeps_values_where_the_backend_computes():
    a = glue.device_put(np.arange(3, dtype=np.float32), "cpu")
    assert isinstance(a, glue.Array) and np.asarray(a).tolist() == [0.0, 1.0, 2.0]
    assert glue.device_put(a, "cpu") is a
    f = glue.jit(lambda v: v * 2, backend="cpu")
    assert np.asarray(f(a)).tolist() == [0.0, 2.0, 4.0]


@pytest.mark.parametrize("enabled", [True, False])
def test_no_garbage_collection_while_compiling(enabled):
    """Tracing, lowering and compiling run with the cyclic collector off (a compile's many
    long-lived objects made it rescan the heap again and again), and leave it as they found it."""
    import gc

    seen = []

    def fn(x):
        seen.append(gc.isenabled())
        return x * 2.0

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        lowered = glue.jit(fn, backend="cpu").lower(X)
        assert gc.isenabled() == enabled
        lowered.as_text("kernels")
        assert gc.isenabled() == enabled
        np.testing.assert_array_equal(lowered.compile()(X), X * 2)
        assert seen == [False] and gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
