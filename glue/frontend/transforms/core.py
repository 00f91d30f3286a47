"""Plumbing shared by the transforms: emitting primitives from rules, and reading a Graph's values.

Rules emit through `emit`, which binds with the source line of the equation being transformed
(so a backward op points at the forward line that caused it) and folds operations on scalar
constants; the builders below also skip no-ops (identity transposes and reshapes, empty
reductions, same-dtype casts), so transformed programs stay clean.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from glue.frontend.bodies import trace_body
from glue.frontend.tracing import bind, eval_graph, type_of
from glue.frontend.transforms.stop_gradient import Stopped
from glue.ir import PRIMITIVES, ClosedGraph, DType, Eqn, Graph, Literal, TensorType, Var
from glue.ir.core import Atom
from glue.reference import evaluate_eqn

_SOURCES: list[str | None] = [None]


@contextlib.contextmanager
def source_line(source: str | None) -> Iterator[None]:
    """Attribute everything emitted inside to `source` (the equation being transformed)."""
    _SOURCES.append(source)
    try:
        yield
    finally:
        _SOURCES.pop()


def current_source() -> str | None:
    """The source line of the equation being transformed (None outside any)."""
    return _SOURCES[-1]


def emit(primitive: str, *args: Any, **params: Any) -> Any:
    if PRIMITIVES[primitive].kind == "elementwise" and all(isinstance(a, np.generic) for a in args):
        out = evaluate_eqn(primitive, [np.asarray(a) for a in args], params)
        return np.asarray(out)[()]
    return bind(primitive, *args, source=_SOURCES[-1], **params)


def emit_eqn(eqn: Eqn, values: Sequence[Any]) -> Any:
    """Re-emit a Graph's equation on new operand values."""
    with source_line(eqn.source):
        return emit(eqn.primitive, *values, **eqn.param_dict)


def aval(x: Any) -> TensorType:
    return type_of(x)


def like(value: float, x: Any) -> np.generic:
    """`value` as a scalar of x's dtype (an IR literal when used)."""
    return aval(x).dtype.numpy.type(value)


def add(a: Any, b: Any) -> Any:
    return emit("add", a, b)


def sub(a: Any, b: Any) -> Any:
    return emit("sub", a, b)


def mul(a: Any, b: Any) -> Any:
    return emit("mul", a, b)


def div(a: Any, b: Any) -> Any:
    return emit("div", a, b)


def neg(a: Any) -> Any:
    return emit("neg", a)


def plus(a: Any | None, b: Any | None) -> Any | None:
    """a + b where None is a symbolic zero."""
    return b if a is None else a if b is None else add(a, b)


def convert(x: Any, dtype: DType) -> Any:
    return x if aval(x).dtype == dtype else emit("convert_element_type", x, new_dtype=dtype)


def transpose(x: Any, permutation: Sequence[int]) -> Any:
    permutation = tuple(permutation)
    return x if permutation == tuple(range(len(permutation))) else \
        emit("transpose", x, permutation=permutation)


def moveaxis(x: Any, source: int, destination: int) -> Any:
    order = [i for i in range(aval(x).ndim) if i != source]
    order.insert(destination, source)
    return transpose(x, order)


def reshape(x: Any, shape: Sequence[int]) -> Any:
    shape = tuple(shape)
    return x if aval(x).shape == shape else emit("reshape", x, shape=shape)


def reduce_sum(x: Any, axes: Sequence[int]) -> Any:
    axes = tuple(sorted(axes))
    return emit("reduce_sum", x, axes=axes) if axes else x


def broadcast(x: Any, shape: Sequence[int], dims: Sequence[int]) -> Any:
    shape, dims = tuple(shape), tuple(dims)
    if aval(x).shape == shape and dims == tuple(range(len(shape))):
        return x
    return emit("broadcast_in_dim", x, shape=shape, dims=dims)


def zeros(type_: TensorType) -> Any:
    return emit("broadcast_in_dim", type_.dtype.numpy.type(0), shape=type_.shape, dims=())


def fit(x: Any, type_: TensorType) -> Any:
    """A rank-0 `x` broadcast to `type_`'s shape (elementwise rules meet implicit broadcasts)."""
    return x if aval(x).shape == type_.shape else broadcast(x, type_.shape, ())


def sum_to(x: Any, type_: TensorType) -> Any:
    """The transpose of `fit`: sum `x` down to a rank-0 `type_`."""
    return x if aval(x).shape == type_.shape else reduce_sum(x, range(aval(x).ndim))


def kept_axes(ndim: int, axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(i for i in range(ndim) if i not in axes)


class Env:
    """The values of a Graph's variables while a transform interprets it.

    `lift` turns a plain value (constant or literal) into the interpreter's kind of value;
    `cut` turns the value of a stopped constant's source into the value the constant takes.
    """

    def __init__(self, closed: ClosedGraph, args: Sequence[Any], lift: Callable[[Any], Any],
                 cut: Callable[[Any], Any]):
        graph = closed.graph
        self.lift, self.cut = lift, cut
        self.values: dict[int, Any] = {}
        self.stopped: dict[int, Atom] = {}
        for var, const in zip(graph.constvars, closed.consts):
            if isinstance(const, Stopped):
                self.stopped[var.id] = const.source
            else:
                self.values[var.id] = lift(const)
        for var, arg in zip(graph.invars, args):
            self.values[var.id] = arg

    def read(self, atom: Atom) -> Any:
        if isinstance(atom, Literal):
            return self.lift(atom.type.dtype.numpy.type(atom.value))
        if atom.id not in self.values:
            self.values[atom.id] = self.cut(self.read(self.stopped[atom.id]))
        return self.values[atom.id]

    def write(self, var: Var, value: Any) -> None:
        self.values[var.id] = value


# --- bodies of control flow and calls -------------------------------------------------------

def closed(graph: Graph) -> ClosedGraph:
    """A closed body (no constants) as the interpreters take it."""
    return ClosedGraph(graph, ())


def run_body(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """`graph`'s equations emitted on `args` (into the active trace, or eagerly)."""
    return eval_graph(closed(graph), args)


def filled(value: Any | None, type_: TensorType) -> Any:
    """A symbolic zero made an array of zeros; other values as they are."""
    return zeros(type_) if value is None else value


def rule_body(fn: Callable[..., Sequence[Any]], types: Sequence[TensorType], effects: bool, name: str) -> Graph:
    """A body traced for a transformed equation: `fn` takes every input (the effect token
    first, with `effects`) and returns every output."""
    body = trace_body(fn, types[1:] if effects else types, name, token=effects)
    if body.consts:
        raise AssertionError(f"{name} captured {body.n_consts} values from outside")
    return body.graph


def pick(values: Sequence[Any], flags: Sequence[bool]) -> list[Any]:
    """The values at the flagged positions."""
    return [v for v, f in zip(values, flags) if f]


def spread(values: Sequence[Any], flags: Sequence[bool]) -> list[Any]:
    """The inverse of `pick`: `values` at the flagged positions, None elsewhere."""
    it = iter(values)
    return [next(it) if f else None for f in flags]


def groups(items: Sequence[Any], sizes: Sequence[int]) -> list[list[Any]]:
    """`items` cut into consecutive pieces of `sizes`."""
    out, start = [], 0
    for n in sizes:
        out.append(list(items[start:start + n]))
        start += n
    return out
