"""Functional index updates: `x.at[index].set / add / subtract / multiply / min / max / apply /
get`, with JAX's semantics (glue Arrays and Tracers get `.at` from glue/array_methods.py).

`index` is anything NumPy indexing takes but boolean masks: ints, slices, None, Ellipsis and
integer arrays (static, or traced: KV-cache positions, token ids), broadcast together with
NumPy's rules for where their axes go. Every form reduces to one thing: the flat position in
`x` of each element of the indexed view, computed per axis (negative indices count from the
end), and a gather from or scatter into the flattened `x` at those positions:

- get clamps each axis's index into range (mode "clip", JAX's default), or fills out-of-range
  elements with `fill_value` (mode "fill": NaN for floats by default);
- updates drop out-of-range elements (mode "drop", JAX's default) or clamp them ("clip");
- add is scatter_add, which sums repeated positions, as JAX does;
- set, multiply, min and max combine the updates at each repeated position first (set keeps
  the last, as XLA's scatter does on every backend glue has), then write each position once:
  the scatter of values into zeros (negative zeros for floats, so that -0.0 survives), and a
  select where the position was written. Repeats can only come from integer arrays: for static
  ones glue checks on the host; for traced ones it compares every pair of their broadcast
  elements (quadratic in their number, not in the size of the view), unless `unique_indices`
  promises there are none.

All of it is gathers, scatters, selects and reductions, so every form is differentiable and
fuses like any other code. `indices_are_sorted` is accepted and changes nothing.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import numpy as np

from glue.errors import GlueIndexError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.tracing import Tracer, bind, type_of
from glue.ir import dtypes as dt
from glue.ir.core import strides
from glue.lax.ops import _operand


def _fail(message: str, error: type = GlueIndexError) -> Exception:
    return error(f".at[]: {message} {describe_location(user_frame_location())}")


class _View:
    """An indexed view of `x`: for each of its elements the flat position in `x` (int32, the
    view's shape, or a NumPy array when every index is static), whether it is in range
    (None: always), and the positions' shape `advanced` prefix that repeats may come from."""

    def __init__(self, x: Any, index: Any, clip: bool):
        self.x = x
        t = type_of(x)
        items = list(index) if isinstance(index, tuple) else [index]
        items = [_item(i) for i in items]
        if sum(i is Ellipsis for i in items) > 1:
            raise _fail("an index can only have a single ellipsis ('...')")
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        if used > t.ndim:
            raise _fail(f"too many indices ({used}) for an array of rank {t.ndim}")
        at = next((k for k, i in enumerate(items) if i is Ellipsis), len(items))
        items = items[:at] + [slice(None)] * (t.ndim - used) + items[at + 1:]
        arrays = [k for k, i in enumerate(items) if _is_array(i)]
        if arrays:  # with index arrays present, NumPy treats ints as 0-d index arrays
            items = [np.asarray(i, np.int32) if isinstance(i, int) else i for i in items]
            arrays = [k for k, i in enumerate(items) if _is_array(i)]
        self.static = all(not isinstance(i, Tracer) for i in items)
        adv_shape = _broadcast([type_of(items[k]).shape for k in arrays]) if arrays else ()
        adjacent = not arrays or arrays == list(range(arrays[0], arrays[-1] + 1))
        # the view's axes: slices and new axes in order, the arrays' broadcast axes at the first
        # array's place (or first of all when slices separate the arrays)
        view: list[tuple[str, Any]] = []
        placed = False
        if arrays and not adjacent:
            view.append(("advanced", adv_shape))
            placed = True
        for k, item in enumerate(items):
            if _is_array(item):
                if not placed:
                    view.append(("advanced", adv_shape))
                    placed = True
            elif isinstance(item, slice):
                view.append(("slice", k))
            elif item is None:
                view.append(("new", None))
        shape: list[int] = []
        where: dict[Any, int] = {}
        for kind, what in view:
            where[(kind, what if kind == "slice" else None)] = len(shape)
            shape += list(adv_shape) if kind == "advanced" else [1] if kind == "new" else [0]
        self.adv_shape = adv_shape
        self.adv_at = where.get(("advanced", None), 0)
        dims = [a for a, item in enumerate(items) if item is not None]  # x axis of each item
        x_axis = {k: a for a, k in enumerate(dims)}
        ranges = {}
        for k, item in enumerate(items):
            if isinstance(item, slice):
                r = range(t.shape[x_axis[k]])[item]
                ranges[k] = r
                shape[where[("slice", k)]] = len(r)
        self.shape = tuple(shape)
        position: Any = None
        valid: Any = None
        for k, item in enumerate(items):
            if item is None:
                continue
            axis = x_axis[k]
            n, stride = t.shape[axis], strides(t.shape)[axis]
            if isinstance(item, slice):
                part = self._along(ranges[k], where[("slice", k)])
                ok = None
            else:
                part, ok = self._advanced(item, n, clip) if _is_array(item) else self._scalar(item, n, clip)
            part = _times(part, stride)
            position = part if position is None else _plus(position, part, self.shape)
            if ok is not None:
                valid = ok if valid is None else _both(valid, ok, self.shape)
        self.position = _fit(position if position is not None else np.zeros((), np.int32), self.shape)
        self.valid = None if valid is None else _fit(valid, self.shape)
        self.arrays = [items[k] for k in arrays]

    def _along(self, r: range, axis: int) -> np.ndarray:
        """A slice's positions along view axis `axis`, shaped to broadcast over the view."""
        shape = [1] * len(self.shape)
        shape[axis] = len(r)
        return np.asarray(r, np.int32).reshape(shape)

    def _scalar(self, i: int, n: int, clip: bool) -> tuple[Any, Any]:
        i = i + n if i < 0 else i
        if clip:
            return np.int32(min(max(i, 0), n - 1)), None
        return np.int32(i), (None if 0 <= i < n else np.zeros((), bool))

    def _advanced(self, idx: Any, n: int, clip: bool) -> tuple[Any, Any]:
        """An index array normalized (negatives from the end), clamped or checked, and shaped
        with the view's axes around the broadcast ones."""
        rank = len(self.shape)
        before, after = self.adv_at, rank - self.adv_at - len(self.adv_shape)
        shape = (1,) * before + (1,) * (len(self.adv_shape) - type_of(idx).ndim) + type_of(idx).shape + (1,) * after
        if not isinstance(idx, Tracer):
            i = np.asarray(idx).astype(np.int64)
            i = np.where(i < 0, i + n, i)
            ok = (i >= 0) & (i < n)
            i = np.clip(i, 0, n - 1) if clip else i
            return i.astype(np.int32).reshape(shape), (None if clip or ok.all() else ok.reshape(shape))
        i = bind("convert_element_type", idx, new_dtype=dt.int32) if type_of(idx).dtype != dt.int32 else idx
        i = bind("select", bind("lt", i, np.int32(0)), bind("add", i, np.int32(n)), i)
        i = bind("reshape", i, shape=shape)
        if clip:
            return bind("max", bind("min", i, np.int32(n - 1)), np.int32(0)), None
        return i, bind("and", bind("ge", i, np.int32(0)), bind("lt", i, np.int32(n)))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def unique(self) -> bool | None:
        """Whether no position repeats: True or False when known while tracing, else None."""
        if not self.arrays or all(type_of(a).size <= 1 for a in self.arrays):
            return True
        if not self.static:
            return None
        flat = np.broadcast_to(np.asarray(self.position), self.shape).reshape(-1)
        if self.valid is not None:
            flat = flat[np.broadcast_to(np.asarray(self.valid), self.shape).reshape(-1)]
        return len(np.unique(flat)) == len(flat)


def _is_array(item: Any) -> bool:
    return isinstance(item, Tracer) or isinstance(item, np.ndarray) or hasattr(item, "aval")


def _item(item: Any) -> Any:
    if item is None or item is Ellipsis or isinstance(item, slice):
        return item
    if isinstance(item, (bool, np.bool_)):
        raise _fail("boolean indices give a data-dependent shape; use glue.numpy.where instead")
    if isinstance(item, (numbers.Integral, np.integer)):
        return int(item)
    if isinstance(item, (list, tuple)):
        item = np.asarray(item)
    if isinstance(item, np.ndarray) or (hasattr(item, "aval") and not isinstance(item, Tracer)):
        array = np.asarray(item)
        if array.dtype.kind not in "iu":
            raise _fail(f"index arrays must be integers, not {array.dtype}")
        return array.astype(np.int32) if array.ndim else int(array)
    if isinstance(item, Tracer):
        if not item.aval.dtype.is_int:
            raise _fail(f"index arrays must be integers, not {item.aval}")
        return item
    raise _fail(f"{type(item).__name__} is not a valid index")


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise _fail(f"index arrays of shapes {shapes} cannot be broadcast together") from None


def _times(part: Any, stride: int) -> Any:
    if stride == 1:
        return part
    if isinstance(part, Tracer):
        return bind("mul", part, np.int32(stride))
    return (np.asarray(part) * stride).astype(np.int32)


def _fit(value: Any, shape: tuple[int, ...]) -> Any:
    """`value` broadcast to `shape` (NumPy's rules: leading axes added)."""
    if not isinstance(value, Tracer):
        return np.array(np.broadcast_to(np.asarray(value), shape))
    have = type_of(value).shape
    if have == shape:
        return value
    rank = len(shape)
    return bind("broadcast_in_dim", value, shape=shape, dims=tuple(range(rank - len(have), rank)))


def _plus(a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    if not isinstance(a, Tracer) and not isinstance(b, Tracer):
        return (np.asarray(a) + np.asarray(b)).astype(np.int32)
    return bind("add", _fit(a, shape), _fit(b, shape))


def _both(a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    if not isinstance(a, Tracer) and not isinstance(b, Tracer):
        return np.asarray(a) & np.asarray(b)
    return bind("and", _fit(a, shape), _fit(b, shape))


# --- the operations -------------------------------------------------------------------------

def _values(view: _View, values: Any, dtype: dt.DType) -> Any:
    """The update values as an array of the view's shape and x's dtype."""
    v = _operand(values) if not isinstance(values, (bool, int, float)) else np.asarray(values, dtype.numpy)
    t = type_of(v)
    try:
        np.broadcast_shapes(t.shape, view.shape)
    except ValueError:
        raise _fail(f"values of shape {t.shape} cannot be broadcast to the indexed shape {view.shape}",
                    GlueTypeError) from None
    if len(t.shape) > len(view.shape):
        raise _fail(f"values of shape {t.shape} have more axes than the indexed shape {view.shape}", GlueTypeError)
    if t.dtype != dtype:
        v = bind("convert_element_type", v, new_dtype=dtype)
    have = type_of(v).shape
    rank = len(view.shape)
    if have != view.shape:  # NumPy's broadcasting: trailing axes line up
        v = bind("broadcast_in_dim", v, shape=view.shape, dims=tuple(range(rank - len(have), rank)))
    return v


def _flat(x: Any) -> Any:
    t = type_of(x)
    return bind("reshape", x, shape=(t.size,))


def _positions(view: _View) -> Any:
    """Flat positions with out-of-range elements moved to -1, which scatters drop."""
    position = view.position
    if view.valid is None:
        return position
    if isinstance(position, np.ndarray) and isinstance(view.valid, np.ndarray):
        return np.where(view.valid, position, -1).astype(np.int32)
    return bind("select", _fit(view.valid, view.shape), _fit(position, view.shape), np.int32(-1))


def _group(view: _View, positions: Any) -> Any:
    """same[j, k]: advanced elements j and k of the view write the same positions (both in
    range): a (A, A) bool array over the arrays' broadcast elements."""
    adv = view.adv_shape
    rank = len(view.shape)
    # the positions of the first element of every other view axis: one per advanced element
    first = tuple(0 if not view.adv_at <= a < view.adv_at + len(adv) else None for a in range(rank))
    reps = positions
    if any(f is not None for f in first):
        start = tuple(0 for _ in range(rank))
        limit = tuple(n if f is None else 1 for n, f in zip(view.shape, first))
        reps = _slice(reps, start, limit)
    size = math.prod(adv)
    reps = _reshape(reps, (size,))
    left = _broadcast_to(reps, (size, size), (0,))
    right = _broadcast_to(reps, (size, size), (1,))
    same = _eq(left, right)
    return _and(same, _ge(left, 0))


def _slice(x: Any, start: tuple, limit: tuple) -> Any:
    if isinstance(x, np.ndarray):
        return x[tuple(slice(a, b) for a, b in zip(start, limit))]
    return bind("slice", x, start=start, limit=limit, strides=(1,) * len(start))


def _reshape(x: Any, shape: tuple) -> Any:
    return np.reshape(x, shape) if isinstance(x, np.ndarray) else bind("reshape", x, shape=shape)


def _broadcast_to(x: Any, shape: tuple, dims: tuple) -> Any:
    if isinstance(x, np.ndarray):
        expanded = [1] * len(shape)
        for n, d in zip(x.shape, dims):
            expanded[d] = n
        return np.broadcast_to(x.reshape(expanded), shape)
    return bind("broadcast_in_dim", x, shape=shape, dims=dims)


def _eq(a: Any, b: Any) -> Any:
    return np.equal(a, b) if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) else bind("eq", a, b)


def _and(a: Any, b: Any) -> Any:
    return (a & b) if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) else bind("and", _as_value(a), _as_value(b))


def _ge(a: Any, value: int) -> Any:
    return (a >= value) if isinstance(a, np.ndarray) else bind("ge", a, np.int32(value))


def _as_value(x: Any) -> Any:
    return np.array(x) if isinstance(x, np.ndarray) else x


def _to_advanced(view: _View, per_element: Any) -> Any:
    """A value per advanced element (A,) placed along the view's advanced axes, broadcast over
    the others."""
    rank = len(view.shape)
    shaped = _reshape(per_element, view.adv_shape)
    dims = tuple(range(view.adv_at, view.adv_at + len(view.adv_shape)))
    return _broadcast_to(shaped, view.shape, dims) if not isinstance(shaped, np.ndarray) else \
        np.array(_broadcast_to(shaped, view.shape, dims))


def _combined(view: _View, positions: Any, values: Any, op: str) -> tuple[Any, Any]:
    """Positions and values where every repeated position is written once, by its last
    occurrence, with the updates of all its occurrences combined by `op` ("last" keeps the
    last one's)."""
    unique = view.unique()
    if unique:
        return positions, values
    same = _group(view, positions)
    size = math.prod(view.adv_shape)
    later = _and(same, _lt_iota(size))  # same[j, k] and k > j
    repeated_later = _any(later, 1)
    last_only = bind("select", _fit(_to_advanced(view, repeated_later), view.shape),
                     np.int32(-1), _fit(positions, view.shape))
    if op == "last":
        return last_only, values
    # combine over the group: for element j, op over every k with same[j, k]
    rank = len(view.shape)
    a0 = view.adv_at
    adv_rank = len(view.adv_shape)
    # values as (A, rest...) with the advanced axes flattened in front
    order = list(range(a0, a0 + adv_rank)) + [a for a in range(rank) if not a0 <= a < a0 + adv_rank]
    moved = bind("transpose", values, permutation=tuple(order)) if order != list(range(rank)) else values
    rest = tuple(view.shape[a] for a in order[adv_rank:])
    flat_values = bind("reshape", moved, shape=(size,) + rest)
    pairs = bind("broadcast_in_dim", flat_values, shape=(size, size) + rest, dims=(1,) + tuple(range(2, 2 + len(rest))))
    mask = bind("broadcast_in_dim", _as_value(same), shape=(size, size) + rest, dims=(0, 1))
    dtype = type_of(values).dtype
    neutral = _neutral(op, dtype)
    reduced = bind(_REDUCE[op], bind("select", mask, pairs, neutral), axes=(1,))
    back = bind("reshape", reduced, shape=view.adv_shape + rest)
    inverse = tuple(int(i) for i in np.argsort(order))
    combined = bind("transpose", back, permutation=inverse) if order != list(range(rank)) else back
    return last_only, combined


_REDUCE = {"mul": "reduce_prod", "min": "reduce_min", "max": "reduce_max"}


def _neutral(op: str, dtype: dt.DType) -> Any:
    if op == "mul":
        return dtype.numpy.type(1)
    if dtype.is_float:
        return dtype.numpy.type(np.inf if op == "min" else -np.inf)
    if dtype == dt.bool_:
        return np.bool_(op == "min")
    info = np.iinfo(dtype.numpy)
    return dtype.numpy.type(info.max if op == "min" else info.min)


def _lt_iota(size: int) -> Any:
    """k > j for every (j, k) of a (size, size) grid."""
    rows = bind("iota", dtype=dt.int32, shape=(size, size), dimension=0)
    cols = bind("iota", dtype=dt.int32, shape=(size, size), dimension=1)
    return bind("gt", cols, rows)


def _any(mask: Any, axis: int) -> Any:
    return bind("reduce_max", _as_value(mask), axes=(axis,))


def _written(x_flat: Any, positions: Any, shape: tuple[int, ...]) -> Any:
    """Which elements of flat x some (kept) position writes."""
    n = type_of(x_flat).shape[0]
    zeros = bind("broadcast_in_dim", np.int32(0), shape=(n,), dims=())
    ones = bind("broadcast_in_dim", np.int32(1), shape=shape, dims=())
    return bind("gt", bind("scatter_add", zeros, _as_value(positions), ones, axis=0, batch_dims=0), np.int32(0))


def _scattered(x_flat: Any, positions: Any, values: Any) -> Any:
    """`values` at their positions in an array of flat x's type, zeros elsewhere (negative zeros
    for floats: -0.0 + v is exactly v, also for v = -0.0)."""
    t = type_of(x_flat)
    dtype = t.dtype
    carrier = dt.int32 if dtype == dt.bool_ else dtype
    base = bind("broadcast_in_dim", carrier.numpy.type(-0.0 if carrier.is_float else 0), shape=t.shape, dims=())
    moved = bind("convert_element_type", values, new_dtype=carrier) if carrier != dtype else values
    out = bind("scatter_add", base, _as_value(positions), moved, axis=0, batch_dims=0)
    return bind("ne", out, np.int32(0)) if carrier != dtype else out


def _update(x: Any, index: Any, values: Any, op: str, mode: str | None, unique_indices: bool) -> Any:
    x = _operand(x)
    t = type_of(x)
    mode = _mode(mode, "drop")
    view = _View(x, index, clip=mode == "clip")
    v = _values(view, values, t.dtype)
    if not view.size:
        return x
    flat = _flat(x)
    positions = _positions(view)
    if op == "add":
        if t.dtype == dt.bool_:
            raise _fail("add needs a numeric array, not bool", GlueTypeError)
        out = bind("scatter_add", flat, _as_value(positions), v, axis=0, batch_dims=0)
        return bind("reshape", out, shape=t.shape)
    if not unique_indices:
        positions, v = _combined(view, positions, v, "last" if op == "set" else op)
    hit = _written(flat, positions, view.shape)
    placed = _scattered(flat, positions, v)
    if op == "mul":
        placed = bind("mul", flat, placed)
    elif op in ("min", "max"):
        placed = bind(op, flat, placed)
    out = bind("select", hit, placed, flat)
    return bind("reshape", out, shape=t.shape)


def _mode(mode: str | None, default: str) -> str:
    chosen = default if mode is None or mode == "promise_in_bounds" else str(getattr(mode, "name", mode)).lower()
    if chosen not in ("clip", "drop", "fill"):
        raise _fail(f"mode must be one of 'clip', 'drop', 'fill', 'promise_in_bounds', not {mode!r}", GlueTypeError)
    return chosen


def _get(x: Any, index: Any, mode: str | None, fill_value: Any) -> Any:
    x = _operand(x)
    t = type_of(x)
    mode = _mode(mode, "clip")
    view = _View(x, index, clip=mode == "clip")
    if view.valid is not None and isinstance(view.position, np.ndarray):
        position = np.where(np.asarray(view.valid), view.position, 0).astype(np.int32)
    elif view.valid is not None:
        position = bind("select", _fit(view.valid, view.shape), _fit(view.position, view.shape), np.int32(0))
    else:
        position = view.position
    got = bind("gather", _flat(x), _as_value(position), axis=0, batch_dims=0)
    if view.valid is None:
        return got
    if fill_value is None:
        fill_value = np.nan if t.dtype.is_float else (np.iinfo(t.dtype.numpy).min if t.dtype.is_int else True)
    return bind("select", _as_value(_fit(view.valid, view.shape)), got, t.dtype.numpy.type(fill_value))


class IndexUpdateRef:
    """`x.at[index]`: the functional updates and reads of `x` at `index`."""

    def __init__(self, array: Any, index: Any):
        self.array, self.index = array, index

    def get(self, *, indices_are_sorted: bool = False, unique_indices: bool = False, mode: str | None = None,
            fill_value: Any = None) -> Any:
        """x[index]; out-of-range indices are clamped (mode "clip") or give `fill_value` ("fill")."""
        return _get(self.array, self.index, mode, fill_value)

    def set(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Any:
        """x with x[index] = values (the last of repeated positions wins)."""
        return _update(self.array, self.index, values, "set", mode, unique_indices)

    def add(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Any:
        """x with x[index] += values (repeated positions add up)."""
        return _update(self.array, self.index, values, "add", mode, unique_indices)

    def subtract(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
                 mode: str | None = None) -> Any:
        """x with x[index] -= values."""
        return _update(self.array, self.index, bind("neg", _operand(values)) if not isinstance(values, (int, float))
                       else -values, "add", mode, unique_indices)

    def multiply(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
                 mode: str | None = None) -> Any:
        """x with x[index] *= values (repeated positions multiply by each)."""
        return _update(self.array, self.index, values, "mul", mode, unique_indices)

    mul = multiply

    def min(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Any:
        """x with x[index] = minimum(x[index], values)."""
        return _update(self.array, self.index, values, "min", mode, unique_indices)

    def max(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Any:
        """x with x[index] = maximum(x[index], values)."""
        return _update(self.array, self.index, values, "max", mode, unique_indices)

    def apply(self, func: Callable[[Any], Any], *, indices_are_sorted: bool = False, unique_indices: bool = False,
              mode: str | None = None) -> Any:
        """x with x[index] = func(x[index]) (func applied once per distinct position)."""
        current = _get(self.array, self.index, "clip" if mode in (None, "promise_in_bounds") else mode, None)
        return _update(self.array, self.index, func(current), "set", mode, unique_indices)


class IndexUpdateHelper:
    """What `x.at` is: index it to get an IndexUpdateRef."""

    __slots__ = ("array",)

    def __init__(self, array: Any):
        self.array = array

    def __getitem__(self, index: Any) -> IndexUpdateRef:
        return IndexUpdateRef(self.array, index)

    def __repr__(self) -> str:
        return f"_IndexUpdateHelper({self.array!r})"


__all__ = ["IndexUpdateHelper", "IndexUpdateRef"]
