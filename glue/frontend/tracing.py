"""Tracing: running a Python function on Tracers to record a Graph, and `bind`, the one entry
point through which every primitive is applied.

`bind` records an equation on the innermost active trace; with no trace active it evaluates
the primitive eagerly with the NumPy reference. Values of an enclosing trace (or concrete
arrays) met inside an inner trace are captured as constants of the inner Graph, so transforms
can trace a function, rewrite its Graph, and inline the result into whatever encloses them.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from glue.errors import (ConcretizationError, GlueError, GlueTypeError, describe_location, innermost_user_location,
                         user_frame_location)
from glue.ir import ClosedGraph, Eqn, Graph, Literal, TensorType, Var, infer_types, params_tuple, primitive
from glue.ir.primitives import TOKEN, canonical_params, has_effects
from glue.ir import dtypes as dt
from glue.ir.core import Atom, literal_problem


class Trace:
    """One level of tracing: the equations recorded so far and the values captured.

    `token` is the effect token of the trace's latest effectful equation (a print), or None:
    each effectful equation takes the previous one's token as its first operand, so effects
    keep their order, and whoever finishes the trace keeps the last token alive (jit returns
    it, a control-flow body passes it out)."""

    def __init__(self, name: str):
        self.name = name
        self.invars: list[Var] = []
        self.eqns: list[Eqn] = []
        self.constvars: list[Var] = []
        self.consts: list[Any] = []
        self._captured: dict[int, Var] = {}
        self.active = True
        self.token: Atom | None = None

    def new_arg(self, type_: TensorType) -> "Tracer":
        var = Var(type_)
        self.invars.append(var)
        return Tracer(self, var)

    def to_atom(self, value: Any) -> Atom:
        if isinstance(value, Tracer) and value.trace is self:
            return value.atom
        if isinstance(value, Tracer) and not value.trace.active:
            raise _escaped(value)
        if not isinstance(value, Tracer) and np.ndim(value) == 0 and not _is_array_object(value):
            return literal(value)
        return self._capture(value)

    def _capture(self, value: Any) -> Var:
        var = self._captured.get(id(value))
        if var is None:
            var = self._captured[id(value)] = Var(type_of(value))
            self.constvars.append(var)
            self.consts.append(value)
        return var

    def finish(self, outs: Sequence[Any]) -> ClosedGraph:
        out_atoms = tuple(self.to_atom(o) for o in outs)
        self.active = False
        graph = Graph(tuple(self.constvars), tuple(self.invars), tuple(self.eqns), out_atoms)
        return ClosedGraph(graph, tuple(self.consts))


def _escaped(tracer: "Tracer") -> GlueError:
    return GlueError(f"a traced value of {tracer.aval} escaped the trace of {tracer.trace.name} it "
                     f"belongs to (stored in a global or closure?) and was used "
                     f"{describe_location(user_frame_location())}")


class _TraceStack(threading.local):
    """The traces open in one host thread, innermost last: each thread traces on its own, so
    one thread's jitted call never lands in another thread's trace."""

    def __init__(self) -> None:
        self.traces: list[Trace] = []


_STACK = _TraceStack()


def current_trace() -> Trace | None:
    traces = _STACK.traces
    return traces[-1] if traces else None


# This thread's open traces (`.traces`), for the caller that cannot afford a function call to
# ask whether one is open: jit's lean call, at every call of a jitted function.
open_traces = _STACK


@contextlib.contextmanager
def new_trace(name: str) -> Iterator[Trace]:
    trace = Trace(name)
    traces = _STACK.traces
    traces.append(trace)
    try:
        yield trace
    finally:
        traces.pop()
        trace.active = False


def _is_array_object(value: Any) -> bool:
    from glue.frontend.array import Array

    return isinstance(value, (np.ndarray, Array)) and np.ndim(value) > 0


def type_of(value: Any) -> TensorType:
    """The TensorType of a concrete or traced value (Python scalars get their weak dtype).
    NumPy data gets its dtype as a traced program has it: 64-bit types become 32-bit ones
    unless x64 is enabled (`glue.ir.dtypes.canonical`), as in JAX."""
    if type(value) is np.ndarray:
        return TensorType(value.shape, _numpy_dtype(value))
    if isinstance(value, Tracer):
        return value.aval
    aval = getattr(value, "aval", None)
    if isinstance(aval, TensorType):
        return aval
    if isinstance(value, (np.ndarray, np.generic)):  # before Python scalars: np.float64 is a float
        return TensorType(tuple(value.shape), _numpy_dtype(value))
    if isinstance(value, (bool, int, float)):
        dtype = dt.weak_scalar_dtype(value)
        problem = literal_problem(value, dtype)
        if problem:
            raise GlueTypeError(f"the Python int {problem}: a Python int standing alone is {dtype}, as in "
                                f"JAX; pass an array of a wider dtype {describe_location(user_frame_location())}")
        return TensorType((), dtype)
    shown = repr(value)
    raise GlueTypeError(f"glue cannot use {shown if len(shown) <= 60 else shown[:57] + '...'} (of type "
                        f"{type(value).__name__}) as an array: arrays hold booleans, integers and floats "
                        f"{describe_location(user_frame_location())}")


def _numpy_dtype(value: np.ndarray | np.generic) -> dt.DType:
    """The glue dtype a NumPy value traces as: 64-bit types narrow unless x64 is enabled."""
    try:
        found = dt.from_numpy(value.dtype)
    except GlueTypeError as err:  # complex, strings, objects, datetimes, ...
        raise GlueTypeError(f"{err} (an array of shape {value.shape}) {describe_location(user_frame_location())}") \
            from None
    return dt.canonical(found) if found.bits == 64 else found  # the per-call path of jit


_PYTHON_SCALAR = {"bool": bool, "int": int, "float": float}


def literal(value: Any) -> Literal:
    """A scalar as an IR literal of its (NumPy or weak) dtype, its value rounded to that dtype
    (a float64 scalar narrowed to float32 without x64 holds the float32 value)."""
    type_ = type_of(value)
    if hasattr(value, "item"):  # NumPy or glue data, not a weak Python scalar
        value = np.asarray(value).astype(type_.dtype.numpy).item()
    return Literal(_PYTHON_SCALAR[type_.dtype.kind](value), type_)


class Tracer:
    """A stand-in for an array while a function is traced: it knows its type, not its values.
    Operators and NumPy-style methods come from glue.numpy (glue/numpy/_methods.py)."""

    __slots__ = ("trace", "atom")
    __array_priority__ = 100

    def __init__(self, trace: Trace, var: Var):
        self.trace = trace
        self.atom = var

    @property
    def aval(self) -> TensorType:
        return self.atom.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.atom.type.shape

    @property
    def dtype(self):
        return self.atom.type.dtype.numpy

    @property
    def ndim(self) -> int:
        return self.atom.type.ndim

    @property
    def size(self) -> int:
        return self.atom.type.size

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    def _concrete(self, what: str):
        raise ConcretizationError(
            f"{what} needs the value of a traced array {self.aval} while tracing "
            f"{self.trace.name}, but only its shape and dtype are known {describe_location(user_frame_location())}. "
            "Use glue.numpy.where for data-dependent choices, or mark the argument static "
            "(static_argnums / static_argnames).")

    def __bool__(self):
        self._concrete("bool() (an `if`, `while`, `and`/`or` or `not`)")

    def __int__(self):
        self._concrete("int()")

    def __float__(self):
        self._concrete("float()")

    def __index__(self):
        self._concrete("using it as an index (__index__)")

    def __array__(self, dtype=None, copy=None):
        self._concrete("converting it to a NumPy array")

    def __hash__(self) -> int:
        return id(self)


def bind(name: str, *args: Any, source: str | None = None, **params: Any) -> Any:
    """Apply primitive `name` to `args`: record it on the active trace, or evaluate it now.
    A primitive with multiple results gives a list of values."""
    trace = current_trace()
    where = source or user_frame_location()
    params = canonical_params(name, params)
    if trace is None:
        return _eager(name, args, params, where)
    atoms = tuple(trace.to_atom(a) for a in args)
    prim = primitive(name)
    effect = prim.opaque and has_effects(name, params)
    if effect:  # the token operand chains this effect after the trace's previous one
        atoms = (trace.token or Literal(0, TOKEN),) + atoms[1:]
    out_types = infer_types(name, tuple(a.type for a in atoms), params, where)
    outvars = tuple(Var(t) for t in out_types)
    trace.eqns.append(Eqn(name, atoms, params_tuple(params), outvars, where))
    if effect:
        trace.token = outvars[0]
    if prim.multiple_results:
        return [Tracer(trace, v) for v in outvars]
    return Tracer(trace, outvars[0])


def _eager(name: str, args: Sequence[Any], params: dict[str, Any], where: str | None):
    from glue.frontend.array import Array
    from glue.reference import evaluate_eqn

    for a in args:
        if isinstance(a, Tracer):  # with no trace active, its trace has finished
            raise _escaped(a)
    types = tuple(type_of(a) for a in args)
    out_types = infer_types(name, types, params, where)
    values = [np.asarray(a, dtype=t.dtype.numpy) for a, t in zip(args, types)]
    out = evaluate_eqn(name, values, params)
    multiple = primitive(name).multiple_results
    results = [Array(np.asarray(value, dtype=t.dtype.numpy).reshape(t.shape))
               for value, t in zip(out if multiple else (out,), out_types)]
    return results if multiple else results[0]


def trace_flat(fn: Callable[..., Sequence[Any]], in_types: Sequence[TensorType], name: str) -> ClosedGraph:
    """Trace `fn` (taking and returning flat sequences of arrays) at `in_types`."""
    with new_trace(name) as trace:
        args = [trace.new_arg(t) for t in in_types]
        try:
            outs = fn(*args)
        except RecursionError as err:
            # Jitted functions called inside a trace run inline, so functions nested hundreds
            # deep reach Python's recursion limit with the user's own frames and a few of glue's.
            raise GlueError(f"tracing {name} went deeper than Python's recursion limit "
                            f"({sys.getrecursionlimit()} frames) {describe_location(innermost_user_location(err))}; "
                            "nested jit calls, like any Python calls, add frames: call fewer levels, or raise "
                            "the limit with sys.setrecursionlimit") from None
        return trace.finish(outs)


def eval_graph(closed: ClosedGraph, args: Sequence[Any]) -> list[Any]:
    """Run `closed` on `args` through `bind`: inlined into the active trace, or eagerly."""
    graph = closed.graph
    env: dict[int, Any] = {}
    for v, x in zip(graph.constvars + graph.invars, tuple(closed.consts) + tuple(args)):
        env[v.id] = x

    def read(a: Atom) -> Any:
        return a.type.dtype.numpy.type(a.value) if isinstance(a, Literal) else env[a.id]

    for eqn in graph.eqns:
        out = bind(eqn.primitive, *map(read, eqn.inputs), source=eqn.source, **eqn.param_dict)
        for var, value in zip(eqn.outvars, results_of(eqn, out)):
            env[var.id] = value
    return [read(a) for a in graph.outvars]


def results_of(eqn: Eqn, out: Any) -> Sequence[Any]:
    """What binding `eqn`'s primitive gave (or a rule for it), as one value per output variable."""
    return out if primitive(eqn.primitive).multiple_results else (out,)
