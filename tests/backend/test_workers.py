"""Compile workers: LLVM jobs in other processes give what the same job gives here; failures
come back as errors; a worker that dies is replaced."""
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend import workers
from glue.backend_cpu import target
from glue.errors import BackendError
from glue.settings import config


def _module(n: int) -> str:
    return (f'target triple = "{target.host().triple}"\n'
            f"define void @f{n}(ptr %x) {{\n  store i64 {n}, ptr %x\n  ret void\n}}\n")


def test_workers_make_the_same_object_code_as_this_process():
    with config.override(compile_workers=2):
        jobs = workers.Jobs(3)
        assert jobs.parallel
        futures = [jobs.submit(*target.Pipeline().job(_module(n)), label=f"f{n}") for n in range(3)]
        remote = [f.result() for f in futures]
    with config.override(compile_workers=1):
        here = workers.Jobs(3)
        assert not here.parallel
        local = [here.submit(*target.Pipeline().job(_module(n))).result() for n in range(3)]
    assert [code for code, _ in remote] == [code for code, _ in local]
    assert all(set(seconds) == {"llvm optimise", "object emission", "llvm cpu"} for _, seconds in remote)


def test_a_lone_job_runs_here_until_workers_have_started(monkeypatch):
    monkeypatch.setattr(workers, "_pool", None)
    monkeypatch.setattr(workers, "_ran_here", 0)
    with config.override(compile_workers=2):
        assert not workers.Jobs(1).parallel
        assert workers.Jobs(2).parallel
        assert workers.Jobs(1).parallel is False  # the pool exists but no worker has run yet


def test_after_a_few_lone_jobs_here_they_go_to_a_worker(monkeypatch):
    """LLVM keeps memory per optimised module: a process compiling program after program moves
    that into workers, which retire after a while."""
    monkeypatch.setattr(workers, "_pool", None)
    monkeypatch.setattr(workers, "_ran_here", 0)
    monkeypatch.setattr(workers, "WORKER_JOBS", 3)
    with config.override(compile_workers=2):
        for n in range(workers.IN_PROCESS_JOBS):
            jobs = workers.Jobs(1)
            assert not jobs.parallel
            jobs.submit(*target.Pipeline().job(_module(n))).result()
        codes = []
        for n in range(7):  # through a worker, replaced every three jobs
            jobs = workers.Jobs(1)
            assert jobs.parallel
            codes.append(jobs.submit(*target.Pipeline().job(_module(n))).result()[0])
        assert workers.started() <= 2
    here = [workers._run_here(*target.Pipeline().job(_module(n)), "").result()[0] for n in range(7)]
    assert codes == here


def test_an_llvm_error_in_a_worker_comes_back_as_its_message():
    with config.override(compile_workers=2):
        future = workers.Jobs(2).submit(*target.Pipeline().job("define void @f( {"))
        with pytest.raises(RuntimeError, match="parsing error"):
            future.result()


def test_a_worker_that_dies_fails_its_job_and_is_replaced():
    with config.override(compile_workers=2):
        jobs = workers.Jobs(2)
        jobs.submit(*target.Pipeline().job(_module(1))).result()
        pool = workers._pool
        for worker in pool._all:
            worker._process.kill()
            worker._process.wait()
        outcomes = []
        for n in range(4):
            try:
                outcomes.append(jobs.submit(*target.Pipeline().job(_module(n))).result()[0])
            except RuntimeError as exc:
                assert "exited" in str(exc)
                outcomes.append(None)
        assert outcomes[-1] is not None


