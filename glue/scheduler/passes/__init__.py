"""The scheduler's graph passes (Graph -> Graph, meaning preserved bit for bit under the
reference): constant folding, algebraic identities, layout folding, cast simplification, CSE
and DCE, run to a fixed point by `optimize`. The stage "optimized" is `str(optimize(graph))`."""
from __future__ import annotations

from typing import Any, Sequence

from glue.errors import VerifyError
from glue.ir import Graph, verify
from glue.settings import config
from glue.scheduler.passes.algebra import algebra
from glue.scheduler.passes.casts import casts
from glue.scheduler.passes.cse import cse
from glue.scheduler.passes.dce import dce
from glue.scheduler.passes.fold import fold
from glue.scheduler.passes.layout import layout
from glue.scheduler.passes.rewrite import Pass

# Folding first makes literals the identities look for; CSE after the local rewrites merges
# what they made equal; DCE last drops what everything before left unused.
PASSES: dict[str, Pass] = {"fold": fold, "algebra": algebra, "layout": layout, "casts": casts,
                           "cse": cse, "dce": dce}

# Each round only shrinks or canonicalises the graph, so the fixed point comes within a few
# rounds; the cap bounds the work should a future rule undo another's result.
MAX_ROUNDS = 16


def optimize(graph: Graph, consts: Sequence[Any] | None = None, rounds: int = MAX_ROUNDS) -> Graph:
    """`graph` simplified by every pass until none changes it, or for `rounds` rounds; `consts`
    are the values of its constvars when known (small constant arrays then fold too). Inputs
    and outputs keep their order and types, and each surviving equation its source line."""
    check = config.verify
    for _ in range(rounds):
        before = graph
        for name, run in PASSES.items():
            graph = run(graph, consts)
            if check:
                _verified(graph, name)
        if graph is before:
            break
    return graph


def _verified(graph: Graph, after: str) -> None:
    """GLUE_VERIFY=1: the graph a pass made must still be well formed."""
    try:
        verify(graph)
    except VerifyError as err:
        raise VerifyError(f"GLUE_VERIFY: the {after} pass made an ill-formed graph: {err}\n{graph}") from None


__all__ = ["MAX_ROUNDS", "PASSES", "optimize"]
