"""Float sums and means stay accurate at any length, on the cpu backend and in the cuda
backend's kernels (run on the host by the emulator).

A float32 accumulator that adds ones stops growing at 2**24, and one that adds millions of
values drifts long before: the regression cases are sums whose naive accumulation visibly
drifts (1/3 added 2**25 times was off by 0.3%). Every result is compared with the float64
sum of the same float32 inputs; the bound is a small multiple of float32's epsilon times the
sum of magnitudes, whatever the length.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from tests.backend_cuda import emulator

EPS32 = float(np.finfo(np.float32).eps)
# The bound on |sum - exact| / sum |x|: the cpu backend adds blocks of 2048 elements in a few
# dozen vector accumulators (each adds up to 64 values in sequence, about 32 eps at worst, as
# any 2048-element row always did) and joins the blocks with a compensated sum; whatever the
# length, the error stays near that of one block. Before, it grew with the length (0.3% at 2**25).
BOUND = 32 * EPS32
THOROUGH = settings.get_current_profile_name() == "thorough"
# The property test's largest array: 2**25 elements (128 MiB) in CI, 2**28 (1 GiB) nightly.
MAX_LOG2 = 28 if THOROUGH else 25


def _available_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def _relative_error(got, x: np.ndarray, axis) -> float:
    """max |got - exact| / sum |x| over the outputs, exact being the float64 sum."""
    exact = np.sum(x, axis=axis, dtype=np.float64)
    scale = np.maximum(np.sum(np.abs(x), axis=axis, dtype=np.float64), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / scale))


@pytest.mark.parametrize("shape, axis", [
    ((2 ** 25,), None),           # one long row
    ((2 ** 12, 2 ** 13), None),   # a full sum over two reduce dims
    ((2 ** 21, 16), None),        # a short innermost dim: blocks span many of its rows
    ((4, 2 ** 23), -1),           # rows of 8M elements
    ((2 ** 22, 8), 0),            # a column reduction: 4M steps per column
    ((3, 5001), None),            # ragged last block
])
def test_cpu_sums_of_a_third_do_not_drift(shape, axis):
    x = np.full(shape, 1 / 3, np.float32)
    got = glue.jit(lambda x: x.sum(axis), backend="cpu")(x)
    assert _relative_error(got, x, axis) < BOUND


def test_cpu_mean_of_ones_past_the_float32_integers():
    """2**25 ones: every one counts (the accumulators used to stop at 2**24 each)."""
    x = np.ones(2 ** 25, np.float32)
    assert float(np.asarray(glue.jit(gnp.sum, backend="cpu")(x))) == 2.0 ** 25
    assert float(np.asarray(glue.jit(gnp.mean, backend="cpu")(x))) == 1.0


def test_cpu_long_sums_keep_inf_and_nan():
    """The compensation must not turn an overflow into NaN, nor lose a NaN."""
    f = glue.jit(gnp.sum, backend="cpu")
    x = np.ones(2 ** 16, np.float32)
    x[7] = np.inf
    assert np.asarray(f(x)) == np.inf
    x[9000] = -np.inf
    assert np.isnan(np.asarray(f(x)))
    big = np.full(2 ** 14, 3e38, np.float32)  # overflows partway through
    assert np.asarray(f(big)) == np.inf
    x = np.ones(2 ** 16, np.float32)
    x[60000] = np.nan
    assert np.isnan(np.asarray(f(x)))


@st.composite
def _long_arrays(draw):
    """A float32 array of 2**10 .. 2**MAX_LOG2 elements: a constant, uniform [0, 1), or
    normal values around an offset (cancellation), from a drawn seed."""
    n = 2 ** draw(st.integers(10, MAX_LOG2))
    kind = draw(st.sampled_from(["constant", "uniform", "offset normal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if kind == "constant":
        return np.full(n, draw(st.sampled_from([1 / 3, 0.1, 1.0, 7.25, -2.2])), np.float32)
    if kind == "uniform":
        return rng.random(n, dtype=np.float32)
    return (rng.standard_normal(n, dtype=np.float32) + np.float32(draw(st.sampled_from([0.0, 3.0]))))


_SUM = glue.jit(gnp.sum, backend="cpu")
_MEAN = glue.jit(gnp.mean, backend="cpu")


@settings(max_examples=40 if THOROUGH else 6)
@given(_long_arrays(), st.sampled_from(["sum", "mean", "rows"]))
def test_cpu_sums_and_means_match_float64_at_any_size(x, how):
    if how == "mean":
        got, want = np.asarray(_MEAN(x)), np.mean(x, dtype=np.float64)
        assert abs(float(got) - want) <= BOUND * float(np.mean(np.abs(x), dtype=np.float64))
        return
    if how == "rows":
        x = x.reshape(8, -1)
        assert _relative_error(glue.jit(lambda x: x.sum(-1), backend="cpu")(x), x, -1) < BOUND
        return
    assert _relative_error(_SUM(x), x, None) < BOUND


@pytest.mark.thorough
@pytest.mark.skipif(_available_bytes() < 10 * 2 ** 30, reason="needs 10 GiB of free memory")
def test_cpu_sum_of_two_to_the_31_ones_is_exact_within_one_ulp():
    x = np.ones(2 ** 31, np.float32)
    got = float(np.asarray(glue.jit(gnp.sum, backend="cpu")(x)))
    assert abs(got - 2.0 ** 31) <= float(np.spacing(np.float32(2.0 ** 31)))


@pytest.mark.thorough
@pytest.mark.skipif(_available_bytes() < 6 * 2 ** 30, reason="needs 6 GiB of free memory")
def test_cpu_mean_of_two_to_the_30_ones_is_one():
    """The issue's report: this gave 0.5."""
    assert float(np.asarray(glue.jit(gnp.mean, backend="cpu")(np.ones(2 ** 30, np.float32)))) == 1.0


needs_cc = pytest.mark.skipif(not emulator.available(), reason="no C compiler for the kernel emulator")


def _on_the_emulator(fn, x):
    closed = glue.make_ir(fn)(x)
    program = CudaBackend().lower(closed.graph, arch="sm_90", gemm="codegen")["llvm"]
    assert program.launches[0].strategy.startswith("rows looping")
    return emulator.run_program(program, [x])[0]


@needs_cc
@pytest.mark.parametrize("shape, axis", [((2 ** 22,), None), ((2, 2 ** 21), -1)])
def test_cuda_long_row_sums_do_not_drift(shape, axis):
    """A thread's share of these rows is 4096 elements (it was folded by one accumulator)."""
    x = np.full(shape, 1 / 3, np.float32)
    assert _relative_error(_on_the_emulator(lambda x: x.sum(axis), x), x, axis) < BOUND


@needs_cc
def test_cuda_online_log_sum_exp_of_long_rows_does_not_drift():
    """The online max-and-sum of exponentials compensates its running sum too."""
    x = np.ones((1, 2 ** 22), np.float32)  # 4096 elements per thread: it was off by 1.1e-5
    x[:, ::3] = 0.5

    def sum_exp(x):
        return gnp.exp(x - x.max(-1, keepdims=True)).sum(-1)
    with glue.config.override(cuda_online_row_elements=0):
        got = _on_the_emulator(sum_exp, x)
    want = np.exp(x.astype(np.float64) - 1).sum(-1)
    assert np.max(np.abs(got - want) / want) < BOUND
