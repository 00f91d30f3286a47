"""Column reductions (codegen/columns.py): reductions over the strided dims of rows that are the
contiguous dim of their data — the norms' weight gradients, bias gradients, with the optimizer
update they feed — run with coalesced loads and the reduced points split over blocks: on sm_90 a cluster's blocks,
meeting in distributed shared memory, before that the last block of a tile combining the splits
from global scratch. Both checked on the CPU emulator (which runs a cluster's blocks at once)
and, on a GPU, over repeated graph replays (the counters must come back to zero)."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.reference import run_graph
from glue.reference.compare import mismatch, tolerance_dtypes
from tests.backend_cuda import emulator

RNG = np.random.default_rng(3)
BF16 = ml_dtypes.bfloat16
needs_cc = pytest.mark.skipif(not emulator.available(), reason="the emulator needs a C compiler")


def _norm_grads(x, dy, g):
    xh = x - x.mean(-1, keepdims=True)
    return (dy * xh).sum(0), dy.sum(0), g - 0.1 * (dy * xh).sum(0)


def _qkv_bias_grad(dq, dk, dv):
    rows = [gnp.swapaxes(d, 1, 2).reshape(d.shape[0], d.shape[2], -1) for d in (dq, dk, dv)]
    return gnp.concatenate(rows, axis=-1).sum((0, 1))


def _many_row_outputs(x, dy, w):
    """Three sums over the tokens and nine values from them per feature (a norm's backward
    with its weights' optimizer updates): too many live values per row for 8 bf16 rows a thread."""
    f32 = gnp.float32
    sums = ((x * dy).astype(f32).sum(0), dy.astype(f32).sum(0), x.astype(f32).sum(0))
    w = w.astype(f32)
    return sums + tuple(s * w for s in sums) + tuple(s - 0.5 * w for s in sums)


CASES = {
    "norm weight and bias grads": (_norm_grads, [(1024, 256), (1024, 256), (256,)], np.float32, True),
    "bias grad over batch and tokens": (lambda dy: dy.sum((0, 1)), [(4, 96, 384)], np.float32, True),
    "ragged rows": (lambda dy: dy.sum(0), [(300, 70)], np.float32, True),
    "one split": (lambda dy: dy.sum(0), [(8, 512)], np.float32, True),
    "max and min": (lambda x: (x.max(0), x.min(0)), [(640, 128)], np.float32, True),
    "bf16 inputs": (lambda x, y: (x * y).astype(gnp.float32).sum(0), [(512, 256), (512, 256)], BF16, True),
    "row sums stay rows": (lambda x: x.sum(-1), [(256, 1024)], np.float32, False),
    "with an element output": (lambda x, y: ((x * y).sum(0), x * y + 1.0), [(512, 128), (512, 128)], np.float32, True),
    "element output needing the sum": (lambda x: x - x.sum(0), [(512, 128)], np.float32, False),
    # a norm's gradients at GPT-2 width: 24 tiles of 32 row groups, slices and splits
    "wide norm grads": (_norm_grads, [(2048, 768), (2048, 768), (768,)], np.float32, True),
    "fewer points than slices": (lambda dy: (dy.sum(0), dy.max(0)), [(3, 1000)], np.float32, True),
    # the qkv bias gradient: heads (B, H, T, D) back to (B, T, H*D) and concatenated, the rows
    # contiguous only over runs of D = 64 (the loads are masked by the concatenation)
    "bias grad through heads": (_qkv_bias_grad, [(2, 4, 48, 64)] * 3, np.float32, True),
    "bias grad through narrow heads": (_qkv_bias_grad, [(2, 4, 40, 16)] * 3, np.float32, False),
    "many row outputs, bf16": (_many_row_outputs, [(512, 256), (512, 256), (256,)], BF16, True),
    # the stored value is the summed one (an SGD step's weight gradient and its momentum update)
    "element output the sum shares": (lambda x, y: ((x * y - x).sum(0), x * y - x), [(32, 10), (32, 10)],
                                      np.float32, True),
}


def _args(shapes, dtype):
    return [RNG.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


ARCHS = ["sm_80", "sm_90a"]  # the splits meet in global scratch, or in a cluster


def _program(fn, args, arch="sm_90a"):
    closed = glue.make_ir(fn)(*args)
    return closed, CudaBackend().lower(closed.graph, name="cols", gemm="codegen", arch=arch)


@pytest.mark.parametrize("name", sorted(CASES))
def test_column_reductions_take_the_column_strategy(name):
    fn, shapes, dtype, columns = CASES[name]
    _, low = _program(fn, _args(shapes, dtype))
    strategies = [l.strategy for l in low["llvm"].launches]
    assert any(s.startswith("columns") for s in strategies) == columns, strategies


@needs_cc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_column_reductions_compute_the_reference(name, arch):
    fn, shapes, dtype, _ = CASES[name]
    args = _args(shapes, dtype)
    closed, low = _program(fn, args, arch)
    outs = emulator.run_program(low["llvm"], list(closed.consts) + args)
    want = run_graph(closed.graph, list(closed.consts) + args, float64=True)
    for i, (got, w, d) in enumerate(zip(outs, want, tolerance_dtypes(closed.graph, tf32=CudaBackend.rounds_to_tf32))):
        assert mismatch(got, w, d, scale=8.0) is None, (name, i, mismatch(got, w, d, scale=8.0))


@needs_cc
@settings(max_examples=10)
@given(points=st.integers(1, 3000), rows=st.integers(1, 600), op=st.sampled_from(["sum", "max"]),
       arch=st.sampled_from(ARCHS))
def test_any_shape_of_column_reduction_computes_the_reference(points, rows, op, arch):
    """Every split of the points over blocks and slices, ragged tiles and runs, against the
    reference: each point is folded exactly once, and each row group's slices and splits meet
    in a fixed order, in global scratch or in a cluster."""
    fn = (lambda x: x.sum(0)) if op == "sum" else (lambda x: x.max(0))
    args = _args([(points, rows)], np.float32)
    closed, low = _program(fn, args, arch)
    outs = emulator.run_program(low["llvm"], list(closed.consts) + args)
    want = run_graph(closed.graph, list(closed.consts) + args, float64=True)
    d = tolerance_dtypes(closed.graph)[0]
    assert mismatch(outs[0], want[0], d, scale=8.0) is None, [l.strategy for l in low["llvm"].launches]


@needs_cc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.bool_],
                         ids=["f16", "f64", "i32", "i64", "bool"])
