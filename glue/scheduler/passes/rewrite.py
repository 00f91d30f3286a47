"""The sweep the local passes share: one forward walk over a Graph's equations that substitutes
replaced atoms, shows each equation to a rule, and splices in what the rule gives back.

A rule answers None (keep the equation), an Atom (it stands for the equation's output, which
must have the same type), or a tuple of equations that define the original output variable.
Replacement equations carry the source line of the equation they replace (see `derive`).
A sweep that changes nothing returns the very Graph it was given, which is how `optimize`
recognises its fixed point.
"""
from __future__ import annotations

from typing import Any, Callable, Container, Mapping, Sequence, Union

from glue.ir import Eqn, Graph, Literal, TensorType, Var, params_tuple
from glue.ir.core import Atom
from glue.ir.dtypes import DType

Replacement = Union[Atom, tuple[Eqn, ...], None]


class Sweep:
    """What a rule may ask about the graph being rebuilt: the equation that defines an atom, and
    how many times the graph given to the sweep uses a variable (as an input or an output)."""

    def __init__(self, graph: Graph | None = None) -> None:
        self._graph = graph
        self._producers: dict[int, Eqn] = {}
        self._uses: dict[int, int] | None = None  # counted on first use: few rules ask

    def producer(self, atom: Atom) -> Eqn | None:
        return self._producers.get(atom.id) if isinstance(atom, Var) else None

    def uses(self, atom: Atom) -> int:
        if self._uses is None:
            graph, self._uses = self._graph, {}
            for a in [a for e in graph.eqns for a in e.inputs] + list(graph.outvars) if graph else ():
                if isinstance(a, Var):
                    self._uses[a.id] = self._uses.get(a.id, 0) + 1
        return self._uses.get(atom.id, 0) if isinstance(atom, Var) else 0

    def add(self, eqn: Eqn) -> None:
        for v in eqn.outvars:
            self._producers[v.id] = eqn


Rule = Callable[[Eqn, Sweep], Replacement]
Pass = Callable[..., Graph]


def sweep(graph: Graph, rule: Rule, subst: Mapping[int, Atom] | None = None,
          prologue: Sequence[Eqn] = (), only: Container[str] | None = None) -> Graph:
    """`graph` with `rule` applied to every equation in order (or to those of the primitives
    `only` names); `subst` replaces uses of vars from the start, and `prologue` equations
    (which may define its replacements) come first."""
    env: dict[int, Atom] = dict(subst or {})
    ctx = Sweep(graph)
    eqns = list(prologue)
    for eqn in eqns:
        ctx.add(eqn)
    changed = bool(env or eqns)

    def read(a: Atom) -> Atom:
        return env.get(a.id, a) if isinstance(a, Var) else a

    for eqn in graph.eqns:
        if env:  # nothing to substitute until some rule has replaced a value
            inputs = tuple(map(read, eqn.inputs))
            if inputs != eqn.inputs:  # Vars compare by identity: some input was replaced
                eqn = Eqn(eqn.primitive, inputs, eqn.params, eqn.outvars, eqn.source)
                changed = True
        out = rule(eqn, ctx) if only is None or eqn.primitive in only else None
        if out is None:
            eqns.append(eqn)
            ctx.add(eqn)
        elif isinstance(out, tuple):
            eqns.extend(out)
            for new in out:
                ctx.add(new)
            changed = True
        else:
            env[eqn.outvars[0].id] = out
            changed = True
    if not changed:
        return graph
    return Graph(graph.constvars, graph.invars, tuple(eqns), tuple(map(read, graph.outvars)))


def table_pass(rules: Mapping[str, Rule]) -> Pass:
    """A pass that applies the rule its table holds for each equation's primitive."""
    def run(graph: Graph, consts: Sequence[Any] | None = None) -> Graph:
        return sweep(graph, lambda eqn, ctx: rules[eqn.primitive](eqn, ctx), only=rules)
    return run


def derive(like: Eqn, primitive: str, inputs: Sequence[Atom], **params: Any) -> Eqn:
    """An equation that takes over `like`'s output variable and source line."""
    return Eqn(primitive, tuple(inputs), params_tuple(params), like.outvars, like.source)


def literal(value: Any, dtype: DType) -> Literal:
    """A scalar literal of `dtype` holding `value` (a Python or NumPy scalar)."""
    kind = {"bool": bool, "int": int, "float": float}[dtype.kind]
    return Literal(kind(value), TensorType((), dtype))


def splat(atom: Atom, ctx: Sweep) -> Literal | None:
    """The literal every element of `atom` equals, when that is visible from its definition."""
    if isinstance(atom, Literal):
        return atom
    eqn = ctx.producer(atom)
    if eqn is not None and eqn.primitive == "broadcast_in_dim" and isinstance(eqn.inputs[0], Literal):
        return eqn.inputs[0]
    return None


def stand_in(atom: Atom, like: Eqn) -> Replacement:
    """`atom` in place of `like`'s output; a scalar is broadcast to the output's shape."""
    out = like.outvars[0].type
    if atom.type == out:
        return atom
    if atom.type.ndim == 0 and atom.type.dtype == out.dtype:
        return (derive(like, "broadcast_in_dim", (atom,), shape=out.shape, dims=()),)
    return None


def fill(value: Any, like: Eqn) -> Replacement:
    """`like`'s output as the constant `value` everywhere: a literal, or a broadcast one."""
    return stand_in(literal(value, like.outvars[0].type.dtype), like)