def test_a_cold_compile_of_many_kernels_in_workers_runs_correctly():
    def f(x):  # rows of different lengths: one kernel each
        return [gnp.tanh(x[:, :n]).sum(axis=1) for n in (31, 30, 29, 28)]

    x = np.linspace(-1, 1, 31 * 3, dtype=np.float32).reshape(3, 31)
    with config.override(compile_workers=2, cache_dir=""):
        compiled = glue.jit(f, backend="cpu").lower(x).compile()
    assert compiled.compile_stats()["cache"]["built"] == len(compiled.kernels) == 4
    for n, got in zip((31, 30, 29, 28), compiled(x)):
        np.testing.assert_allclose(np.asarray(got), np.tanh(x[:, :n]).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_the_backend_reports_a_kernel_llvm_rejects(monkeypatch):
    from glue.backend_cpu import program

    x = np.ones((2, 37), np.float32)
    original = program.Program.module

    def broken(self, key):
        return replace(original(self, key), text="define void @broken( {")

    monkeypatch.setattr(program.Program, "module", broken)
    with config.override(cache_dir=""):
        with pytest.raises(BackendError, match="LLVM could not compile kernel"):
            glue.jit(lambda x: gnp.exp(x) + 1, backend="cpu").lower(x).compile()


def test_a_call_kernels_bodies_are_compiled_in_the_programs_batch():
    """The kernels of a scan's body (and of a scan nested in it) are built in the calling
    program's object stage, beside its own kernels, and loading it compiles nothing more."""
    from glue import lax

    def inner(c, x):
        return c * 0.25 + gnp.sin(x), c.sum()

    def outer(c, xs):
        c, ys = lax.scan(inner, c, xs)
        return gnp.tanh(c) * 1.5, ys.sum()

    def f(c, xss):
        c, sums = lax.scan(outer, c, xss)
        return gnp.exp(c) + 3.0, sums

    c, xss = np.linspace(-1, 1, 23, dtype=np.float32), np.linspace(0, 1, 4 * 3 * 23, dtype=np.float32).reshape(4, 3, 23)
    with config.override(compile_workers=2, cache_dir=""):
        lowering = glue.jit(f, backend="cpu").lower(c, xss).lowering
        lowering["object"]
        built = {k.symbol for k in lowering.kernel_stats.values() if k.source == "built"}
        levels, todo = [], [lowering]
        while todo:  # the program, the outer scan's body, the inner scan's body
            program = todo.pop()["program"]
            levels.append({s.symbol for s in program.sources.values()})
            for use in program.uses:
                for graph in getattr(getattr(use, "plan", None), "bodies", ()):
                    body = lowering.backend.body_lowering(graph, lowering.options)
                    assert body.built("object")
                    todo.append(body)
        assert len(levels) == 3 and all(level <= built for level in levels)
        compiled = lowering.compile()
    assert {k.symbol for k in lowering.kernel_stats.values()} == built  # nothing built at load
    got_c, got_sums = compiled(c, xss)
    want_c, want_sums = c.astype(np.float64), []
    for xs in xss:
        sums = []
        for x in xs:
            sums.append(want_c.sum())
            want_c = want_c * 0.25 + np.sin(x)
        want_c = np.tanh(want_c) * 1.5
        want_sums.append(np.sum(sums))
    np.testing.assert_allclose(np.asarray(got_c), np.exp(want_c) + 3.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_sums), want_sums, rtol=1e-5, atol=1e-5)


