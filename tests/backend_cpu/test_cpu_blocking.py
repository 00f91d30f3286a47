"""Blocked contractions (`matmul.py`) and column reductions (`kernels.py`) on the cpu backend.

Contractions: the sums run over k in order whatever the blocking, so changing the k-block,
the column and row blocks or the thread split must not change a single bit; and every shape,
odd or not, matches the float64 reference. Column reductions (x.sum(0) and kin) must match the
reference too, also when a thread's share of the work starts or ends inside a line.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cpu.target import host
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch
from glue.settings import config

RNG = np.random.default_rng(7)
# float64 operands are part of what is tested.
pytestmark = pytest.mark.usefixtures("x64")


def _blocking(kc: int | None = None, panels: int | None = None, sums_rows: int | None = None, size: int = 4):
    """Patch matmul's budgets so that k-blocks hold `kc` steps, a unit's B block `panels`
    column panels and its partial sums about `sums_rows` rows (None: the defaults); the
    blocked path applies to any size."""
    step = 2 * host().vector_bits // 8  # bytes of one packed B panel row (NR elements)
    values = {"cpu_matmul_min_work": 0}
    if kc is not None:
        values["cpu_matmul_l1_bytes"] = kc * step
    if panels is not None:
        values["cpu_matmul_l2_bytes"] = panels * (kc or 1) * step
    if sums_rows is not None:
        values["cpu_matmul_sums_bytes"] = sums_rows * (panels or 1) * step
    return config.override(**values)


def _run(fn, *args):
    compiled = glue.jit(fn, backend="cpu").lower(*args).compile()
    assert any(k.kind == "contraction" for k in compiled.kernels)
    return np.asarray(compiled(*args))


def _close(got, want, dtype, scale=1.0):
    problem = mismatch(np.asarray(got), want, dtype, scale)
    assert problem is None, problem


def _data(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _matmul(a, b):
    return a @ b


def _transposed_left(a, b):  # a is stored k-major: left is read down its columns
    return a.T @ b


def _casted_left(a, b):  # a cast in the operand: left goes through the packed copy
    return a.astype(gnp.float32) @ b


def _epilogue(a, b, bias):
    return gnp.tanh(a @ b + bias)


# --- contractions: the blocking changes no bit ----------------------------------------------

CASES = {  # name: (fn, left operand's shape and dtype for a right operand of float `dtype`)
    "plain": (_matmul, lambda dtype: _data(13, 300, dtype=dtype)),
    "transposed left": (_transposed_left, lambda dtype: _data(300, 13, dtype=dtype)),
    "cast left": (_casted_left, lambda dtype: _data(13, 300, dtype=np.float16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_k_blocks_continue_the_stored_partial_sums_bit_for_bit(case, dtype):
    fn, left = CASES[case]
    a, b = left(dtype), _data(300, 45, dtype=dtype)
    with _blocking(kc=10 ** 6):
        unblocked = _run(fn, a, b)  # one k-block: the sums never leave the registers
    with _blocking():
        np.testing.assert_array_equal(_run(fn, a, b), unblocked)  # K = 300: 256 steps, then 44
    for kc, panels, rows in [(1, 1, 1), (7, 2, 13), (64, 1, 6), (299, 3, 100)]:
        with _blocking(kc, panels, rows):
            np.testing.assert_array_equal(_run(fn, a, b), unblocked, err_msg=f"kc={kc}")
    want = np.asarray(fn(a.astype(np.float64), b.astype(np.float64)))
    _close(unblocked, want, dt.BY_NAME["f32" if np.result_type(a, b) == np.float32 else "f64"], scale=8.0)


def test_thread_split_changes_no_bit():
    a, b, bias = _data(50, 70), _data(70, 90), _data(90)
    with _blocking(kc=16):
        with config.override(cpu_parallel_threshold=0):
            split = _run(_epilogue, a, b, bias)
        with config.override(cpu_parallel_threshold=1 << 62):
            alone = _run(_epilogue, a, b, bias)
    np.testing.assert_array_equal(split, alone)


# --- contractions against the reference -----------------------------------------------------

@pytest.mark.parametrize("m, k, n", [(1, 1, 16), (5, 3, 17), (6, 256, 16), (7, 257, 33), (31, 513, 47),
                                     (32, 256, 256)])
def test_odd_shapes_and_k_not_a_multiple_of_the_block(m, k, n):
    a, b, bias = _data(m, k), _data(k, n), _data(n)
    with _blocking():
        got = _run(_epilogue, a, b, bias)
    _close(got, np.tanh(a.astype(np.float64) @ b + bias), dt.float32, scale=8.0)


@pytest.mark.parametrize("spec, left", [("mjk,jkn->mn", (23, 9, 13)), ("jkm,jkn->mn", (9, 13, 23)),
                                         ("mkj,jkn->mn", (23, 13, 9))])
def test_contractions_over_two_reduce_dims(spec, left):
    """The micro-kernel reads left in place, walking it by one stride per step of the flat
    reduce index over both reduce dims (unit stride, or the row count when left is k-major);
    every k-blocking gives the same bits."""
    a, b = _data(*left), _data(9, 13, 40)

    def fn(a, b):
        return gnp.einsum(spec, a, b)
    with _blocking():
        whole = _run(fn, a, b)
    for kc in (1, 5, 13, 50):
        with _blocking(kc, 1, 6):
            np.testing.assert_array_equal(_run(fn, a, b), whole, err_msg=f"kc={kc}")
    _close(whole, np.einsum(spec, a.astype(np.float64), b), dt.float32, scale=8.0)


@settings(max_examples=max(25, settings.default.max_examples))
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 70), st.integers(1, 50), st.integers(1, 9),
       st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_random_batched_contractions_match_the_reference(batch, m, k, n, kc, transpose, dtype):
    a = _data(batch, k, m, dtype=dtype) if transpose else _data(batch, m, k, dtype=dtype)
    b = _data(batch, k, n, dtype=dtype)

    def fn(a, b):
        return gnp.einsum("bkm,bkn->bmn" if transpose else "bmk,bkn->bmn", a, b)
    with _blocking(kc=kc, panels=2, sums_rows=12):
        got = _run(fn, a, b)
    want = np.einsum("bkm,bkn->bmn" if transpose else "bmk,bkn->bmn", a.astype(np.float64), b)
    _close(got, want, dt.BY_NAME["f32" if dtype == np.float32 else "f64"], scale=4.0)


# --- column reductions ---------------------------------------------------------------------

def _reduction_kernel(fn, x):
    """The one reduction kernel `fn(x)` compiles to (a column reduction's units come in lines
    as long as the last parallel dim; a row loop's one at a time)."""
    kernels = [k for k in glue.jit(fn, backend="cpu").lower(x).compile().kernels if k.kind == "reduction"]
    assert len(kernels) == 1
    return kernels[0]


REDUCERS = {
    "sum": (lambda x: x.sum(0), lambda x: x.sum(0)),
    "mean": (lambda x: x.mean(0), lambda x: x.mean(0)),
    "max": (lambda x: x.max(0), lambda x: x.max(0)),
    "min": (lambda x: x.min(0), lambda x: x.min(0)),
    "sum and max": (lambda x: (x * 2.0).sum(0) + x.max(0), lambda x: (x * 2.0).sum(0) + x.max(0)),
}


@settings(max_examples=max(25, settings.default.max_examples))
@given(st.integers(1, 300), st.integers(8, 70), st.sampled_from(sorted(REDUCERS)),
       st.sampled_from(["f32", "f64", "f16", "i32"]))
def test_random_column_reductions_match_the_reference(rows, cols, name, dtype):
    gfn, nfn = REDUCERS[name]
    exact = dtype == "i32" and name in ("sum", "max", "min")
    x = RNG.integers(-1000, 1000, (rows, cols)).astype(np.int32) if exact else \
        _data(rows, cols, dtype=dt.BY_NAME["f32" if dtype == "i32" else dtype].numpy)
    assert _reduction_kernel(gfn, x).row == cols
    got = np.asarray(glue.jit(gfn, backend="cpu")(x))
    if exact:
        np.testing.assert_array_equal(got, nfn(x))
    else:
        _close(got, nfn(x.astype(np.float64)), dt.from_numpy(got.dtype), scale=2.0)


def test_long_column_sums_stay_accurate():
    x = _data(4096, 64) + 3.0  # a large common part makes a plain running sum drift
    _close(glue.jit(lambda x: x.sum(0), backend="cpu")(x), x.astype(np.float64).sum(0), dt.float32)


@pytest.mark.parametrize("shape, axis", [((3000, 100), 0), ((3, 500, 40), 1), ((4, 6, 33), (0, 1))])
def test_column_reductions_split_over_threads_inside_a_line(shape, axis):
    x = _data(*shape)
    fn = lambda x: x.sum(axis)  # noqa: E731
    assert _reduction_kernel(fn, x).row == shape[-1]
    with config.override(cpu_parallel_threshold=0):
        got = glue.jit(fn, backend="cpu")(x)
    _close(got, x.astype(np.float64).sum(axis), dt.float32, scale=2.0)


def test_row_sums_keep_the_row_loop():
    x = _data(64, 100)
    assert _reduction_kernel(lambda x: x.sum(-1), x).row == 1
