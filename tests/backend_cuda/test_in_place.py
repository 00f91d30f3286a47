"""Kernels that write outputs over the inputs they read (donated optimizer state, in-place
intermediates): every backend computes all of a point's stored values before it stores any.

The memory plan may give an output the buffer of any input its kernel reads only where it
writes, and with several outputs it may cross them: in a fused AdamW the new first moment can
take the old second moment's buffer. A kernel that stored the new first moment and then read
the second moment would read that store back. These updates run, with all their state donated,
on the CPU backend, on the GPU kernels under the emulator (the CUDA-core and the tensor-core
contraction, the pointwise and row kernels, vectorised and not) and on a GPU, against the
reference.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import tree_util
from glue.backend_cuda import CudaBackend
from glue.reference import run_graph
from glue.reference.compare import mismatch, tolerance_dtypes
from tests.backend_cuda import emulator

BF16 = ml_dtypes.bfloat16
needs_cc = pytest.mark.skipif(not emulator.available(), reason="the emulator needs a C compiler")


def adamw(grad, p, m, v):
    """One AdamW update from `grad`, returning (m, p, v): each new value reads all three old
    ones; the kernel reads them m, v, p, and with its outputs matched to donors in the order
    m, p, v, the new weight takes the old second moment's buffer."""
    m = 0.9 * m + 0.1 * grad
    v = 0.95 * v + 0.05 * grad * grad
    p = p - 3e-3 * (m / (gnp.sqrt(v) + 1e-8) + 0.1 * p)
    return m, p, v


def weight_update(x, dy, p, m, v):
    """A weight gradient with the update fused after it (a contraction's epilogue)."""
    return adamw(x.T @ dy, p, m, v)


def pointwise_update(g, p, m, v):
    return adamw(g, p, m, v)


def row_update(g, p, m, v):
    """The update of a gradient clipped by its rows' norms (a row kernel's element stores)."""
    norm = gnp.sqrt(gnp.sum(g * g, axis=-1, keepdims=True)) + 1.0
    return adamw(g / norm, p, m, v)


def column_update(x, dy, p, m, v):
    """A bias gradient with the update fused after it (a reduction's row-level stores), the
    bias read inside the sum it updates from (as a GELU's backward reads its bias)."""
    return adamw(gnp.sum(dy * gnp.tanh(x + p), axis=0), p, m, v)


def _arguments(update, rows: int, cols: int, dtype, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)

    if update is column_update:
        return [normal(rows, cols), normal(rows, cols), normal(cols), normal(cols) * 0.1, np.abs(normal(cols)) + 0.5]
    state = [normal(rows, cols), normal(rows, cols) * 0.1, np.abs(normal(rows, cols)) + 0.5]
    if update is weight_update:
        tokens = 24
        return [normal(tokens, rows), normal(tokens, cols)] + state
    return [normal(rows, cols)] + state


def _closed(update, args):
    closed = glue.make_ir(update)(*args)
    n = len(args)
    return closed, list(closed.consts) + list(tree_util.tree_leaves(args)), list(range(n - 3, n))


def _check(closed, args, got, label):
    want = run_graph(closed.graph, [np.asarray(a) for a in args], float64=True)
    for i, (g, w, d) in enumerate(zip(got, want, tolerance_dtypes(closed.graph, tf32=True))):
        problem = mismatch(np.asarray(g), w, d if d is not None else closed.graph.out_types[i].dtype, scale=4.0)
        assert problem is None, f"{label}, output {i}: {problem}"


def _crossed(low) -> bool:
    """Whether some output (m, p, v) took the buffer of a donated input (p, m, v) other than
    its own old value."""
    plan = low["llvm"].plan
    graph = plan.graph
    n = len(graph.constvars) + len(graph.invars)
    own = (n - 2, n - 3, n - 1)
    placed = [plan.memory.placements[v.id] for v in graph.outvars]
    return any(p.kind == "donated" and p.slot != mine for p, mine in zip(placed, own))


UPDATES = {"contraction": weight_update, "pointwise": pointwise_update, "rows": row_update,
           "columns": column_update}
SHAPES = st.tuples(st.sampled_from([1, 3, 16, 33, 64]), st.sampled_from([1, 5, 8, 40, 128]))


@needs_cc
@settings(max_examples=16)
@given(kind=st.sampled_from(sorted(UPDATES)), shape=SHAPES, dtype=st.sampled_from([np.float32, BF16]),
       tile=st.sampled_from([None, "64x64x32/2x2"]), seed=st.integers(0, 2 ** 16))
def test_updates_with_donated_state_match_the_reference_on_the_emulator(kind, shape, dtype, tile, seed):
    update = UPDATES[kind]
    args = _arguments(update, *shape, dtype, seed)
    closed, flat, donated = _closed(update, args)
    with glue.config.override(cuda_mma_tile=tile):
        low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen", donated=donated)
    _check(closed, flat, emulator.run_program(low["llvm"], [np.array(a) for a in flat], variant="codegen"),
           f"{kind} {shape} {np.dtype(dtype).name} tile {tile}")


@needs_cc
def test_the_fused_adamw_crosses_its_donors_and_still_matches():
    """The case that broke the GPU training step: a weight gradient whose fused update writes
    a new moment over another old value it then reads (the plan's choice, checked here), on
    both contraction kernels."""
    args = _arguments(weight_update, 64, 192, np.float32, 0)
    closed, flat, donated = _closed(weight_update, args)
    for tile in (None, "64x64x32/2x2"):
        with glue.config.override(cuda_mma_tile=tile):
            low = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen", donated=donated)
        assert _crossed(low)
        _check(closed, flat, emulator.run_program(low["llvm"], [np.array(a) for a in flat], variant="codegen"),
               f"tile {tile}")


def test_a_fused_bias_update_writes_all_its_state_over_its_donors():
    """p is read inside the fold (at the row it updates), m and v only after it: all three
    new values take donated buffers, none a fresh one."""
    args = _arguments(column_update, 64, 96, np.float32, 0)
    closed, _, donated = _closed(column_update, args)
    plan = CudaBackend().lower(closed.graph, arch="sm_90", donated=donated)["plan"]
    assert [r.kind for r in plan.results()] == ["donated"] * 3, plan.as_text("memory")


@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_updates_with_donated_state_match_the_reference_on_the_cpu(kind):
    update = UPDATES[kind]
    for shape in ((64, 192), (33, 5)):
        args = _arguments(update, *shape, np.float32, 1)
        closed, flat, _ = _closed(update, args)
        donated = glue.jit(update, backend="cpu", donate_argnums=(len(args) - 3, len(args) - 2, len(args) - 1))
        _check(closed, flat, donated(*[np.array(a) for a in args]), f"{kind} {shape}")


@pytest.mark.cuda
@pytest.mark.parametrize("gemm", ["codegen", "library"])
@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_updates_with_donated_state_match_the_reference_on_the_gpu(kind, gemm):
    update = UPDATES[kind]
    for shape, dtype in (((64, 192), np.float32), ((256, 512), BF16), ((33, 5), np.float32)):
        args = _arguments(update, *shape, dtype, 2)
        closed, flat, _ = _closed(update, args)
        n = len(args)
        with glue.config.override(gemm=gemm):
            donated = glue.jit(update, backend="cuda", donate_argnums=(n - 3, n - 2, n - 1))
            got = donated(*[glue.device_put(a, "cuda") for a in args])
        _check(closed, flat, [np.asarray(g) for g in got], f"{kind} {shape} {np.dtype(dtype).name} {gemm}")
