"""Arrays meeting Python and other libraries as JAX's do: operators with non-array operands,
the array methods, f-strings and scalar conversions, `np.asarray` without a copy, and DLPack
both ways (host memory; a device buffer's export needs a GPU)."""
import ctypes

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
from glue import dlpack

api = pytest.mark.jax_api
X = np.arange(12, dtype=np.float32).reshape(3, 4)


@api("Array.__eq__(None)")
def test_comparisons_with_non_arrays_are_pythons():
    a = gnp.asarray(X)
    assert (a == None) is False and (a != None) is True  # noqa: E711
    assert (a == "text") is False and a != object()
    with pytest.raises(TypeError):
        a < None  # noqa: B015
    for container in ([1, 2, 3, 4], (1,), {"a": 1}, {1}):
        with pytest.raises(TypeError, match="unsupported operand"):
            a == container  # noqa: B015
    with pytest.raises(TypeError, match="unsupported operand"):
        a + [1, 2, 3, 4]
    traced = glue.jit(lambda x: (x == None, x != None), backend="reference")(X)  # noqa: E711
    assert traced == (False, True)
    np.testing.assert_array_equal(np.asarray(a == np.float32(1)), X == 1)
    np.testing.assert_array_equal(np.asarray(np.float32(1) == a), X == 1)


@api("Array.ravel", "Array.flatten", "Array.copy", "Array.clip", "Array.dot", "Array.astype")
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=4),
                    elements=st.floats(-5, 5, width=32)))
def test_array_methods(x):
    for a in (gnp.asarray(x),):
        np.testing.assert_array_equal(np.asarray(a.ravel()), x.ravel())
        np.testing.assert_array_equal(np.asarray(a.flatten()), x.flatten())
        np.testing.assert_array_equal(np.asarray(a.clip(-1, 2)), x.clip(-1, 2))
        np.testing.assert_allclose(np.asarray(a.dot(a.T)), x @ x.T, rtol=1e-5, atol=1e-5)
        assert a.astype(gnp.int32).dtype == np.int32
        # (a prefix sum may add in another order than NumPy's loop: float32 rounding, not exact)
        np.testing.assert_allclose(np.asarray(a.cumsum(1)), np.cumsum(x.astype(np.float64), 1), rtol=1e-6, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(a.sort(0)), np.sort(x, 0))
        copied = a.copy()
        assert isinstance(copied, glue.Array) and not np.shares_memory(np.asarray(copied), np.asarray(a))
    traced = glue.jit(lambda v: (v.ravel(), v.clip(max=0), v.sum(0, where=v > 0), v.max(initial=9.0)),
                      backend="reference")(x)
    np.testing.assert_array_equal(np.asarray(traced[0]), x.ravel())
    np.testing.assert_array_equal(np.asarray(traced[1]), np.minimum(x, 0))
    np.testing.assert_allclose(np.asarray(traced[2]), np.sum(x, 0, where=x > 0), rtol=1e-6)
    assert float(traced[3]) == max(9.0, x.max())


@api("Array.__format__", "Array.__bool__", "Array.__float__")
def test_formatting_and_scalar_conversions_of_concrete_arrays():
    s = gnp.sum(gnp.asarray(X))
    assert f"{s:.3f}" == "66.000" and f"{s}" == "66.0" and f"{s:>6}" == "  66.0"
    assert f"{gnp.asarray(np.int32(7)):03d}" == "007"
    assert f"{gnp.asarray(X[0])}" == str(X[0])
    assert bool(gnp.asarray(True)) and not bool(gnp.asarray(0.0))
    assert float(s) == 66.0 and int(gnp.asarray(np.int32(5))) == 5
    assert [1, 2, 3][gnp.asarray(np.int32(1))] == 2
    with pytest.raises(glue.ConcretizationError):
        glue.jit(lambda v: f"{v:.2f}", backend="reference")(np.float32(1))
    with pytest.raises(glue.ConcretizationError):
        glue.jit(lambda v: float(v), backend="reference")(np.float32(1))


@api("np.asarray(glue.Array)")
def test_numpy_views_of_host_arrays_share_memory():
    a = gnp.asarray(X)
    assert np.shares_memory(np.asarray(a), X)
    out = glue.jit(lambda v: v * 2, backend="cpu")(X)
    assert np.shares_memory(np.asarray(out), np.asarray(out))
    assert np.asarray(out) is np.asarray(out)  # the same buffer every time


# --- DLPack ---------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_, ml_dtypes.bfloat16]


@api("jax.dlpack.from_dlpack", "Array.__dlpack__")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dlpack_round_trips_host_memory_without_copies(dtype):
    values = (np.arange(24) % 5).reshape(2, 3, 4).astype(dtype)
    a = glue.from_dlpack(values)
    assert isinstance(a, glue.Array) and a.dtype == values.dtype and a.shape == values.shape
    assert np.shares_memory(np.asarray(a), values)
    assert a.__dlpack_device__() == (dlpack.CPU, 0)
    back = dlpack.from_dlpack(a)
    assert back is a
    if dtype is not ml_dtypes.bfloat16:  # NumPy has no bfloat16 of its own to import into
        exported = np.from_dlpack(a)
        assert np.shares_memory(exported, values)
        np.testing.assert_array_equal(exported, values)
    via_capsule = dlpack.from_dlpack(_Producer(a))
    assert np.shares_memory(np.asarray(via_capsule), values)
    np.testing.assert_array_equal(np.asarray(via_capsule), values)


class _Producer:
    """Exports another object's capsule: makes from_dlpack read glue's own capsules."""

    def __init__(self, inner, device=(dlpack.CPU, 0)):
        self.inner, self.device = inner, device

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


@api("jax.dlpack.from_dlpack")
def test_dlpack_of_strided_views_and_lifetimes():
    base = np.arange(40, dtype=np.float32).reshape(5, 8)
    view = base[::2, 1::3]
    a = glue.from_dlpack(view)
    np.testing.assert_array_equal(np.asarray(a), view)
    assert np.shares_memory(np.asarray(a), base)
    np.testing.assert_array_equal(np.asarray(glue.jit(lambda v: v + 1, backend="cpu")(a)), view + 1)
    exported = dlpack._EXPORTED.copy()
    capsule = gnp.asarray(X).__dlpack__()
    assert len(dlpack._EXPORTED) == len(exported) + 1
    del capsule  # never consumed: its destructor releases the array
    assert len(dlpack._EXPORTED) == len(exported)
    consumed = np.from_dlpack(gnp.asarray(X * 3))  # the consumer's deleter releases it
    assert len(dlpack._EXPORTED) == len(exported) + 1
    del consumed
    assert len(dlpack._EXPORTED) == len(exported)


@api("jax.dlpack.from_dlpack")
def test_dlpack_errors():
    with pytest.raises(glue.GlueError, match="not a DLPack producer"):
        glue.from_dlpack([1, 2, 3])

    class OnGpu(_Producer):
        def __dlpack__(self, **kwargs):
            raise BufferError("no host copy")

    with pytest.raises(glue.GlueError, match="device type 2.*host"):
        glue.from_dlpack(OnGpu(None, (dlpack.CUDA, 0)))
    with pytest.raises(BufferError):
        gnp.asarray(X).__dlpack__(dl_device=(dlpack.CUDA, 0))
    raw = ctypes.pythonapi.PyCapsule_New
    raw.restype, raw.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with pytest.raises(glue.GlueError, match="unconsumed 'dltensor'"):
        dlpack._consume(raw(1, b"something_else", None))
