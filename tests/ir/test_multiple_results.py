"""Equations with several outputs and graph-valued params (the seam control flow and attention
use): tracing, text form, verifier, reference, grad and vmap, with a test-only primitive."""
import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.frontend.tracing import bind
from glue.frontend.transforms.autodiff import JVP, VJP
from glue.frontend.transforms.batching import BATCH
from glue.frontend.transforms.core import aval, emit
from glue.ir import PRIMITIVES, Primitive, TensorType, parse, verify
from glue.reference import IMPLS, run_graph


def _split_rule(x, *, at):
    n = x.shape[-1]
    return TensorType(x.shape[:-1] + (at,), x.dtype), TensorType(x.shape[:-1] + (n - at,), x.dtype)


def _apply_rule(*xs, body):
    return tuple(body.out_types) if len(body.out_types) > 1 else body.out_types[0]


@pytest.fixture
def split_and_apply():
    """`split[at]` x -> (x[..., :at], x[..., at:]) and `apply[body]` xs -> body(xs)."""
    PRIMITIVES["test_split"] = Primitive("test_split", "layout", _split_rule, multiple_results=True, linear=True)
    PRIMITIVES["test_apply"] = Primitive("test_apply", "opaque", _apply_rule, variadic=True,
                                         multiple_results=True, opaque=True)
    IMPLS["test_split"] = lambda x, *, at: (x[..., :at], x[..., at:])
    IMPLS["test_apply"] = lambda *xs, body: tuple(run_graph(body, xs))

    def slice_(x, lo, hi):
        shape = aval(x).shape
        return emit("slice", x, start=(0,) * (len(shape) - 1) + (lo,), limit=shape[:-1] + (hi,),
                    strides=(1,) * len(shape))

    def split_jvp(ts, primals, out, *, at):
        (t,) = ts
        n = aval(primals[0]).shape[-1]
        return [slice_(t, 0, at), slice_(t, at, n)]

    def split_vjp(cts, wanted, primals, out, *, at):
        pieces = [ct if ct is not None else gnp.zeros_like(o) for ct, o in zip(cts, out)]
        return [gnp.concatenate(pieces, axis=-1)]

    JVP["test_split"], VJP["test_split"] = split_jvp, split_vjp
    BATCH["test_split"] = lambda xs, dims, size, *, at: (
        bind("test_split", gnp.moveaxis(xs[0], dims[0], 0), at=at), [0, 0])
    yield
    for table in (IMPLS, JVP, VJP, BATCH):
        table.pop("test_split", None)
        table.pop("test_apply", None)
    del PRIMITIVES["test_split"], PRIMITIVES["test_apply"]


def test_trace_print_parse_verify(split_and_apply):
    def f(x):
        a, b = bind("test_split", x, at=2)
        return a * 2.0, b + 1.0

    closed = glue.make_ir(f)(np.ones((3, 5), np.float32))
    text = str(closed)
    assert "f32[3,2] c:f32[3,3] = test_split[at=2] a" in text
    graph = parse(text)
    assert graph == closed.graph
    verify(graph)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    a, b = run_graph(graph, [x])
    np.testing.assert_array_equal(a, x[:, :2] * 2)
    np.testing.assert_array_equal(b, x[:, 2:] + 1)


def test_graph_param_round_trips(split_and_apply):
    body = glue.make_ir(lambda x, y: (x * y, x - y))(np.ones(4, np.float32), np.ones(4, np.float32)).graph

    def f(x, y):
        p, q = bind("test_apply", x, y, body=body)
        return p + q

    closed = glue.make_ir(f)(np.ones(4, np.float32), np.ones(4, np.float32))
    text = str(closed)
    assert "test_apply[body={ lambda ; a:f32[4] b:f32[4] . let" in text
    assert parse(text) == closed.graph
    x, y = np.arange(4, dtype=np.float32), np.full(4, 3, np.float32)
    np.testing.assert_array_equal(run_graph(parse(text), [x, y])[0], x * y + x - y)
    np.testing.assert_array_equal(glue.jit(f, backend="reference")(x, y), x * y + x - y)
    np.testing.assert_array_equal(f(x, y), x * y + x - y)  # eager


def test_verifier_rejects_wrong_result_count(split_and_apply):
    text = "{ lambda ; a:f32[5] . let\n    b:f32[2] = test_split[at=2] a\n  in (b) }"
    with pytest.raises(glue.ParseError, match="produces f32\\[2\\] f32\\[3\\]"):
        parse(text)


def test_grad_and_vmap_through_multiple_results(split_and_apply):
    def loss(x):
        a, b = bind("test_split", x, at=2)
        return (a * a).sum() + (3.0 * b).sum()

    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    g = glue.jit(glue.grad(loss), backend="reference")(x)
    want = np.concatenate([2 * x[:, :2], np.full((2, 3), 3, np.float32)], axis=1)
    np.testing.assert_allclose(np.asarray(g), want)
    _, tangent = glue.jvp(loss, (x,), (np.ones_like(x),))
    np.testing.assert_allclose(np.asarray(tangent), (2 * x[:, :2]).sum() + 3.0 * 6)

    def first(x):
        return bind("test_split", x, at=2)[0]

    batched = glue.vmap(first)(x)
    np.testing.assert_array_equal(np.asarray(batched), x[:, :2])
