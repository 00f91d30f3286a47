"""Tracing: captured constants, literals and promotion in the recorded IR, concretization errors
at the user's line, eager evaluation and `glue.Array`'s NumPy interoperability."""
import inspect

import ml_dtypes
import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue import ConcretizationError
from glue.frontend.tracing import Tracer, bind, eval_graph, trace_flat

X = np.arange(3, dtype=np.float32)


def _graph(fn, *args):
    return glue.make_ir(fn)(*args).graph


def test_numpy_arrays_and_closures_are_captured_as_constvars():
    w = np.float32([1, 2, 3])
    bias = glue.Array(np.float32([5, 5, 5]))

    def f(x):
        return x * w + w + bias

    closed = glue.make_ir(f)(X)
    assert len(closed.graph.constvars) == 2  # w is captured once however often it is used
    assert closed.consts[0] is w and closed.consts[1] is bias
    text = str(closed)
    assert text.startswith("{ lambda a:f32[3] b:f32[3] ; c:f32[3] . let")
    assert "mul c a" in text
    np.testing.assert_array_equal(glue.jit(f, backend="reference")(X), X * w + w + 5)


def test_scalars_become_literals():
    text = str(glue.make_ir(lambda x: (x * 2, x + np.float32(0.5), x - np.array(1.5, np.float32)))(X))
    assert "mul a 2.0:f32" in text and "add a 0.5:f32" in text and "sub a 1.5:f32" in text
    assert "lambda ;" in text  # no constants


@pytest.mark.parametrize("x, scalar, out_dtype, converts", [
    (np.ones(2, np.float16), 2.0, "f16", False),
    (np.ones(2, np.int32), 2.5, "f32", True),
    (np.ones(2, np.bool_), 1, "i32", True),
    (np.ones(2, ml_dtypes.bfloat16), 3, "bf16", False),
])
def test_weak_scalars_in_traced_code(x, scalar, out_dtype, converts):
    graph = _graph(lambda x: x + scalar, x)
    assert graph.out_types[0].dtype.name == out_dtype
    assert any(e.primitive == "convert_element_type" for e in graph.eqns) == converts


def test_mixed_half_precision_promotes_to_float32():
    graph = _graph(lambda a, b: a + b, np.ones(2, np.float16), np.ones(2, ml_dtypes.bfloat16))
    assert str(graph.out_types[0]) == "f32[2]"
    assert [e.primitive for e in graph.eqns].count("convert_element_type") == 2


def test_equations_record_the_users_line():
    def f(x):
        return gnp.exp(x)

    line = inspect.getsourcelines(f)[1] + 1
    [eqn] = _graph(f, X).eqns
    assert eqn.source.endswith(f"test_tracing.py:{line}")


def test_python_control_flow_on_a_tracer_is_a_concretization_error():
    def f(x):
        if x > 0:
            return x
        return -x

    line = inspect.getsourcelines(f)[1] + 1
    with pytest.raises(ConcretizationError) as info:
        glue.jit(f, backend="reference")(np.float32(1.0))
    message = str(info.value)
    assert f"test_tracing.py:{line}: if x > 0:" in message
    assert "bool()" in message and "bool[]" in message and "static_argnums" in message


@pytest.mark.parametrize("use", [int, float, np.asarray, lambda t: range(t), lambda t: [1, 2][t]])
def test_other_concretizations(use):
    with pytest.raises(ConcretizationError, match="needs the value of a traced array"):
        glue.jit(lambda x: use(x), backend="reference")(np.int32(1))


def test_values_of_an_enclosing_trace_become_constants_of_an_inner_one():
    def outer(x):
        inner = trace_flat(lambda y: [bind("mul", y, x)], [x.aval], "inner")
        assert inner.consts == (x,) and isinstance(x, Tracer)
        assert str(inner.graph).startswith("{ lambda a:f32[3] ; b:f32[3] . let")
        return eval_graph(inner, [x])[0]

    graph = _graph(outer, X)
    assert [e.primitive for e in graph.eqns] == ["mul"]
    assert graph.eqns[0].inputs == (graph.invars[0], graph.invars[0])


def test_eager_operations_return_glue_arrays():
    out = gnp.add(np.float32([1, 2]), 1.0)
    assert isinstance(out, glue.Array) and out.dtype == np.float32
    np.testing.assert_array_equal(out, [2, 3])
    exp = bind("exp", np.float32([0.0, 1.0]))
    assert isinstance(exp, glue.Array)
    np.testing.assert_allclose(exp, [1.0, np.e], rtol=1e-6)


def test_glue_array_numpy_interop():
    a = glue.Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(np.asarray(a), np.ndarray) and np.asarray(a).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert a.shape == (2, 3) and a.ndim == 2 and a.size == 6 and len(a) == 2
    assert isinstance(a.dtype, np.dtype) and a.dtype == np.float32
    assert a.block_until_ready() is a
    assert np.asarray(a, dtype=np.float64).dtype == np.float64
    assert "glue.Array" in repr(a) and "f32" in repr(a)
    b = glue.Array(np.ones(2, ml_dtypes.bfloat16))
    assert b.dtype == np.dtype(ml_dtypes.bfloat16)
    scalar = glue.Array(np.array(2.5, np.float32))
    assert float(scalar) == 2.5 and scalar.item() == 2.5 and int(glue.Array(np.array(7, np.int32))) == 7


def test_glue_array_operators_stay_glue_arrays():
    a = glue.Array(np.float32([1, 2, 3]))
    for out in (a + 1, 2.0 * a, np.float32([1, 1, 1]) + a, a - a, -a):
        assert isinstance(out, glue.Array)
    np.testing.assert_array_equal(np.float32([1, 1, 1]) + a, [2, 3, 4])
    np.testing.assert_array_equal(a * a, [1, 4, 9])
