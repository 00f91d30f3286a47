"""The cuda backend's code generation, without a GPU: PTX for every kernel of a set of programs
(the model workloads and random programs) assembles with ptxas for sm_90 and sm_80, with no
spills; and the generated kernels, run on the host by `emulator.py`, agree with the reference
interpreter on random programs and inputs."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
from glue.settings import config
from glue.backend_cuda import CudaBackend
from glue.backend_cuda.codegen import build_program
from glue.backend_cuda.codegen import rows as rows_codegen
from glue.backend_cuda.ptx import assemble, ptx_for_module, ptxas_available
from glue.ir import dtypes as dt
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.scheduler.plan import schedule
from glue.testing.check import tolerance_dtypes
from glue.testing.strategies import graph_inputs, programs
from tests.backend_cpu import integer_cases
from tests.backend_cuda import emulator
from tests.backend_cuda.cases import ALL_CASES, BF16, WORKLOADS, layernorm, rmsnorm, rng_arrays, softmax, xent

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
needs_cc = pytest.mark.skipif(not emulator.available(), reason="no C compiler for the kernel emulator")
ARCHS = ["sm_90", "sm_80"]
ALL_DTYPES = dt.ALL_DTYPES


def _lowered(fn, args):
    closed = glue.make_ir(fn)(*args)
    return closed, CudaBackend().lower(closed.graph, name=fn.__name__, arch="sm_90", gemm="codegen")


def _check(graph, args, got, label):
    want = run_graph(graph, [np.asarray(a) for a in args], float64=True)
    for i, (g, w, d) in enumerate(zip(got, want, tolerance_dtypes(graph, tf32=CudaBackend.rounds_to_tf32))):
        problem = mismatch(np.asarray(g), w, d)
        assert problem is None, f"{label}: output {i}: {problem}\n{graph}"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_ptx_names_bounds_and_vectors(name):
    fn, specs = WORKLOADS[name]
    args = rng_arrays(0, *specs)
    _, low = _lowered(fn, args)
    ptx = low.as_text("ptx")
    entries = re.findall(r"\.entry (\w+)\(", ptx)
    assert len(entries) == len({launch.symbol for launch in low["llvm"].launches})
    for launch in low["llvm"].launches:
        assert launch.kernel.ops[0] in launch.symbol
    assert len(re.findall(r"^\.maxntid \d+", ptx, re.M)) == len(entries)
    kinds = {"pointwise", "reduction", "contraction", "data"}
    assert all(launch.kind in kinds and launch.name in entries for launch in low["llvm"].launches)
    if name in ("softmax", "layernorm", "bias_gelu", "softmax_long"):
        assert "ld.global.nc.v4" in ptx and "st.global.v4" in ptx
    if name in ("softmax", "layernorm", "rmsnorm", "xent"):
        assert low["llvm"].launches[0].strategy.startswith("rows registers")
        assert "shfl.sync.bfly" in ptx


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS + ["sm_75"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_ptx_assembles_without_spills(name, arch):
    fn, specs = WORKLOADS[name]
    closed = glue.make_ir(fn)(*rng_arrays(0, *specs))
    report = assemble(CudaBackend().lower(closed.graph, arch=arch, gemm="codegen")["ptx"], arch)
    assert "bytes spill" in report
    assert not re.search(r"[1-9]\d* bytes spill", report), report


@needs_ptxas
def test_model_shapes_keep_rows_in_registers_without_spills():
    """The benchmark shapes: 8192x4096 rows and 4096x32000 cross-entropy hold the row in registers."""
    big = [((8192, 4096), np.float32), ((4096,), np.float32), ((4096,), np.float32)]
    zeros = lambda specs: [np.zeros(s, d) for s, d in specs]  # noqa: E731
    for fn, specs in ((layernorm, big), (softmax, big[:1]), (rmsnorm, big[:2]),
                      (xent, [((4096, 32000), np.float32)] * 2),
                      (softmax, [((8192, 4096), BF16)])):
        closed = glue.make_ir(fn)(*zeros(specs))
        low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen")
        assert low["llvm"].launches[0].strategy.startswith("rows registers"), low["llvm"].launches[0].strategy
        report = assemble(low["ptx"])
        assert not re.search(r"[1-9]\d* bytes spill", report), report


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_kernels_await_their_producers_before_touching_memory_on_sm90(name):
    """A dependent launch may start a kernel while its producer still runs: on sm_90 every
    kernel must pass `griddepcontrol.wait` before it writes global memory or reads anything but
    a contraction's constant operand (read-only loads); sm_80 has no such instruction, so its
    launches stay plain."""
    fn, specs = WORKLOADS[name]
    closed = glue.make_ir(fn)(*rng_arrays(0, *specs))
    for arch, dependent in (("sm_90", True), ("sm_80", False)):
        low = CudaBackend().lower(closed.graph, arch=arch, gemm="codegen")
        bodies = {symbol: ptx[ptx.index(".entry "):] for symbol, ptx in low["ptx"].modules.items()}
        for launch in low["llvm"].launches:
            body = bodies[launch.symbol]
            assert launch.dependent is dependent
            wait = body.find("griddepcontrol.wait")
            assert (wait >= 0) is dependent
            if dependent:
                before = re.findall(r"\b(?:ld|st|atom|red)\.global[.\w]*", body[:wait])
                read_only = launch.kind == "contraction"  # its constant operand may go first
                assert all(read_only and op.startswith("ld.global.nc") for op in before), (launch.name, before)


def test_short_rows_ask_for_more_resident_blocks():
    """A 16-bit row kernel's threads each load 32 bytes of the row, so its launch bounds ask for
    1536 resident threads (6 blocks of 256); a float32 one loads 64 and asks for nothing."""
    for dtype, blocks in ((np.float32, 0), (BF16, 6)):
        closed = glue.make_ir(rmsnorm)(np.zeros((64, 4096), dtype), np.zeros(4096, dtype))
        low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen")
        assert [launch.min_blocks for launch in low["llvm"].launches] == [blocks]
        assert re.findall(r"\.minnctapersm (\d+)", low.as_text("ptx")) == ([str(blocks)] if blocks else [])


@needs_cc
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_kernels_compute_the_reference_results(name):
    fn, specs = WORKLOADS[name]
    args = rng_arrays(1, *specs)
    closed, low = _lowered(fn, args)
    all_args = list(closed.consts) + args
    _check(closed.graph, all_args, emulator.run_program(low["llvm"], all_args), name)


def _tanh_chain(x):
    for i in range(20):
        x = glue.numpy.tanh(x * 1.01 + 0.1 * (i % 3))
    return x


@pytest.mark.parametrize("size", [1000, 16384], ids=["ragged grid", "whole blocks"])
def test_a_long_math_chain_computes_one_point_a_thread_with_one_copy_of_its_body(size):
    """20 tanh are bound by arithmetic: no vector lanes, unrolled groups or unchecked twin of
    the body (each another copy for LLVM and ptxas); one load and one store in the PTX. On the
    emulator it computes the reference's values."""
    x = np.linspace(-3, 3, size, dtype=np.float32)
    closed, low = _lowered(_tanh_chain, [x])
    (launch,) = low["llvm"].launches
    assert launch.strategy == "pointwise x1 unroll 1"
    ptx = low.as_text("ptx")
    assert len(re.findall(r"\bld\.global", ptx)) == 1 and len(re.findall(r"\bst\.global", ptx)) == 1
    if emulator.available():
        all_args = list(closed.consts) + [x]
        _check(closed.graph, all_args, emulator.run_program(low["llvm"], all_args), "tanh chain")


