"""Long programs: a 10,000-operation elementwise chain and a chain of 300 normalisation blocks go
through the IR's text form, the scheduler, the reference interpreters, the cpu backend and PTX
generation for sm_90 with Python's recursion limit at 1000, so that no walk over a graph,
kernel IR or an expression recurses on the program's length."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend_cuda.codegen import build_program
from glue.backend_cuda.ptx import ptx_for_module
from glue.ir import parse, verify
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.scheduler.interpret import run_plan
from glue.scheduler import fusion
from glue.scheduler.plan import STAGES, schedule
from glue.scheduler.streams import MAX_STREAMS
from glue.testing import check_graph

CHAIN_OPS = 10_000
BLOCKS = 300
RECURSION_LIMIT = 1000


def elementwise_chain(x):
    steps = (lambda x: x * 0.75, lambda x: x + 0.125, lambda x: gnp.maximum(x, -4.0), lambda x: x - 0.0625)
    for i in range(CHAIN_OPS):
        x = steps[i % len(steps)](x)
    return x


def normalisation_chain(x):
    for _ in range(BLOCKS):
        x = x - x.mean(-1, keepdims=True)
        x = x / gnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    return x


PROGRAMS = {"elementwise chain": elementwise_chain, "normalisation chain": normalisation_chain}


@pytest.fixture(autouse=True)
def shallow_stack():
    """Every test runs where a walk that recursed on the program's length would fail."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(limit)


@pytest.fixture(scope="module", params=list(PROGRAMS))
def program(request):
    """(name, function, input, graph, plan), traced and scheduled once per module."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(RECURSION_LIMIT)
    try:
        fn = PROGRAMS[request.param]
        x = np.linspace(-2, 2, 8 * 16, dtype=np.float32).reshape(8, 16)
        graph = glue.make_ir(fn)(x).graph
        plan = schedule(graph)
    finally:
        sys.setrecursionlimit(limit)
    return request.param, fn, x, graph, plan


def test_the_programs_are_long(program):
    name, _, _, graph, plan = program
    assert len(graph.eqns) >= (CHAIN_OPS if name == "elementwise chain" else 13 * BLOCKS)
    assert len(plan.graph.eqns) >= len(graph.eqns) * 0.9


def test_text_form_round_trip_and_verifier(program):
    graph = program[3]
    parsed = parse(str(graph))
    verify(parsed)
    assert parsed == graph


def test_every_scheduler_stage_prints(program):
    plan = program[4]
    for stage in STAGES:
        assert plan.as_text(stage)
    assert len(plan.kernels) >= 2
    # Kernels stop growing where they would compile slower than fusing saves.
    assert any("compiles slower than fusing saves" in r.reason for r in plan.fusion.refusals)


def test_the_kernel_interpreter_matches_the_reference(program):
    _, _, x, graph, plan = program
    (got,), (want,) = run_plan(plan, [x]), run_graph(graph, [x])
    assert mismatch(got, want, graph.outvars[0].type.dtype) is None


def test_the_cpu_backend_compiles_and_matches_the_reference(program):
    _, _, x, graph, _ = program
    check_graph(graph, [x], backends=["cpu"], scale=4)


def test_ptx_for_sm_90(program):
    graph = program[3]
    plan = schedule(graph, (), MAX_STREAMS)
    program = build_program(plan, "long", "sm_90")
    ptx = [ptx_for_module(module, "sm_90") for module in program.llvm_modules().values()]
    assert all(text.count(".entry") == 1 for text in ptx)
    assert len(ptx) == len(program.kernels) == len({launch.symbol for launch in program.launches})


def test_fusion_work_grows_linearly_with_the_program(monkeypatch):
    """Fusing twice the chain follows twice the reads, not four times as many: each join only
    follows the joining equation's own reads."""
    visits = []

    class Counting(fusion.SiteWalk):
        def visit(self, requests):
            visits[-1] += len(requests)
            super().visit(requests)

    monkeypatch.setattr(fusion, "SiteWalk", Counting)
    for length in (500, 1000):
        def chain(x, n=length):
            for _ in range(n):
                x = x * 0.75 + 0.125
            return x

        visits.append(0)
        fusion.fuse(glue.make_ir(chain)(np.ones((4, 8), np.float32)).graph)
    assert visits[1] <= 2.2 * visits[0], visits
