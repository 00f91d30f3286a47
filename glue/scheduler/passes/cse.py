"""Common subexpression elimination: equations with the same primitive, params and inputs
compute the same value, so every later one is replaced by the first."""
from __future__ import annotations

from typing import Any, Hashable, Sequence

from glue.ir import Eqn, Graph, Literal, Var
from glue.ir.core import Atom
from glue.scheduler.passes.rewrite import Replacement, Sweep, sweep


def _frozen(value: Any) -> Hashable:
    """A key that tells apart what `==` conflates: 0.0 and -0.0, 1 and 1.0 and True."""
    if isinstance(value, tuple):
        return tuple(map(_frozen, value))
    if isinstance(value, (bool, int, float)):
        return type(value).__name__, repr(value)
    return value


def _atom_key(atom: Atom) -> Hashable:
    if isinstance(atom, Literal):
        return "literal", atom.type, _frozen(atom.value)
    return "var", atom.id


def cse(graph: Graph, consts: Sequence[Any] | None = None) -> Graph:
    """`graph` with each repeated computation done once."""
    # Equations are told apart by primitive and operands first: most are alone there, and
    # their params (the dear part of the key) are compared only among those that are not.
    alone: dict[Hashable, Eqn] = {}
    first: dict[Hashable, Var] = {}

    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        if len(eqn.outvars) > 1:
            return None  # a sweep replaces one output at a time
        operands = (eqn.primitive, tuple(map(_atom_key, eqn.inputs)))
        earlier = alone.setdefault(operands, eqn)
        if earlier is eqn:
            return None
        first.setdefault((operands, _frozen(earlier.params)), earlier.outvars[0])
        out = first.setdefault((operands, _frozen(eqn.params)), eqn.outvars[0])
        return None if out is eqn.outvars[0] else out

    return sweep(graph, rule)