@needs_cc
@pytest.mark.parametrize("online", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16])
def test_long_rows_with_special_values_match_the_reference(dtype, online):
    """A softmax over rows too long for registers (the looping variant, in three passes or with
    the online max and sum) matches the reference on rows with -inf entries, huge values, an
    all -inf row and a NaN."""
    rows = np.random.default_rng(3).standard_normal((4, 40000)).astype(np.float32) * 30
    rows[0, ::7] = -np.inf
    rows[1, 12345] = 6e4 if dtype == np.float16 else 3e38  # near the largest finite value
    rows[2] = -np.inf
    rows[3, 39999] = np.nan
    x = rows.astype(dtype)
    with config.override(cuda_online_row_elements=0 if online else 1 << 30):
        closed, low = _lowered(softmax, [x])
        program = low["llvm"]
    assert program.launches[0].strategy.startswith("rows looping online" if online else "rows looping x")
    _check(closed.graph, [x], emulator.run_program(program, [x]), "long-row softmax")


def test_long_row_chunk_loops_unroll_whole_only_on_sm90():
    """LLVM may unroll a long row's chunk loop whole on sm_90 (measured fastest there); older
    targets cap it at OLD_ARCH_CHUNK_COPIES copies, which their ptxas fits without spilling."""
    fn, specs = WORKLOADS["softmax_long_bf16"]
    closed = glue.make_ir(fn)(*rng_arrays(0, *specs))
    for arch, hint in (("sm_90", False), ("sm_80", True)):
        text = CudaBackend().lower(closed.graph, arch=arch, gemm="codegen").as_text("llvm")
        counts = re.findall(r'!"llvm.loop.unroll.count", i32 (\d+)', text)
        assert set(counts) == ({str(rows_codegen.OLD_ARCH_CHUNK_COPIES)} if hint else set()), (arch, counts)


