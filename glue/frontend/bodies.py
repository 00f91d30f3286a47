"""Tracing the bodies of control flow and calls (scan, while, cond, custom derivatives,
checkpoint) into the closed Graphs their equations hold as params.

A body is traced in a trace of its own. Whatever it reads from outside (an enclosing trace's
values, concrete arrays) is captured as a constant and becomes an explicit *input* of the body
Graph, the caller passing it as an operand: body Graphs have no constvars, so a backend can
compile one as a program of its own.

Effects: a body that prints gets the effect token as its first input and first output (see
`glue.ir.primitives.has_effects`), so the prints of every iteration or branch are ordered after
what came before the equation and before what comes after it. A user's body knows nothing of
tokens: `trace_body` gives it one only when it turns out to print. Rules that re-trace a body
they transform pass the token through themselves (`token=True`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from glue.errors import GlueError, describe_location, user_frame_location
from glue.frontend.tracing import Trace, Tracer, new_trace
from glue.ir import Graph, TensorType, Var
from glue.ir.primitives import TOKEN

# Traces of bodies: in one, `stop_gradient` records a derivative cut in the Graph itself (the
# body is differentiated later, by its equation's rules).
BODY_TRACES: "weakref.WeakSet[Trace]" = weakref.WeakSet()


@dataclass(frozen=True)
class Body:
    """A traced body. `graph`'s inputs are the token (when `effects`), the arguments, then one
    per captured constant; `consts` are the values the constants stand for (values of the
    enclosing trace, or arrays), which the equation passes as operands."""

    graph: Graph
    consts: tuple[Any, ...]
    effects: bool

    @property
    def n_consts(self) -> int:
        return len(self.consts)

    @property
    def arg_vars(self) -> tuple[Var, ...]:
        """The token (if any) and the arguments, without the constants."""
        invars = self.graph.invars
        return invars[:len(invars) - self.n_consts]

    @property
    def const_vars(self) -> tuple[Var, ...]:
        invars = self.graph.invars
        return invars[len(invars) - self.n_consts:]

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        return self.graph.out_types

    def with_invars(self, invars: Sequence[Var]) -> Graph:
        """The body graph taking `invars` in that order (its own, rearranged, plus unused ones)."""
        return Graph((), tuple(invars), self.graph.eqns, self.graph.outvars)


def trace_body(fn: Callable[..., Sequence[Any]], in_types: Sequence[TensorType], name: str,
               token: bool | None = None) -> Body:
    """Trace `fn` (flat arrays in, a flat sequence of arrays out) as a body.

    token=None: `fn` is a user's function; the body takes and gives the token only if it prints.
    token=True: `fn` takes the token as its first argument and gives it as its first result
    (`in_types` then leaves the token out). token=False: the body must not print."""
    with new_trace(name) as trace:
        BODY_TRACES.add(trace)
        token_arg = trace.new_arg(TOKEN) if token is not False else None
        trace.token = token_arg.atom if token_arg is not None else None
        args = [trace.new_arg(t) for t in in_types]
        outs = list(fn(token_arg, *args) if token else fn(*args))
        effects = token_arg is not None and trace.token is not token_arg.atom
        if token is None and effects:
            outs = [Tracer(trace, trace.token)] + outs
        elif token:  # whatever the function passed on, the body ends where its effects end
            outs[0] = Tracer(trace, trace.token)
        if token is False and trace.token is not None:
            raise GlueError(f"{name} cannot have effects (glue.debug.print); print outside it "
                            f"{describe_location(user_frame_location())}")
        closed = trace.finish(outs)
    graph = closed.graph
    invars = graph.invars[1:] if token is None and not effects else graph.invars
    body = Graph((), invars + graph.constvars, graph.eqns, graph.outvars)
    return Body(body, tuple(closed.consts), bool(token) or effects)


def token_operands(effects: bool) -> list[Any]:
    """What the operands of an equation with `effects` start with: a stand-in for the token,
    which `bind` replaces with the trace's own (evaluating eagerly, it is the token)."""
    return [TOKEN.dtype.numpy.type(0)] if effects else []
