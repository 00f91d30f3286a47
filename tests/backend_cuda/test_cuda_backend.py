"""The cuda backend on a GPU (every test is marked `cuda`): random programs against the reference,
every glue.numpy and glue.nn function, the model workloads at sizes that take every kernel
variant, device-resident arrays between calls, donation, and outputs poisoned before each run so
that an element no kernel writes fails."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.ir import dtypes as dt
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.testing import check
from glue.testing.check import tolerance_dtypes
from glue.testing.strategies import graph_inputs, programs
from tests.backend_cuda.cases import ALL_CASES, assert_matches_reference, BF16, WORKLOADS, f32, layernorm, rng_arrays, softmax, xent

pytestmark = pytest.mark.cuda
ALL_DTYPES = (dt.float32, dt.int32, dt.bool_, dt.bfloat16, dt.float16, dt.int64, dt.float64)
EXAMPLES = int(os.environ.get("GLUE_CUDA_EXAMPLES", "200"))


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every executable compiled in a test fills its outputs and arena with NaN bytes first."""
    monkeypatch.setenv("GLUE_CUDA_POISON", "0xff")


@given(st.data())
@settings(max_examples=EXAMPLES, deadline=None)
def test_random_programs_match_the_reference(data):
    graph = data.draw(programs(dtypes=ALL_DTYPES, max_eqns=8, max_side=6))
    inputs = data.draw(graph_inputs(graph))
    exe = CudaBackend().lower(graph, name="random").compile()
    for poison in (0xFF, 0x00):  # an unwritten element fails under one of the two
        exe.poison = poison
        assert_matches_reference(graph, inputs, exe(*inputs), f"random program (poison {poison:#x})")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads(name):
    fn, specs = WORKLOADS[name]
    args = rng_arrays(2, *specs)
    closed = glue.make_ir(fn)(*args)
    exe = CudaBackend().lower(closed.graph, name=name).compile()
    inputs = list(closed.consts) + args
    want = run_graph(closed.graph, inputs, float64=True)
    for got, w, d in zip(exe(*inputs), want, tolerance_dtypes(closed.graph, tf32=CudaBackend.rounds_to_tf32)):
        assert mismatch(np.asarray(got), w, d) is None


@pytest.mark.parametrize("fn, shapes", [
    (softmax, [(64, 5000)]), (softmax, [(3, 70000)]), (softmax, [(2, 300000)]), (softmax, [(1000, 7)]),
    (layernorm, [(33, 4096), (4096,), (4096,)]), (xent, [(16, 32000), (16, 32000)]),
    (xent, [(3, 150000), (3, 150000)]),
    (lambda x: (x.sum(0), x.max(1), gnp.argmax(x, axis=0)), [(3000, 40)]),
    (lambda x: x.sum(), [(1 << 20,)]),
])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_kernel_variants_at_size(fn, shapes, dtype):
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    check(fn, *args, backends=["cuda"])


@pytest.mark.parametrize("name, fn, args", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_numpy_and_nn_functions(name, fn, args):
    check(fn, *args, backends=["cuda"])
    floats = [a for a in args if a.dtype == np.float32]
    if floats and name not in ("astype",):  # the same function on bfloat16 inputs
        check(fn, *[a.astype(BF16) if a.dtype == np.float32 else a for a in args], backends=["cuda"])


# --- arrays on the device ---------------------------------------------------------------------

def device_put(x):
    return glue.device_put(x, "cuda")


def test_results_stay_on_the_device_and_feed_the_next_call():
    f = glue.jit(lambda x, y: gnp.tanh(x) * y, backend="cuda")
    x, y = f32(64, 128), f32(64, 128, seed=1)
    a = f(x, y)
    assert a.device_buffer is not None
    b = f(a, y)  # a device array in, no host round trip
    assert b.device_buffer is not None
    np.testing.assert_allclose(np.asarray(b.block_until_ready()), np.tanh(np.tanh(x) * y) * y, rtol=1e-5, atol=1e-6)
    d = device_put(x)
    np.testing.assert_array_equal(np.asarray(d), x)
    assert "glue.Array" in repr(f(d, y))


def test_outputs_that_are_inputs_or_literals_and_donation():
    def f(x, y):
        return x, 3.0, x * y + 1, y

    x, y = f32(4, 5), f32(4, 5, seed=1)
    out = glue.jit(f, backend="cuda")(x, y)
    np.testing.assert_array_equal(np.asarray(out[0]), x)
    assert float(out[1]) == 3.0
    np.testing.assert_allclose(np.asarray(out[2]), x * y + 1, rtol=1e-6)
    donated = glue.jit(lambda x, y: x * y + 1, backend="cuda", donate_argnums=0)
    np.testing.assert_allclose(np.asarray(donated(device_put(x), y)), x * y + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(donated(x, y)), x * y + 1, rtol=1e-6)


def test_analyses_and_stages():
    lowered = glue.jit(softmax, backend="cuda").lower(f32(8, 32))
    assert ".entry" in lowered.as_text("ptx") and "ptx_kernel" in lowered.as_text("llvm")
    compiled = lowered.compile()
    assert compiled.memory_analysis().peak_bytes >= 2 * 8 * 32 * 4
    assert compiled.cost_analysis().bytes_accessed >= 2 * 8 * 32 * 4
    assert [k.strategy for k in compiled.kernels][0].startswith("rows registers")