@needs_cc
@pytest.mark.parametrize("name", ["softmax_long", "softmax_long_bf16", "xent_long"])
def test_online_long_rows_compute_the_reference_results(name):
    """The long-row workloads with every looping row folding its max and sum in one pass."""
    fn, specs = WORKLOADS[name]
    args = rng_arrays(1, *specs)
    with config.override(cuda_online_row_elements=0):
        closed, low = _lowered(fn, args)
        program = low["llvm"]
    assert any("online" in launch.strategy for launch in program.launches)
    all_args = list(closed.consts) + args
    _check(closed.graph, all_args, emulator.run_program(program, all_args), name)


@needs_cc
@given(st.data())
@settings(max_examples=25, deadline=None)
def test_random_programs_match_the_reference(data):
    graph = data.draw(programs(dtypes=ALL_DTYPES, max_eqns=6))
    inputs = data.draw(graph_inputs(graph))
    program = build_program(schedule(graph), "random")
    for poison in (0xFF, 0x00):  # an element no kernel writes fails under one of the two
        _check(graph, inputs, emulator.run_program(program, inputs, poison), "random program")


@needs_cc
@given(st.data())
@settings(max_examples=25, deadline=None)
def test_random_programs_with_every_argument_donated_match_the_reference(data):
    """Donation lets outputs take the memory of inputs their kernel reads where it writes, and
    several outputs of one kernel may cross (one takes what another reads): each kernel must
    read all of a point's inputs before it writes any output there."""
    graph = data.draw(programs(dtypes=ALL_DTYPES, max_eqns=8))
    inputs = data.draw(graph_inputs(graph))
    program = build_program(schedule(graph, donated=range(len(graph.invars))), "donated")
    _check(graph, inputs, emulator.run_program(program, [np.array(a) for a in inputs]), "random program, donated")


@needs_ptxas
@given(programs(dtypes=ALL_DTYPES, max_eqns=6))
@settings(max_examples=10, deadline=None)
def test_random_programs_assemble(graph):
    plan = schedule(graph)
    for arch in ARCHS + ["sm_75"]:
        for module in build_program(plan, "random", arch).llvm_modules().values():
            assemble(ptx_for_module(module, arch), arch)


@needs_cc
@pytest.mark.parametrize("name, fn, args", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_numpy_and_nn_functions_on_the_emulator(name, fn, args):
    closed, low = _lowered(fn, args)
    inputs = list(closed.consts) + list(args)
    _check(closed.graph, inputs, emulator.run_program(low["llvm"], inputs), name)


def test_a_program_without_kernels_lowers_to_no_ptx():
    closed = glue.make_ir(lambda x: (x, 2.0))(np.ones(3, np.float32))
    low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen")
    assert low["llvm"].launches == [] and ".entry" not in low.as_text("ptx")
    assert [r.kind for r in low["llvm"].results] == ["argument", "literal"]


@needs_cc
@pytest.mark.parametrize("dtype", dt.INT_DTYPES, ids=str)
@pytest.mark.parametrize("group", sorted(integer_cases.CASES))
def test_full_range_integers_match_the_reference(group, dtype):
    """Integer semantics at full range (see `tests/backend_cpu/integer_cases.py`): the cuda
    kernels, run by the emulator, give the reference's bits, and their PTX assembles."""
    @settings(max_examples=max(2, settings.default.max_examples // 10), deadline=None)
    @given(integer_cases.case(group, dtype))
    def check(drawn):
        graph, args = drawn
        program = build_program(schedule(graph), group.replace(" ", "_"))
        for i, (got, want) in enumerate(zip(emulator.run_program(program, args), run_graph(graph, args))):
            assert integer_cases.same(got, want), f"output {i} of\n{graph}\ninputs {args}\ngot {got!r}\nwant {want!r}"
        if ptxas_available():
            for module in program.llvm_modules().values():
                assemble(ptx_for_module(module, "sm_90"), "sm_90")
    check()
