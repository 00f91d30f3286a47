"""`glue.profile` and GLUE_TRACE: a Chrome trace with compile stages, calls and kernels."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import glue
import glue.numpy as gnp


def _events(path):
    return json.loads(open(path).read())["traceEvents"]


def test_a_profile_records_compile_calls_and_cpu_kernels(tmp_path):
    f = glue.jit(lambda x, w: gnp.tanh(x @ w).sum(axis=1), backend="cpu")
    # shapes no other test compiles, and no disk cache: the kernels' code is built in the profile
    x, w = np.ones((7, 19), np.float32), np.ones((19, 3), np.float32)
    path = str(tmp_path / "trace.json")
    with glue.profile(path), glue.config.override(cache_dir=""):
        for _ in range(3):
            f(x, w)
    events = _events(path)
    spans = [e for e in events if e["ph"] == "X"]
    names = {(e["cat"], e["name"].split()[0]) for e in spans}
    assert {("compile", "trace"), ("compile", "passes"), ("compile", "fuse"), ("compile", "plan"),
            ("compile", "program"), ("compile", "object"), ("compile", "llvm"), ("compile", "host_code"),
            ("compile", "compile"), ("call", "<lambda>")} <= names
    calls = [e for e in spans if e["cat"] == "call"]
    kernels = [e for e in spans if e["cat"] == "kernel"]
    n_kernels = len(next(iter(f._compiled.values())).kernels)
    assert len(calls) == 3 and len(kernels) == 3 * n_kernels
    for k in kernels:  # each kernel runs inside a call, on the calling thread's track
        assert any(c["tid"] == k["tid"] and c["ts"] <= k["ts"] and k["ts"] + k["dur"] <= c["ts"] + c["dur"] + 1
                   for c in calls)
    threads = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert {e["tid"] for e in spans} <= {e["tid"] for e in threads}


def test_nothing_is_recorded_outside_a_profile(tmp_path):
    f = glue.jit(lambda x: x + 1, backend="cpu")
    f(np.ones(3, np.float32))
    path = str(tmp_path / "trace.json")
    with glue.profile(path):
        pass
    assert not [e for e in _events(path) if e["ph"] == "X"]
    assert glue.profiler.active() is None


def test_profiles_do_not_nest(tmp_path):
    with glue.profile(str(tmp_path / "a.json")):
        with pytest.raises(RuntimeError, match="already open"):
            with glue.profile(str(tmp_path / "b.json")):
                pass


def test_glue_trace_writes_the_whole_run_at_exit(tmp_path):
    path = str(tmp_path / "run.json")
    code = ("import numpy as np, glue\n"
            "f = glue.jit(lambda x: x * 2, backend='cpu')\n"
            "f(np.ones(4, np.float32)); f(np.ones(4, np.float32))\n")
    env = dict(os.environ, GLUE_TRACE=path, PYTHONPATH=os.getcwd())
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    calls = [e for e in _events(path) if e["ph"] == "X" and e["cat"] == "call"]
    assert len(calls) == 2
