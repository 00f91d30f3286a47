"""Dead code elimination: drop equations whose outputs nothing uses (every primitive is pure)."""
from __future__ import annotations

from typing import Any, Sequence

from glue.ir import Graph, Var


def dce(graph: Graph, consts: Sequence[Any] | None = None) -> Graph:
    """`graph` without the equations that do not contribute to its outputs."""
    live = {a.id for a in graph.outvars if isinstance(a, Var)}
    kept = []
    for eqn in reversed(graph.eqns):
        if any(v.id in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(a.id for a in eqn.inputs if isinstance(a, Var))
    if len(kept) == len(graph.eqns):
        return graph
    return Graph(graph.constvars, graph.invars, tuple(reversed(kept)), graph.outvars)
