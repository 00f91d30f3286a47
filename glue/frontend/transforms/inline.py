"""Inlining the calls whose only purpose is differentiation (custom_jvp_call, custom_vjp_call,
checkpoint) before a program is compiled: each becomes its body's equations, with fresh
variables, so it fuses with its surroundings and costs nothing. Bodies of control flow are
inlined in too. Nothing differentiates a program once jit compiles it, so this changes no value.
"""
from __future__ import annotations

from typing import Any

from glue.ir import Eqn, Graph, Var
from glue.ir.core import Atom

_INLINED = ("custom_jvp_call", "custom_vjp_call", "checkpoint")


def inline(graph: Graph) -> Graph:
    """`graph` with every custom-derivative call and checkpoint replaced by its body."""
    return _Inliner().graph(graph)


class _Inliner:
    def __init__(self) -> None:
        self.done: dict[int, Graph] = {}  # bodies already inlined, by identity

    def graph(self, graph: Graph) -> Graph:
        found = self.done.get(id(graph))
        if found is not None:
            return found
        env: dict[int, Atom] = {}
        eqns: list[Eqn] = []
        changed = False

        def read(a: Atom) -> Atom:
            return env.get(a.id, a) if isinstance(a, Var) else a

        for eqn in graph.eqns:
            inputs = tuple(read(a) for a in eqn.inputs)
            params = tuple((k, self.param(v)) for k, v in eqn.params)
            if eqn.primitive in _INLINED:
                body = dict(params)["body"]
                results = self.splice(body, inputs[:len(body.invars)], eqn.source, eqns)
                env.update({v.id: r for v, r in zip(eqn.outvars, results)})
                changed = True
                continue
            if any(a is not b for a, b in zip(inputs, eqn.inputs)) or \
                    any(new is not old for (_, new), (_, old) in zip(params, eqn.params)):
                eqn = Eqn(eqn.primitive, inputs, params, eqn.outvars, eqn.source)
                changed = True
            eqns.append(eqn)
        out = Graph(graph.constvars, graph.invars, tuple(eqns), tuple(read(a) for a in graph.outvars)) \
            if changed else graph
        self.done[id(graph)] = out
        return out

    def param(self, value: Any) -> Any:
        if isinstance(value, Graph):
            return self.graph(value)
        if isinstance(value, tuple) and any(isinstance(v, Graph) for v in value):
            return tuple(self.param(v) for v in value)
        return value

    @staticmethod
    def splice(body: Graph, args: tuple[Atom, ...], source: str | None, into: list[Eqn]) -> list[Atom]:
        """Append `body`'s equations on `args` to `into`, with fresh variables (a body may be
        inlined in several places); its results."""
        env: dict[int, Atom] = {v.id: a for v, a in zip(body.invars, args)}

        def read(a: Atom) -> Atom:
            return env[a.id] if isinstance(a, Var) else a

        for eqn in body.eqns:
            outvars = tuple(Var(v.type) for v in eqn.outvars)
            env.update({old.id: new for old, new in zip(eqn.outvars, outvars)})
            into.append(Eqn(eqn.primitive, tuple(read(a) for a in eqn.inputs), eqn.params, outvars,
                            eqn.source or source))
        return [read(a) for a in body.outvars]