def test_partials_of_every_type_cross_between_blocks(dtype, arch):
    """A partial travels between blocks as 32 or 64 bits (a cluster's `st.async`) or in an
    8-byte scratch slot: half floats, doubles, 64-bit integers and booleans come back intact."""
    x = RNG.standard_normal((512, 128)) * 4
    x = (x > 0) if dtype == np.bool_ else x.astype(dtype)
    fn = (lambda x: x.max(0)) if dtype == np.bool_ else (lambda x: (x.sum(0), x.max(0)))
    closed, low = _program(fn, [x], arch)
    assert any("combines" in l.strategy for l in low["llvm"].launches)
    outs = emulator.run_program(low["llvm"], list(closed.consts) + [x])
    want = run_graph(closed.graph, list(closed.consts) + [x], float64=True)
    for got, w, d in zip(outs, want, tolerance_dtypes(closed.graph)):
        assert mismatch(got, w, d, scale=8.0) is None, mismatch(got, w, d, scale=8.0)


def test_a_thread_takes_fewer_rows_when_each_has_many_live_values():
    """bf16 rows would be 8 to a thread (one 16-byte vector); with twelve live values per row
    (three sums, nine row outputs) a thread takes 4, below HEAVY_VALUES, and the grid twice the
    row groups. A kernel with one sum keeps 8."""
    fn, shapes, dtype, _ = CASES["many row outputs, bf16"]
    _, low = _program(fn, _args(shapes, dtype))
    assert [l.strategy.split()[1] for l in low["llvm"].launches if l.strategy.startswith("columns")] == ["x4"]
    fn, shapes, dtype, _ = CASES["bf16 inputs"]
    _, low = _program(fn, _args(shapes, dtype))
    assert [l.strategy.split()[1] for l in low["llvm"].launches if l.strategy.startswith("columns")] == ["x8"]


