"""The disk cache of Plans (glue/backend/plan_cache.py): a large program planned once is read back
by the next lowering, in this process and in a new one, and gives the same results; whatever
changes a Plan changes its key; small programs, damaged entries and Plans holding Var ids of
another process are handled."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend import plan_cache
from glue.backend_cpu import CpuBackend
from glue.backend_cuda import CudaBackend
from glue.ir import Var
from glue.ir.dtypes import float32
from glue.ir.core import TensorType
from glue.settings import config

LINKS = 40  # three equations each: past plan_cache.PLAN_CACHE_EQNS


def _chain(x, scale=0.5, links=LINKS):
    for i in range(links):
        x = gnp.tanh(x) * scale + i
    return x, x.sum(axis=-1)


def _want(x, scale=0.5, links=LINKS):
    y = x.astype(np.float64)
    for i in range(links):
        y = np.tanh(y) * scale + i
    return [y, y.sum(axis=-1)]


X = np.random.default_rng(0).standard_normal((6, 33)).astype(np.float32)


def _graph(scale=0.5, links=LINKS):
    return glue.make_ir(lambda x: _chain(x, scale, links))(X).graph


def _lower(graph, backend=CpuBackend, **options):
    return backend().lower(graph, name="planned", **options)


def _check(lowering, scale=0.5):
    for got, want in zip(lowering.compile()(X), _want(X, scale)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-4)


def _plans(root):
    return sorted(f for d, _, files in os.walk(os.path.join(root, "plan")) for f in files)


@pytest.fixture
def cache_dir(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        yield tmp_path


def test_the_next_lowering_reads_the_plan_and_skips_the_scheduler(cache_dir):
    first = _lower(_graph())
    _check(first)
    assert not first.timings["plan"].cached and len(_plans(cache_dir)) == 1
    second = _lower(_graph())
    _check(second)
    assert second.timings["plan"].cached
    assert not {"passes", "attention", "fuse"} & set(second.timings)  # never ran
    assert second.as_text("memory") == first.as_text("memory")
    assert len(_plans(cache_dir)) == 1


def test_a_new_process_reads_the_plan_and_runs_right(cache_dir):
    script = textwrap.dedent(f"""
        import numpy as np, glue, glue.numpy as gnp
        from glue.backend_cpu import CpuBackend
        from tests.backend.test_plan_cache import X, _graph, _want
        low = CpuBackend().lower(_graph(), name="planned")
        got = low.compile()(X)
        err = max(float(np.abs(np.asarray(g) - w).max()) for g, w in zip(got, _want(X)))
        print(low.timings["plan"].cached, err)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, GLUE_CACHE_DIR=str(cache_dir), PYTHONPATH=root)
    runs = [subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    outputs = [r.stdout.split() for r in runs]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert [o[0] for o in outputs] == ["False", "True"]
    assert all(float(o[1]) < 1e-3 for o in outputs)


@pytest.mark.parametrize("change", ["literal", "donation", "option", "setting", "backend"])
def test_what_changes_a_plan_changes_its_key(cache_dir, change):
    _lower(_graph())["plan"]
    graph, options = _graph(), {}
    if change == "literal":
        graph = _graph(scale=0.25)
    elif change == "option":
        options = {"opt_level": 2}
    if change == "donation":
        lowering = CpuBackend().lower(graph, donated=(0,), name="planned")
    elif change == "backend":
        lowering = _lower(graph, CudaBackend, arch="sm_90a")
    else:
        lowering = _lower(graph, **options)
    with config.override(fold_limit=7 if change == "setting" else config.fold_limit):
        lowering["plan"]
    assert not lowering.timings["plan"].cached and len(_plans(cache_dir)) == 2


def test_the_cuda_lowering_reads_its_plan_without_a_gpu(cache_dir):
    first = _lower(_graph(), CudaBackend, arch="sm_90a").as_text("llvm")
    second = _lower(_graph(), CudaBackend, arch="sm_90a")
    assert second.as_text("llvm") == first and second.timings["plan"].cached


def test_a_small_program_is_planned_afresh_and_stores_nothing(cache_dir):
    graph = _graph(links=3)
    assert len(graph.eqns) < plan_cache.PLAN_CACHE_EQNS
    _lower(graph)["plan"]
    again = _lower(graph)
    again["plan"]
    assert not again.timings["plan"].cached and not _plans(cache_dir)


def test_a_damaged_plan_is_rebuilt_and_replaced(cache_dir):
    _lower(_graph())["plan"]
    (name,) = _plans(cache_dir)
    plan_cache.DISK.store(bytes.fromhex(name), pickle.dumps((0, "not a plan")))
    lowering = _lower(_graph())
    _check(lowering)
    assert not lowering.timings["plan"].cached
    again = _lower(_graph())
    again["plan"]
    assert again.timings["plan"].cached


def test_vars_made_after_a_plan_is_read_never_take_its_ids(cache_dir):
    """A Plan read back holds the Var ids of the process that stored it: the bound stored with
    it moves this process's ids past them."""
    _lower(_graph())["plan"]
    (name,) = _plans(cache_dir)
    key = bytes.fromhex(name)
    bound, plan = pickle.loads(plan_cache.DISK.load(key))
    far = Var(TensorType((), float32)).id + 10 ** 6
    plan_cache.DISK.store(key, pickle.dumps((far, plan)))
    assert _lower(_graph())["plan"] is not None
    assert Var(TensorType((), float32)).id >= far
