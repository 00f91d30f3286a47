"""Call kernels on the cuda backend: the steps a program's control flow plans into (no GPU
needed: a static scan is its body's steps repeated, each pointing at that iteration's slices;
while, cond and print are host steps), the emulator running those steps against the
reference, and, on a GPU, a scanned step replaying as one CUDA graph."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import lax
from glue.backend_cuda.steps import chosen_launches, plan_program
from tests.backend_cuda import emulator


def _program(fn, *args):
    return glue.jit(fn, backend="cuda").lower(*args).lowering["llvm"]


def _plan(program):
    n_args, n_outs = len(program.arg_types), len(program.output_types)

    def source(place):
        base = {"argument": place.slot, "output": n_args + place.slot, "arena": n_args + n_outs,
                "scratch": n_args + n_outs + 1 + place.slot}[place.kind]
        return base, place.offset

    n_bases = n_args + n_outs + 1 + len(program.scratch)
    steps, planner = plan_program(program, chosen_launches(program), n_bases, source)
    return steps, planner, n_bases, source


def _rnn(w, h, xs):
    return lax.scan(lambda c, x: (gnp.tanh(c @ w + x), (c * x).sum()), h, xs)


ARGS = (np.eye(3, dtype=np.float32) * 0.5, np.ones(3, np.float32), np.arange(15, dtype=np.float32).reshape(5, 3))


def test_a_static_scan_is_its_body_steps_repeated():
    program = _program(_rnn, *ARGS)
    (scan,) = [l for l in program.launches if l.call is not None]
    body = program.bodies[scan.group][0]["llvm"]
    steps, planner, n_bases, _ = _plan(program)
    body_symbols = [l.symbol for l in chosen_launches(body)]
    mine = [s for s in steps if s.group == scan.group]
    assert [s.launch.symbol for s in mine] == body_symbols * 5
    assert all(s.host is None for s in steps)  # nothing needs the host: one CUDA graph
    assert all(s.stream == program.plan.streams.streams[scan.group] for s in mine)
    # each iteration reads its own row of xs (argument 2) and writes its own element of ys
    xs_reads = [src for s in mine for src in s.sources if src[0] == 2]
    per_step = len(xs_reads) // 5
    assert [off for _, off in xs_reads[::per_step]] == [t * 12 for t in range(5)]
    # the body's arena is a region of the program's, the same in every iteration
    arenas = {src for s in mine for src in s.sources if src[0] >= n_bases and planner.regions[src[0] - n_bases].what
              == "arena"}
    assert len(arenas) <= 1


def test_carries_alternate_and_end_in_the_kernel_output():
    program = _program(lambda h: lax.scan(lambda c, _: (c * 2.0 + 1.0, None), h, None, length=4)[0],
                       np.ones(2, np.float32))
    steps, planner, n_bases, source = _plan(program)
    (scan,) = [l for l in program.launches if l.call is not None]
    result = source(scan.params[-1])  # the scan's carry output: where the last iteration writes
    scratch = (n_bases, 0)  # the call's one scratch region
    writes = [s.sources[-1] for s in steps if s.launch is not None and s.group == scan.group]
    assert writes == [scratch, result, scratch, result]


def test_while_cond_and_print_are_host_steps():
    def f(x, p):
        y = lax.while_loop(lambda v: v.sum() < 10, lambda v: v * 2, x)
        glue.debug.print("y {}", y)
        return lax.cond(p, lambda v: v + 1, lambda v: v - 1, y)

    steps, _, _, _ = _plan(_program(f, np.ones(2, np.float32), True))
    kinds = [s.host.site.plan.kind for s in steps if s.host is not None]
    assert kinds == ["while", "print", "cond"]


@pytest.mark.parametrize("case", ["scan", "grad", "nested", "while", "cond", "switch", "checkpoint"])
def test_the_emulator_runs_planned_calls_like_the_reference(case, capsys):
    rng = np.random.default_rng(0)
    w, h, xs = rng.normal(size=(3, 3)).astype(np.float32) * 0.5, rng.normal(size=3).astype(np.float32), \
        rng.normal(size=(4, 3)).astype(np.float32)

    def nested(w, h, xs):
        def outer(c, x):
            inner = lax.scan(lambda d, _: (gnp.sin(d) + x, d.sum()), c, None, length=2)
            return inner[0], inner[1]
        return lax.scan(outer, h, xs)

    fns = {
        "scan": _rnn,
        "grad": glue.grad(lambda w, h, xs: _rnn(w, h, xs)[0].sum(), argnums=(0, 2)),
        "nested": nested,
        "while": lambda w, h, xs: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, gnp.tanh(c[1] @ w)), (0, h)),
        "cond": lambda w, h, xs: lax.cond(h[0] > 0, lambda v: v @ w, lambda v: v - 1.0, h),
        "switch": lambda w, h, xs: lax.switch(2, [lambda v: v, lambda v: v * 2, lambda v: gnp.exp(v)], h),
        "checkpoint": glue.grad(lambda w, h, xs: (glue.checkpoint(lambda a, b: gnp.sin(a @ b))(h, w) ** 2).sum()),
    }
    fn = fns[case]
    got = emulator.run_program(_program(fn, w, h, xs), [w, h, xs])
    want = glue.tree_flatten(glue.jit(fn, backend="reference")(w, h, xs))[0]
    assert len(got) == len(want)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(v), rtol=1e-5, atol=1e-6)


@given(length=st.integers(0, 4), reverse=st.booleans())
def test_emulated_scans_of_any_length(length, reverse):
    xs = np.arange(length * 2, dtype=np.float32).reshape(length, 2)
    fn = lambda c, xs: lax.scan(lambda c, x: (c * 0.5 + x, c + x), c, xs, reverse=reverse)  # noqa: E731
    got = emulator.run_program(_program(fn, np.ones(2, np.float32), xs), [np.ones(2, np.float32), xs])
    want = glue.jit(fn, backend="reference")(np.ones(2, np.float32), xs)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(v), rtol=1e-6)


def test_emulated_print(capsys):
    fn = lambda xs: lax.scan(lambda c, x: (glue.debug.print("x {}", x) or c + x, None), 0.0, xs)[0]  # noqa: E731
    emulator.run_program(_program(fn, np.arange(3, dtype=np.float32)), [np.arange(3, dtype=np.float32)])
    assert capsys.readouterr().out.splitlines() == ["x 0.0", "x 1.0", "x 2.0"]


@pytest.mark.cuda
def test_a_scanned_step_replays_as_one_cuda_graph():
    f = glue.jit(_rnn, backend="cuda")
    want = glue.jit(_rnn, backend="reference")(*ARGS)
    args = [glue.device_put(a, "cuda") for a in ARGS]  # (NumPy arguments upload to new addresses)
    for _ in range(3):
        got = f(*args)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-5, atol=1e-6)
    exe = next(iter(f._compiled.values())).executable
    # (the previous call's results are still alive, so outputs alternate between two blocks: a
    # graph for each)
    assert exe.graph_stats.captures <= 2 and exe.graph_stats.replays >= 1 and exe.graph_stats.direct == 0


@pytest.mark.cuda
def test_a_while_loop_launches_directly_on_the_gpu(capsys):
    def f(x):
        glue.debug.print("x {}", x.sum())
        return lax.while_loop(lambda v: v.sum() < 10, lambda v: v * 2, x)

    g = glue.jit(f, backend="cuda")
    np.testing.assert_allclose(np.asarray(g(np.ones(2, np.float32))), [8, 8])
    exe = next(iter(g._compiled.values())).executable
    assert exe.graph_stats.direct == 1 and exe.graph_stats.captures == 0
    assert capsys.readouterr().out.splitlines() == ["x 2.0"]
