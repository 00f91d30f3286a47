"""Float literals lifted out of pointwise kernels (glue/backend_cpu/literals.py): kernels that
differ only in the numbers they add and multiply by share one compiled code, and compute what the
reference computes, signed zeros, tiny and huge values and 16-bit dtypes included."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import glue
import glue.numpy as gnp
from glue.backend.kernel_key import kernel_structure
from glue.backend_cpu import literals
from glue.ir import dtypes as dt
from glue.reference import run_graph
from glue.reference.compare import mismatch


def _chain(ops: int):
    def chain(x):
        for i in range(ops // 3):
            x = gnp.tanh(x * 1.0001 + 0.01 * (i % 7))
        return x
    return chain


def _plan_kernels(fn, *args):
    return glue.jit(fn, backend="cpu").lower(*args).lowering["plan"].kernels


def test_kernels_differing_in_their_literals_share_code():
    """A 3,000-op chain whose constants repeat every 7 steps is twelve kernels of about 250 ops,
    each starting at another phase of the period: three structures (where in its three ops a
    step is cut), each kernel its own values."""
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    fn = _chain(3000)
    compiled = glue.jit(fn, backend="cpu").lower(x).compile()
    kernels = _plan_kernels(fn, x)
    lifted = [literals.lift(k) for k in kernels]
    assert all(found is not None for found in lifted)
    middle = lifted[1:-1]  # (the first and the last are shorter)
    assert len(middle) == 10 and len({"\n".join(kernel_structure(k)) for k, _ in middle}) == 3
    assert len({values for _, values in middle}) >= 7  # (the period's phases)
    assert len(compiled.compile_stats()["kernels"]) == 5  # distinct codes
    want = x.astype(np.float64)
    for i in range(1000):
        want = np.tanh(want * 1.0001 + 0.01 * (i % 7))
    assert mismatch(np.asarray(compiled(x)), want, dt.float32) is None


def test_what_is_not_lifted():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    few = lambda v: v * 1.5 + 0.25 - 3.0  # noqa: E731  (three values: under MIN_LITERALS)
    assert literals.MIN_LITERALS > 3 and literals.lift(_plan_kernels(few, x)[0]) is None
    powers = lambda v: ((v * 2.0 + 0.5) * 4.0 - 1.0) * 0.125 + 8.0  # noqa: E731  (powers of two)
    assert literals.lift(_plan_kernels(powers, x)[0]) is None
    kernel, values = literals.lift(_plan_kernels(lambda v: (v * 1.5 + 0.3) * 2.0 - 0.7 + 1.1 * v, x)[0])
    assert sorted(values) == sorted(np.float32([1.5, 0.3, 0.7, 1.1]).tolist())  # 2.0 stays in the code
    assert kernel.inputs[-1].type.shape == (4,) and kernel.inputs[-1].value_id == literals.LITERALS_VALUE_ID


def test_signed_zeros_keep_their_own_slots():
    """0.0 == -0.0 in Python, but x * -0.0 and x * 0.0 differ in sign."""
    x = np.array([-0.0, 0.0, 1.0, -1.0], np.float32)
    fn = lambda v: (v * -0.0, v * 0.0, (v * 1.5 + 0.3) * 0.7 + 1.1)  # noqa: E731
    (kernel,) = _plan_kernels(fn, x)
    _, values = literals.lift(kernel)
    assert len(values) == 6 and list(np.signbit(values)).count(True) == 1
    negative, positive, _ = glue.jit(fn, backend="cpu")(x)
    assert list(np.signbit(np.asarray(negative))) == [False, True, True, False]
    assert list(np.signbit(np.asarray(positive))) == [True, False, False, True]


@settings(deadline=None, max_examples=25)
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=4, max_size=8),
       dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16]))
def test_lifted_literals_compute_the_reference(values, dtype):
    """Any float32 values (signed zeros, subnormals, the largest), in every float dtype."""
    x = np.linspace(-2, 2, 37).astype(dtype)

    def fn(v):
        for i, c in enumerate(values):
            v = v * c + c if i % 2 else gnp.maximum(v - c, c)
        return v

    closed = glue.make_ir(fn)(x)
    got = np.asarray(glue.jit(fn, backend="cpu")(x))
    want = run_graph(closed.graph, list(closed.consts) + [x])[0]
    assert mismatch(got, want, dt.from_numpy(np.dtype(dtype))) is None


@pytest.mark.parametrize("ops", [10_000])
def test_a_10000_op_chain_compiles_few_distinct_kernels(ops):
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    compiled = glue.jit(_chain(ops), backend="cpu").lower(x).compile()
    assert len(compiled.compile_stats()["kernels"]) <= 6
