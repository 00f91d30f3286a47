"""Data-dependent slicing and the lax operations built from several primitives: dynamic_slice,
dynamic_update_slice (and their `_in_dim` forms), top_k and the cumulative reductions.

Start indices may be traced. As in JAX they are clamped so that the slice fits in the operand,
and the slice is a gather along each axis at `start + iota(size)`; an update is a select
between the operand and the update gathered at `position - start`, inside its window. Both are
pointwise in the operand's shape, so they fuse into whatever consumes them, and they are
differentiable through gather and select. top_k takes k rounds of "the largest remaining
element" (NaN counting as the largest, ties going to the lower index, as XLA's TopK), so it
costs k passes over the last axis: meant for the small k of sampling and routing. The
cumulative reductions combine each element with the one 1, 2, 4, ... places before it, in
log2(n) rounds of shifted copies.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.tracing import Tracer, bind, type_of
from glue.ir import dtypes as dt
from glue.lax.ops import _operand


def _fail(fn: str, message: str) -> GlueTypeError:
    return GlueTypeError(f"lax.{fn}: {message} {describe_location(user_frame_location())}")


def _int32(value: Any) -> Any:
    return bind("convert_element_type", value, new_dtype=dt.int32) if type_of(value).dtype != dt.int32 else value


def _starts(fn: str, operand: Any, start_indices: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
    """Each start clamped into [0, n - size]: a Python int where it is known while tracing."""
    shape = type_of(operand).shape
    if len(start_indices) != len(shape) or len(sizes) != len(shape):
        raise _fail(fn, f"needs one start index and one size per axis of {type_of(operand)}, got "
                        f"{len(start_indices)} and {len(sizes)}")
    out = []
    for axis, (start, size, n) in enumerate(zip(start_indices, sizes, shape)):
        if not 0 <= size <= n:
            raise _fail(fn, f"size {size} does not fit axis {axis} of {type_of(operand)}")
        if not isinstance(start, Tracer) and np.ndim(start) == 0 and not hasattr(start, "aval"):
            out.append(int(np.clip(int(start), 0, n - size)))
            continue
        t = type_of(start)
        if t.shape != () or not t.dtype.is_int:
            raise _fail(fn, f"start index {axis} must be an integer scalar, not {t}")
        out.append(bind("max", bind("min", _int32(start), np.int32(n - size)), np.int32(0)))
    return out


def _positions(n: int, start: Any) -> Any:
    """start + [0, n) as int32."""
    count = bind("iota", dtype=dt.int32, shape=(n,), dimension=0)
    return count if isinstance(start, int) and start == 0 else bind("add", count, np.int32(start) if isinstance(start, int) else start)


def dynamic_slice(operand: Any, start_indices: Sequence[Any], slice_sizes: Sequence[int]) -> Any:
    """operand[start:start + size] on every axis, the starts possibly traced (jax.lax.dynamic_slice)."""
    operand = _operand(operand)
    sizes = [int(n) for n in slice_sizes]
    starts = _starts("dynamic_slice", operand, list(start_indices), sizes)
    shape = type_of(operand).shape
    static = [isinstance(s, int) for s in starts]
    x = operand
    if any(static):
        lo = tuple(s if f else 0 for s, f in zip(starts, static))
        hi = tuple(s + n if f else m for s, n, m, f in zip(starts, sizes, shape, static))
        if lo != (0,) * len(shape) or hi != tuple(shape):
            x = bind("slice", x, start=lo, limit=hi, strides=(1,) * len(shape))
    for axis, (start, size, f) in enumerate(zip(starts, sizes, static)):
        if not f:
            x = bind("gather", x, _positions(size, start), axis=axis, batch_dims=0)
    return x


def dynamic_update_slice(operand: Any, update: Any, start_indices: Sequence[Any]) -> Any:
    """`operand` with `update` written at `start_indices`, possibly traced (jax.lax.dynamic_update_slice)."""
    operand, update = _operand(operand), _operand(update)
    t, u = type_of(operand), type_of(update)
    if u.ndim != t.ndim or u.dtype != t.dtype:
        raise _fail("dynamic_update_slice", f"the update {u} must have the rank and dtype of the operand {t}")
    starts = _starts("dynamic_update_slice", operand, list(start_indices), u.shape)
    window = None
    placed = update
    for axis, (start, size, n) in enumerate(zip(starts, u.shape, t.shape)):
        relative = _positions(n, bind("neg", start) if not isinstance(start, int) else -start)
        inside = bind("and", bind("ge", relative, np.int32(0)), bind("lt", relative, np.int32(size)))
        inside = bind("broadcast_in_dim", inside, shape=t.shape, dims=(axis,))
        window = inside if window is None else bind("and", window, inside)
        clipped = bind("max", bind("min", relative, np.int32(max(size - 1, 0))), np.int32(0))
        placed = bind("gather", placed, clipped, axis=axis, batch_dims=0) if size else placed
    if window is None:  # a scalar operand: the update replaces it
        return update
    if not u.size:
        return operand
    return bind("select", window, placed, operand)


def _in_dim(operand: Any, axis: int) -> tuple[Any, int, tuple[int, ...]]:
    operand = _operand(operand)
    shape = type_of(operand).shape
    if not isinstance(axis, numbers.Integral) or not -len(shape) <= axis < len(shape):
        raise _fail("dynamic_slice_in_dim", f"axis {axis!r} is out of range for {type_of(operand)}")
    return operand, int(axis) % len(shape), shape


def dynamic_slice_in_dim(operand: Any, start_index: Any, slice_size: int, axis: int = 0) -> Any:
    """operand[..., start:start + size, ...] along `axis`."""
    operand, axis, shape = _in_dim(operand, axis)
    starts = [start_index if a == axis else 0 for a in range(len(shape))]
    return dynamic_slice(operand, starts, [slice_size if a == axis else n for a, n in enumerate(shape)])


def dynamic_index_in_dim(operand: Any, index: Any, axis: int = 0, keepdims: bool = True) -> Any:
    """operand[..., index, ...] along `axis` (kept as a size-1 axis with keepdims)."""
    operand, axis, shape = _in_dim(operand, axis)
    out = dynamic_slice_in_dim(operand, index, 1, axis)
    return out if keepdims else bind("reshape", out, shape=shape[:axis] + shape[axis + 1:])


def dynamic_update_slice_in_dim(operand: Any, update: Any, start_index: Any, axis: int) -> Any:
    """`operand` with `update` written from `start_index` along `axis`."""
    operand, axis, shape = _in_dim(operand, axis)
    return dynamic_update_slice(operand, update, [start_index if a == axis else 0 for a in range(len(shape))])


def dynamic_update_index_in_dim(operand: Any, update: Any, index: Any, axis: int) -> Any:
    """`operand` with `update` (with or without the axis) written at `index` along `axis`."""
    operand, axis, shape = _in_dim(operand, axis)
    update = _operand(update)
    if type_of(update).ndim == len(shape) - 1:
        update = bind("reshape", update, shape=type_of(update).shape[:axis] + (1,) + type_of(update).shape[axis:])
    return dynamic_update_slice_in_dim(operand, update, index, axis)


# --- top_k ----------------------------------------------------------------------------------

def top_k(operand: Any, k: int) -> tuple[Any, Any]:
    """The k largest elements along the last axis, largest first, and their int32 indices (as
    jax.lax.top_k): NaN counts as the largest, ties go to the lower index."""
    operand = _operand(operand)
    t = type_of(operand)
    if not t.ndim:
        raise _fail("top_k", f"needs an operand with at least one axis, not {t}")
    n = t.shape[-1]
    if not isinstance(k, numbers.Integral) or not 0 <= k <= n:
        raise _fail("top_k", f"k={k!r} must be an int in [0, {n}] for {t}")
    last = t.ndim - 1
    count = bind("iota", dtype=dt.int32, shape=t.shape, dimension=last)
    taken = bind("broadcast_in_dim", False, shape=t.shape, dims=())
    is_nan = bind("ne", operand, operand) if t.dtype.is_float else None
    lowest = _lowest(t.dtype)
    values, indices = [], []
    for _ in range(int(k)):
        free = bind("not", taken)
        if is_nan is not None:
            nan_left = bind("and", free, is_nan)
            any_nan = bind("reduce_max", nan_left, axes=(last,))
            ordinary = bind("and", free, bind("not", is_nan))
            best = bind("reduce_max", bind("select", ordinary, operand, lowest), axes=(last,))
            hit = bind("and", ordinary, bind("eq", operand, _keep(best, t.shape, last)))
            hit = bind("select", _keep(any_nan, t.shape, last), nan_left, hit)
        else:
            best = bind("reduce_max", bind("select", free, operand, lowest), axes=(last,))
            hit = bind("and", free, bind("eq", operand, _keep(best, t.shape, last)))
        index = bind("reduce_min", bind("select", hit, count, np.int32(n)), axes=(last,))
        index = bind("reshape", index, shape=t.shape[:-1] + (1,))
        values.append(bind("gather", operand, index, axis=last, batch_dims=last))
        indices.append(index)
        taken = bind("or", taken, bind("eq", count, _keep(bind("reshape", index, shape=t.shape[:-1]), t.shape, last)))
    if not values:
        empty = t.shape[:-1] + (0,)
        return (bind("broadcast_in_dim", t.dtype.numpy.type(0), shape=empty, dims=()),
                bind("broadcast_in_dim", np.int32(0), shape=empty, dims=()))
    join = (lambda xs: xs[0]) if len(values) == 1 else (lambda xs: bind("concatenate", *xs, dimension=last))
    return join(values), join(indices)


def _keep(row: Any, shape: tuple[int, ...], axis: int) -> Any:
    """A per-row value broadcast back along the reduced `axis`."""
    return bind("broadcast_in_dim", row, shape=shape, dims=tuple(a for a in range(len(shape)) if a != axis))


def _lowest(dtype: dt.DType) -> Any:
    if dtype.is_float:
        return dtype.numpy.type(-np.inf)
    if dtype == dt.bool_:
        return np.bool_(False)
    return dtype.numpy.type(np.iinfo(dtype.numpy).min)


# --- cumulative reductions ------------------------------------------------------------------

def _identity(op: str, dtype: dt.DType) -> Any:
    if op == "add":
        return 0
    if op == "mul":
        return 1
    if dtype.is_float:
        return float("-inf") if op == "max" else float("inf")
    info = np.iinfo(dtype.numpy)
    return int(info.min) if op == "max" else int(info.max)


def _shifted(x: Any, by: int, axis: int, reverse: bool, fill: Any) -> Any:
    """`x` moved `by` places along `axis` (toward the end, or the start with reverse), `fill`
    coming in."""
    shape = type_of(x).shape
    n = shape[axis]
    start = tuple(by if a == axis and reverse else 0 for a in range(len(shape)))
    limit = tuple(n if a == axis and reverse else (n - by if a == axis else m) for a, m in enumerate(shape))
    kept = bind("slice", x, start=start, limit=limit, strides=(1,) * len(shape))
    low = tuple(0 if reverse or a != axis else by for a in range(len(shape)))
    high = tuple(by if reverse and a == axis else 0 for a in range(len(shape)))
    return bind("pad", kept, low=low, high=high, value=fill)


def _cumulative(name: str, op: str):
    def cumulative(operand: Any, axis: int = 0, reverse: bool = False) -> Any:
        x = _operand(operand)
        t = type_of(x)
        if not -t.ndim <= axis < t.ndim:
            raise _fail(name, f"axis {axis} is out of range for {t}")
        axis = int(axis) % t.ndim
        if op == "add" and t.dtype == dt.bool_:
            x = bind("convert_element_type", x, new_dtype=dt.int32)
        fill = _identity(op, type_of(x).dtype)
        fill = {"bool": bool, "int": int, "float": float}[type_of(x).dtype.kind](fill)
        by = 1
        while by < t.shape[axis]:
            x = bind(op, x, _shifted(x, by, axis, reverse, fill))
            by *= 2
        return x
    cumulative.__name__ = name
    cumulative.__doc__ = (f"The running {op} of `operand` along `axis` (from the end with reverse), as "
                          f"jax.lax.{name}.")
    return cumulative


cumsum = _cumulative("cumsum", "add")
cumprod = _cumulative("cumprod", "mul")
cummax = _cumulative("cummax", "max")
cummin = _cumulative("cummin", "min")


__all__ = ["cummax", "cummin", "cumprod", "cumsum", "dynamic_index_in_dim", "dynamic_slice", "dynamic_slice_in_dim",
           "dynamic_update_index_in_dim", "dynamic_update_slice", "dynamic_update_slice_in_dim", "top_k"]
