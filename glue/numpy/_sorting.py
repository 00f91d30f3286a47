"""Sorting (`sort`, `argsort`) and binary search (`searchsorted`), from existing primitives.

glue has no sort primitive: a sort is a bitonic network of compare-exchange steps, each a
gather of partners, a comparison and a select, so it runs unchanged on every backend and
differentiates (the selects route tangents) and batches like any elementwise program. A new
primitive would need a sorting kernel in every backend and rules in every table for the one
operation; the network costs log2(m) (log2(m) + 1) / 2 passes over the data for an axis padded
to m = 2^k, which is cheap for the rows glue sorts (top-k candidates, ranks, medians) and keeps
the scheduler's view of the program plain.

Each of the network's steps reads the previous one at other positions; fused into one kernel,
that would recompute the whole network per element (2^steps times), so every step is
materialized (`_materialized`) and runs as a kernel of its own: one pass over the data each.

The order is NumPy's: NaNs last (first when descending, as JAX reverses the ascending order),
and `argsort` is stable (ties keep their order; so does `descending=True`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from glue.frontend.tracing import bind, type_of
from glue.ir import dtypes as dt
from glue.numpy._core import (_axis, _dtype_of, _fail, _promote, _shape, _slice_axis, add, asarray,
                              astype, clip, equal, flip, full, less, less_equal, logical_and,
                              logical_not, logical_or, moveaxis, ravel, subtract, take, where)
from glue.numpy._scans import _materialized


def _before(a: Any, b: Any) -> Any:
    """a sorts strictly before b: a < b, with NaN after every number."""
    if not _dtype_of(a).is_float:
        return less(a, b)
    return logical_or(less(a, b), logical_and(equal(a, a), logical_not(equal(b, b))))


def _ties(a: Any, b: Any) -> Any:
    """a and b sort to the same place (equal, or both NaN)."""
    if not _dtype_of(a).is_float:
        return equal(a, b)
    return logical_or(equal(a, b), logical_and(logical_not(equal(a, a)), logical_not(equal(b, b))))


def _sentinel(d: dt.DType) -> Any:
    """A padding value that sorts after (or ties with) every value of `d`."""
    if d.is_float:
        return np.nan
    return int(np.iinfo(d.numpy).max)


def _bitonic(keys: Any, payload: Any | None) -> tuple[Any, Any | None]:
    """`keys` sorted ascending along the last axis, `payload` (an index array of the same
    shape, which then also breaks ties) permuted alike."""
    *batch, n = _shape(keys)
    m = 1 << max(n - 1, 0).bit_length()
    last = len(batch)
    if m != n:
        grow = dict(low=(0,) * (last + 1), high=(0,) * last + (m - n,))
        keys = bind("pad", keys, value=_sentinel(_dtype_of(keys)), **grow)
        if payload is not None:  # padded slots get indices past every real one: they sort last
            payload = bind("pad", payload, value=m, **grow)
    k = 2
    while k <= m:
        j = k // 2
        while j >= 1:
            keys, payload = _compare_exchange(keys, payload, m, k, j)
            j //= 2
        k *= 2
    if m != n:
        keys = _slice_axis(keys, last, 0, n)
        payload = None if payload is None else _slice_axis(payload, last, 0, n)
    return keys, payload


def _compare_exchange(keys: Any, payload: Any | None, m: int, k: int, j: int
                      ) -> tuple[Any, Any | None]:
    """One step of the network: positions i and i ^ j compare, and the one that must hold the
    smaller of the two (the lower one where i's bit k is clear, the upper one where it is set)
    takes its partner's value if that sorts before its own; the other takes the larger. Each
    step is materialized: the next reads it at other positions."""
    i = np.arange(m)
    partner_at = (i ^ j).astype(np.int32)
    holds_smaller = ((i & j) == 0) == ((i & k) == 0)
    last = type_of(keys).ndim - 1
    partner = bind("gather", keys, partner_at, axis=last, batch_dims=0)
    if payload is None:
        earlier, later = _before(partner, keys), _before(keys, partner)
    else:
        partner_index = bind("gather", payload, partner_at, axis=last, batch_dims=0)
        ties = _ties(keys, partner)
        earlier = logical_or(_before(partner, keys), logical_and(ties, less(partner_index, payload)))
        later = logical_or(_before(keys, partner), logical_and(ties, less(payload, partner_index)))
    take = where(holds_smaller, earlier, later)
    keys = _materialized(where(take, partner, keys))
    return keys, None if payload is None else _materialized(where(take, partner_index, payload))


def _along_last(fn: str, x: Any, axis: Any, kind: Any, order: Any) -> tuple[Any, int]:
    if kind is not None or order is not None:
        raise _fail(fn, "kind= and order= are not supported (the sort is always stable)")
    x = asarray(x)
    if axis is None:
        return ravel(x), 0
    if type_of(x).ndim == 0:
        raise _fail(fn, "cannot sort a 0-d array along an axis", x)
    return x, _axis(fn, x, axis)


def _sortable(x: Any) -> Any:
    return astype(x, dt.int32) if _dtype_of(x) == dt.bool_ else x


def sort(x: Any, axis: Any = -1, *, kind: Any = None, order: Any = None, stable: bool = True,
         descending: bool = False) -> Any:
    """`x` sorted along `axis` (the flattened array when None)."""
    x, axis = _along_last("sort", x, axis, kind, order)
    keys, _ = _bitonic(moveaxis(_sortable(x), axis, -1), None)
    out = astype(moveaxis(keys, -1, axis), _dtype_of(x))
    return flip(out, axis) if descending else out


def argsort(x: Any, axis: Any = -1, *, kind: Any = None, order: Any = None, stable: bool = True,
            descending: bool = False) -> Any:
    """The int32 indices that sort `x` along `axis`; ties keep their order."""
    x, axis = _along_last("argsort", x, axis, kind, order)
    keys = moveaxis(_sortable(x), axis, -1)
    if descending:  # sort the reversed row, so that ties end up in their original order
        keys = flip(keys, -1)
    n = _shape(keys)[-1]
    positions = bind("iota", dtype=dt.int32, shape=_shape(keys), dimension=type_of(keys).ndim - 1)
    _, order_ = _bitonic(keys, positions)
    if descending:
        order_ = flip(subtract(n - 1, order_), -1)
    return moveaxis(order_, -1, axis)


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None, *,
                 method: str = "scan") -> Any:
    """Where each of `v` would go in the sorted 1-D `a` to keep it sorted: the first such
    place ("left") or the last ("right"); int32. A binary search of log2(len(a)) + 1 gathers."""
    a, v = asarray(a), asarray(v)
    if type_of(a).ndim != 1:
        raise _fail("searchsorted", "a must be one-dimensional", a)
    if side not in ("left", "right"):
        raise _fail("searchsorted", f"side must be 'left' or 'right', not {side!r}", a)
    if sorter is not None:
        a = take(a, sorter)
    a, v = _promote([a, v])
    n = _shape(a)[0]
    found = full(_shape(v), 0, dt.int32)  # how many elements of a are known to go before v
    step = 1 << (n.bit_length() - 1) if n else 0  # the largest power of two <= n
    while step:
        candidate = add(found, step)
        probe = bind("gather", a, clip(subtract(candidate, 1), 0, n - 1), axis=0, batch_dims=0)
        goes_after = _before(probe, v) if side == "left" else logical_not(_before(v, probe))
        found = where(logical_and(less_equal(candidate, n), goes_after), candidate, found)
        step //= 2
    return found


__all__ = ["sort", "argsort", "searchsorted"]