def test_workers_start_while_a_large_program_is_scheduled_unless_it_was_compiled_before(monkeypatch, tmp_path):
    def f(x):  # enough equations to count as large
        for n in range(workers.PRESTART_EQNS // 2 + 1):
            x = gnp.tanh(x * 1.01 + n)
        return x

    x = np.linspace(-1, 1, 37, dtype=np.float32)
    with config.override(compile_workers=2, cache_dir=str(tmp_path)):
        monkeypatch.setattr(workers, "_pool", None)
        lowered = glue.jit(f, backend="cpu").lower(x)
        assert workers.started() == 2  # before any stage has run
        np.testing.assert_allclose(np.asarray(lowered.compile()(x)), np.asarray(glue.jit(f, backend="reference")(x)),
                                   rtol=1e-5, atol=1e-6)
        monkeypatch.setattr(workers, "_pool", None)
        glue.jit(f, backend="cpu").lower(np.linspace(-1, 1, 37, dtype=np.float32)).compile()
        assert workers.started() == 0  # its kernels are on disk: no worker is needed
        monkeypatch.setattr(workers, "_pool", None)
        monkeypatch.setattr(workers, "_ran_here", 0)
        glue.jit(lambda x: gnp.tanh(x) * 3, backend="cpu").lower(x).compile()
        assert workers.started() == 0  # a small program: its lone kernel compiles here


def test_a_large_cuda_program_planned_afresh_starts_workers_that_import_its_emitter(monkeypatch, tmp_path):
    from glue.backend_cuda import CudaBackend

    started = []
    monkeypatch.setattr(workers, "prestart", lambda preload=(): started.append(preload))
    graph = glue.make_ir(lambda x: _chain(x, workers.PRESTART_EQNS))(np.ones(37, np.float32)).graph
    with config.override(compile_workers=4, cache_dir=str(tmp_path)):
        CudaBackend().lower(graph, arch="sm_90")["plan"]
        assert started == [("glue.backend_cuda.codegen",)]
        CudaBackend().lower(graph, arch="sm_90")["plan"]  # its Plan comes from the disk cache
        assert len(started) == 1
    with config.override(compile_workers=2, cache_dir=""):
        CudaBackend().lower(graph, arch="sm_90")["plan"]  # too few workers to emit: LLVM only
        assert started[1:] == [()]


def _chain(x, ops: int):
    for n in range(ops // 2 + 1):
        x = gnp.tanh(x * 1.01 + n)
    return x


def test_a_worker_imports_glue_without_its_api_and_preloads_what_it_is_told(monkeypatch):
    monkeypatch.setattr(workers, "_pool", None)
    with config.override(compile_workers=2):
        workers.prestart(("colorsys",))  # a module nothing of glue's imports
        jobs = workers.Jobs(2)
        loaded = [jobs.submit("call", ("glue.backend.llvm_jobs", "imported", (["colorsys", "glue.numpy"],)))
                  for _ in range(2)]
        assert [f.result() for f in loaded] == [[True, False]] * 2


def test_a_call_job_runs_a_function_of_glue_in_a_worker():
    with config.override(compile_workers=2):
        jobs = workers.Jobs(2)
        assert jobs.parallel
        futures = [jobs.submit("call", ("glue.ir.core", "strides", ((2, 3, 4),))) for _ in range(2)]
        assert [f.result() for f in futures] == [[12, 4, 1]] * 2


def _mlp_grad(x, w1, w2):
    return glue.grad(lambda w1, w2: gnp.tanh(gnp.tanh(x @ w1) @ w2).sum(), argnums=(0, 1))(w1, w2)


def _cuda_program(workers_count: int):
    from glue.backend_cuda import CudaBackend
    from glue.backend_cuda import codegen

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32, 48), (48, 8))]
    closed = glue.make_ir(_mlp_grad)(*args)
    codegen._known.clear()
    with config.override(compile_workers=workers_count, cache_dir=""):
        low = CudaBackend().lower(closed.graph, arch="sm_90")
        program = low["llvm"]
        shapes = [(l.symbol, l.grid, l.block, l.strategy, l.dependent, l.min_blocks, l.shared_bytes, l.params)
                  for l in program.launches]
        return low["ptx"].modules, shapes, program.llvm_ir


def test_cuda_kernels_emitted_in_workers_are_those_emitted_here(monkeypatch):
    """From a program's third new kernel on, enough compile workers emit the kernels' modules too
    (Python, one at a time here); their modules, PTX and launch shapes are this process's."""
    original, calls = workers.Jobs.submit, []

    def counted(self, name, args, label=""):
        calls.append(name)
        return original(self, name, args, label)

    monkeypatch.setattr(workers.Jobs, "submit", counted)
    here = _cuda_program(1)
    assert "call" not in calls
    there = _cuda_program(4)
    assert len(here[0]) > 3 and calls.count("call") == len(here[0]) - 2
    assert there[0] == here[0]
    assert there[1] == here[1]
    assert there[2] == here[2]


def test_a_kernel_a_worker_cannot_emit_is_emitted_here(monkeypatch):
    original = workers.Jobs.submit

    def no_calls(self, name, args, label=""):
        if name == "call":  # as if the kernel could not be pickled
            failed = Future()
            failed.set_exception(RecursionError("maximum recursion depth exceeded while pickling"))
            return failed
        return original(self, name, args, label)

    monkeypatch.setattr(workers.Jobs, "submit", no_calls)
    assert _cuda_program(4)[0] == _cuda_program(1)[0]
