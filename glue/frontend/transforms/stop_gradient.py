"""`glue.stop_gradient`, and the traces transforms record functions in.

The IR has no stop-gradient primitive, and none is needed: a transform (grad, vjp, jvp, vmap)
traces the function it transforms into a trace of its own, registered here. Inside such a
trace, `stop_gradient(x)` returns a fresh *constant input* of the trace whose value is marked
`Stopped(x)`: "whatever x turns out to be". Derivatives never flow into constants, so the cut
is exact, and every transform's interpreter resolves the constant to x's value when it reaches
it (`Env.read`), re-applying `stop_gradient` in the context it emits into, so the cut survives
nesting (vmap of grad, grad of grad, ...). In a `jit` trace, or outside any trace, nothing
differentiates the value and `stop_gradient` is the identity; a jitted function called inside
a transform is traced through, so its `stop_gradient` calls land in the transform's trace.
The body of a loop or branch is traced on its own and differentiated later, by its equation's
rules: there the cut is an equation of the body, a custom_jvp_call of the identity with a zero
tangent, which jit inlines away.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

from glue.errors import GlueError
from glue.frontend.bodies import BODY_TRACES
from glue.frontend.pytree import tree_map
from glue.frontend.tracing import Trace, Tracer, bind, current_trace, trace_flat
from glue.ir import Atom, ClosedGraph, Eqn, Graph, Literal, TensorType, Var, params_tuple

_TRANSFORM_TRACES: "weakref.WeakSet[Trace]" = weakref.WeakSet()


@dataclass(frozen=True, eq=False)
class Stopped:
    """The value of a constant that stands for `source` with its derivative cut."""

    source: Atom


def trace_for_transform(fn: Callable[..., Sequence[Any]], in_types: Sequence[TensorType],
                        name: str) -> ClosedGraph:
    """`trace_flat`, in a trace where `stop_gradient` records its cuts."""
    def registered(*args: Any) -> Sequence[Any]:
        _TRANSFORM_TRACES.add(current_trace())
        return fn(*args)

    return trace_flat(registered, in_types, name)


def stop_gradient(x: Any) -> Any:
    """`x` (a pytree of arrays) with no derivative: grad, vjp and jvp treat it as a constant."""
    return tree_map(_stop_leaf, x)


def _stop_leaf(x: Any) -> Any:
    if isinstance(x, Tracer) and x.trace in BODY_TRACES and x.aval.dtype.is_float:
        return bind("custom_jvp_call", x, body=_identity(x.aval), jvp=_zero_tangent(x.aval), num_consts=0)[0]
    if not isinstance(x, Tracer) or x.trace not in _TRANSFORM_TRACES or not x.aval.dtype.is_float:
        return x
    trace = x.trace
    if not trace.active:
        raise GlueError(f"stop_gradient got a traced value of {x.aval} that escaped the trace of "
                        f"{trace.name} it belongs to (stored in a global or closure?)")
    var = Var(x.aval)
    trace.constvars.append(var)
    trace.consts.append(Stopped(trace.to_atom(x)))
    return Tracer(trace, var)


@lru_cache(maxsize=None)
def _identity(t: TensorType) -> Graph:
    x = Var(t)
    return Graph((), (x,), (), (x,))


@lru_cache(maxsize=None)
def _zero_tangent(t: TensorType) -> Graph:
    x, tangent, zero = Var(t), Var(t), Var(t)
    splat = Eqn("broadcast_in_dim", (Literal(0.0, TensorType((), t.dtype)),),
                params_tuple({"shape": t.shape, "dims": ()}), (zero,))
    return Graph((), (x, tangent), (splat,), (x, zero))
