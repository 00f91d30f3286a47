"""Which loop an expression belongs to, and emitting loop-invariant work before the loop.

`uses(e)` says which domain dims and which reductions' row values an expression depends on.
`hoist` emits, at the builder's current position (a loop preheader), every maximal
subexpression that does not depend on the loop's dims or on row values the loop computes, so
that row-level work (a mean, 1/sqrt(var + eps), a bias load that only depends on the row) runs
once per row rather than once per element, whatever the optimiser later manages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from glue.codegen.expr import ExprEmitter
from glue.scheduler.kernel_ir import (Const, Dim, Expr, FromValue, Index, RowValue, children,
                                      indices_of, postorder)


@dataclass(frozen=True)
class Uses:
    dims: frozenset[int]
    rows: frozenset[int]

    def __or__(self, other: "Uses") -> "Uses":
        return Uses(self.dims | other.dims, self.rows | other.rows)


_NOTHING = Uses(frozenset(), frozenset())


class Analysis:
    """Memoised `uses` over one kernel's expressions."""

    def __init__(self) -> None:
        self.memo: dict[Expr, Uses] = {}

    def uses(self, e: Expr) -> Uses:
        found = self.memo.get(e)
        if found is None:
            for node in postorder(e, children, self.memo):  # what `e` reads first, without recursion
                self.memo[node] = self._uses(node)
            found = self.memo[e]
        return found

    def _uses(self, e: Expr) -> Uses:
        if isinstance(e, RowValue):
            return Uses(frozenset(), frozenset((e.k,)))
        out = _NOTHING
        for index in indices_of(e):
            out = out | self.index_uses(index)
        for child in children(e):
            out = out | self.uses(child)
        return out

    def index_uses(self, index: Index) -> Uses:
        out = _NOTHING
        for atom, _ in index.terms:
            if isinstance(atom, Dim):
                out = out | Uses(frozenset((atom.k,)), frozenset())
            elif isinstance(atom, FromValue):
                out = out | self.uses(atom.value)
            else:
                out = out | self.index_uses(atom.index)
        return out

    def inside(self, e: Expr, dims: frozenset[int], rows: frozenset[int] = frozenset()) -> bool:
        """Whether `e` varies inside a loop over `dims` that computes the row values `rows`."""
        u = self.uses(e)
        return bool(u.dims & dims or u.rows & rows)


def hoist(emitter: ExprEmitter, exprs: Iterable[Expr], analysis: Analysis, dims: frozenset[int],
          rows: frozenset[int] = frozenset()) -> None:
    """Emit the parts of `exprs` that are invariant in a loop over `dims` computing `rows`."""
    seen: set[Expr] = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        if not analysis.inside(e, dims, rows):
            if not isinstance(e, (Const, RowValue)):
                emitter.value(e)
            continue
        stack.extend(children(e))