def test_identical_layers_are_planned_once(monkeypatch):
    """The layers of a model share their kernels' expressions, so whether a reduction runs by
    columns, and its plan (and a contraction's warpgroup plan), is decided once per structure,
    not once a launch: the warm 16-layer step's "llvm" stage spent half its time deciding them
    again. Six layers here are three structures (the first, the last, those between)."""
    from glue.backend_cuda import codegen

    asked = []
    real = codegen.columns_fit
    monkeypatch.setattr(codegen, "columns_fit", lambda *a: asked.append(1) or real(*a))

    def loss(ws, x):
        for m, b in ws:
            x = gnp.tanh(x @ m + b)  # b's gradient: a column reduction a layer
        return gnp.sum(x)

    x, ws = np.ones((1024, 256), np.float32), [(np.eye(256, dtype=np.float32), np.ones(256, np.float32))] * 6
    closed = glue.make_ir(glue.grad(loss))(ws, x)
    low = CudaBackend().lower(closed.graph, name="layers", arch="sm_90a")
    columns = [l for l in low["llvm"].launches if l.strategy.startswith("columns")]
    assert len(columns) == 6 and len(asked) <= 3, (len(columns), len(asked))


def test_before_sm_90_the_splits_use_scratch_and_counters_and_ptxas_accepts_them():
    from glue.backend_cuda.ptx import assemble, ptxas_available

    fn, shapes, dtype, _ = CASES["norm weight and bias grads"]
    _, low = _program(fn, _args(shapes, dtype), "sm_80")
    program = low["llvm"]
    assert program.counters > 0 and sum(program.scratch) > 0
    modules = low["ptx"].modules
    assert any("atom.global.add.u32" in ptx and "fence.acq_rel.gpu" in ptx for ptx in modules.values())
    if ptxas_available():
        for ptx in modules.values():
            assert "0 bytes spill stores" in assemble(ptx, "sm_80")


@pytest.mark.parametrize("name", ["norm weight and bias grads", "many row outputs, bf16", "wide norm grads"])
def test_on_sm_90_the_splits_are_a_cluster_and_need_no_scratch(name):
    """The splits of a tile are a cluster's blocks (8 at most, fixed in the PTX): the others
    send their partials into the first block's shared memory, counted by an mbarrier there. No
    global scratch, no counters, and no release at GPU scope (a fence, or a releasing cluster
    barrier, waits for every global store in flight): one relaxed cluster barrier, at the start."""
    from glue.backend_cuda.ptx import assemble, ptxas_available

    fn, shapes, dtype, _ = CASES[name]
    _, low = _program(fn, _args(shapes, dtype))
    program = low["llvm"]
    clustered = [l for l in program.launches if "a cluster combines" in l.strategy]
    assert clustered and program.counters == 0 and sum(program.scratch) == 0, [l.strategy for l in program.launches]
    for launch in clustered:
        splits = int(launch.strategy.split("splits ")[1].split()[0])
        ptx = low["ptx"].modules[launch.symbol]
        assert 1 < splits <= 8 and launch.grid % splits == 0
        assert f".reqnctapercluster {splits}, 1, 1" in ptx and "mapa.shared::cluster" in ptx
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx
        assert ptx.count("barrier.cluster.arrive") == ptx.count("barrier.cluster.arrive.relaxed") == 1
        assert "fence.acq_rel" not in ptx and "membar" not in ptx and "atom" not in ptx
        if ptxas_available():
            assert "0 bytes spill stores" in assemble(ptx, "sm_90a")


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_the_gpu_repeated_calls_and_graph_replays_stay_correct(name):
    fn, shapes, dtype, _ = CASES[name]
    f = glue.jit(fn, backend="cuda", backend_options={"gemm": "codegen"})
    args = [glue.device_put(a, "cuda") for a in _args(shapes, dtype)]
    closed = glue.make_ir(fn)(*[np.asarray(a) for a in args])
    want = run_graph(closed.graph, list(closed.consts) + [np.asarray(a) for a in args], float64=True)
    for _ in range(4):  # direct launches, a capture, replays: each must find the counters at zero
        outs = f(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for got, w, d in zip(outs, want, tolerance_dtypes(closed.graph, tf32=CudaBackend.rounds_to_tf32)):
            assert mismatch(np.asarray(got), w, d, scale=8.0) is None
