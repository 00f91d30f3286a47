"""Building arrays from others: stacks and splits, tiles, repeats, rolls, pads, diagonals, grids
and ranges (`linspace`, `meshgrid`, `tri`), and the shape queries `ndim` / `shape` / `size`.

Everything is a composition of `_core` functions, so it traces, differentiates and batches like
them. Where NumPy's result shape depends on values (repeat counts, split points), those values
must be concrete while tracing; a traced repeat count needs `total_repeat_length`, as in JAX.
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from glue.frontend.tracing import Tracer, bind, type_of
from glue.ir import dtypes as dt
from glue.numpy._core import (Shape, _affine_iota, _axis, _cast, _dtype_of, _fail, _offsets, _shape,
                              add, asarray, astype, broadcast_shapes, broadcast_to, concatenate,
                              equal, expand_dims, floor, full_like, less_equal, moveaxis, multiply,
                              ravel, remainder, reshape, result_dtype, split, subtract, sum, take,
                              to_dtype, true_divide, where)
from glue.numpy._scans import cumsum
from glue.numpy._sorting import searchsorted


def _type(x: Any) -> Any:
    return type_of(np.asarray(x) if isinstance(x, (list, tuple)) else x)


def ndim(x: Any) -> int:
    return _type(x).ndim


def shape(x: Any) -> Shape:
    return _type(x).shape


def size(x: Any, axis: int | None = None) -> int:
    t = _type(x)
    return t.size if axis is None else t.shape[_axis("size", x, axis, t.ndim)]


# --- rank and stacking ----------------------------------------------------------------------

def _at_least(xs: Sequence[Any], padded: Any) -> Any:
    """Each of `xs` reshaped by `padded(shape)`: one array for one argument, else a list."""
    out = [reshape(x, padded(_shape(x))) for x in map(asarray, xs)]
    return out[0] if len(out) == 1 else out


def atleast_1d(*arys: Any) -> Any:
    return _at_least(arys, lambda s: s or (1,))


def atleast_2d(*arys: Any) -> Any:
    return _at_least(arys, lambda s: (1,) * (2 - len(s)) + s if len(s) < 2 else s)


def atleast_3d(*arys: Any) -> Any:
    """(N,) becomes (1, N, 1) and (M, N) becomes (M, N, 1), as in NumPy."""
    padded = {0: lambda s: (1, 1, 1), 1: lambda s: (1,) + s + (1,), 2: lambda s: s + (1,)}
    return _at_least(arys, lambda s: padded[len(s)](s) if len(s) < 3 else s)


def _listed(fn: str, tup: Any) -> list[Any]:
    xs = list(tup)
    if not xs:
        raise _fail(fn, "needs at least one array")
    return xs


def vstack(tup: Sequence[Any]) -> Any:
    return concatenate([atleast_2d(x) for x in _listed("vstack", tup)], 0)


def hstack(tup: Sequence[Any]) -> Any:
    xs = [atleast_1d(x) for x in _listed("hstack", tup)]
    return concatenate(xs, 0 if type_of(xs[0]).ndim == 1 else 1)


def dstack(tup: Sequence[Any]) -> Any:
    return concatenate([atleast_3d(x) for x in _listed("dstack", tup)], 2)


def column_stack(tup: Sequence[Any]) -> Any:
    xs = [asarray(x) for x in _listed("column_stack", tup)]
    return concatenate([reshape(x, (-1, 1)) if type_of(x).ndim < 2 else x for x in xs], 1)


def array_split(x: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """`split`, where n sections need not divide the axis: the first ones get one more."""
    x = asarray(x)
    if not isinstance(indices_or_sections, (int, np.integer)):
        return split(x, indices_or_sections, axis)
    sections = int(indices_or_sections)
    n = _shape(x)[_axis("array_split", x, axis)]
    if sections <= 0:
        raise _fail("array_split", f"the number of sections must be positive, not {sections}", x)
    each, extra = divmod(n, sections)
    sizes = [each + 1] * extra + [each] * (sections - extra)
    return split(x, np.cumsum(sizes)[:-1].tolist(), axis)


# --- repeating ------------------------------------------------------------------------------

def tile(x: Any, reps: Any) -> Any:
    """`x` repeated `reps` times along each axis (reps and x's shape are padded with leading 1s)."""
    x = asarray(x)
    reps = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    rank = builtins.max(len(reps), type_of(x).ndim)
    reps = (1,) * (rank - len(reps)) + reps
    sizes = (1,) * (rank - type_of(x).ndim) + _shape(x)
    if builtins.any(r < 0 for r in reps):
        raise _fail("tile", f"repetitions must be non-negative, got {reps}", x)
    interleaved = tuple(n for pair in zip(reps, sizes) for n in pair)
    spread = bind("broadcast_in_dim", reshape(x, sizes), shape=interleaved,
                  dims=tuple(range(1, 2 * rank, 2)))
    return reshape(spread, tuple(r * n for r, n in zip(reps, sizes)))


def repeat(x: Any, repeats: Any, axis: int | None = None, *,
           total_repeat_length: int | None = None) -> Any:
    """Each element repeated `repeats` times along `axis` (flattened when None); `repeats` is
    an int or one count per element."""
    x = asarray(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis("repeat", x, axis)
    n = _shape(x)[axis]
    if isinstance(repeats, Tracer):
        return _repeat_traced(x, repeats, axis, n, total_repeat_length)
    counts = np.asarray(repeats)
    if counts.dtype.kind not in "iu" or (counts < 0).any() or counts.ndim > 1:
        raise _fail("repeat", f"repeats must be non-negative integers, got {repeats!r}", x)
    if counts.ndim == 0:
        shape = _shape(x)
        spread = bind("broadcast_in_dim", x, shape=shape[:axis + 1] + (int(counts),) + shape[axis + 1:],
                      dims=tuple(i if i <= axis else i + 1 for i in range(len(shape))))
        out = reshape(spread, shape[:axis] + (n * int(counts),) + shape[axis + 1:])
    else:
        if counts.shape[0] not in (1, n):
            raise _fail("repeat", f"{counts.shape[0]} repeat counts for an axis of size {n}", x)
        out = take(x, np.repeat(np.arange(n), np.broadcast_to(counts, (n,))), axis)
    if total_repeat_length is not None and total_repeat_length != _shape(out)[axis]:
        raise _fail("repeat", f"total_repeat_length={total_repeat_length} but the repeats give "
                              f"{_shape(out)[axis]}", x)
    return out


def _repeat_traced(x: Any, repeats: Any, axis: int, n: int, total: int | None) -> Any:
    """Traced counts: output position p reads the element whose running count first exceeds
    p; past the counts' sum the last element repeats and beyond `total` they are cut, as JAX."""
    if total is None:
        raise _fail("repeat", "traced repeat counts give a data-dependent shape; pass "
                              "total_repeat_length", x, repeats)
    ends = cumsum(broadcast_to(astype(repeats, dt.int32), (n,)))
    source = searchsorted(ends, _affine_iota(total, 0, 1, dt.int32), side="right")
    return bind("gather", x, source, axis=axis, batch_dims=0)


def roll(x: Any, shift: Any, axis: Any = None) -> Any:
    """Elements shifted by `shift` along `axis` (of the flattened array when None), wrapping
    around; `shift` may be traced."""
    x = asarray(x)
    if axis is None:
        return reshape(roll(ravel(x), shift, 0), _shape(x))
    shifts = list(shift) if isinstance(shift, (tuple, list)) else [shift]
    axes = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if len(shifts) != len(axes) and 1 not in (len(shifts), len(axes)):
        raise _fail("roll", f"{len(shifts)} shifts do not match {len(axes)} axes", x)
    count = builtins.max(len(shifts), len(axes))
    for s, a in zip(shifts * (count // len(shifts)), axes * (count // len(axes))):
        x = _roll_axis(x, s, _axis("roll", x, a))
    return x


def _roll_axis(x: Any, shift: Any, axis: int) -> Any:
    n = _shape(x)[axis]
    if n == 0:
        return x
    if isinstance(shift, Tracer):
        source = remainder(subtract(_affine_iota(n, 0, 1, dt.int32), astype(shift, dt.int32)), n)
        return bind("gather", x, source, axis=axis, batch_dims=0)
    s = int(shift) % n
    if s == 0:
        return x
    head, tail = split(x, [n - s], axis)
    return concatenate([tail, head], axis)


# --- padding --------------------------------------------------------------------------------

def _pad_widths(fn: str, x: Any, pad_width: Any) -> list[tuple[int, int]]:
    """(before, after) per axis from an int, a pair, or a pair per axis."""
    try:
        widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (type_of(x).ndim, 2))
    except ValueError:
        raise _fail(fn, f"pad_width {pad_width!r} is not an int, a pair or a pair per axis", x) from None
    if (widths < 0).any():
        raise _fail(fn, f"pad widths must be non-negative, got {pad_width}", x)
    return [(int(lo), int(hi)) for lo, hi in widths]


def _source_positions(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    """For each position of the padded axis, the position of x it copies; the padding of
    every mode is a periodic extension of the axis, however wide."""
    i = np.arange(-lo, n + hi)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return i % n
    if mode == "symmetric":  # ... 1 0 | 0 1 ... n-1 | n-1 n-2 ...
        m = i % (2 * n)
        return np.where(m < n, m, 2 * n - 1 - m)
    if n == 1:  # reflect: ... 2 1 | 0 1 ... n-1 | n-2 ...
        return np.zeros_like(i)
    m = i % (2 * n - 2)
    return np.where(m < n, m, 2 * n - 2 - m)


_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(x: Any, pad_width: Any, mode: str = "constant", *, constant_values: Any = 0,
        reflect_type: str = "even") -> Any:
    """NumPy's pad for modes constant, edge, reflect, symmetric and wrap; `pad_width` is an int,
    a (before, after) pair, or one pair per axis."""
    x = asarray(x)
    widths = _pad_widths("pad", x, pad_width)
    if mode not in _PAD_MODES:
        raise _fail("pad", f"mode {mode!r} is not supported; use one of {', '.join(_PAD_MODES)}", x)
    if reflect_type != "even":
        raise _fail("pad", f"reflect_type {reflect_type!r} is not supported (only 'even')", x)
    if mode == "constant":
        if np.ndim(constant_values) != 0:
            raise _fail("pad", "constant_values must be one scalar", x)
        value = _cast(constant_values, _dtype_of(x), "pad", x).item()
        return bind("pad", x, low=tuple(lo for lo, _ in widths), high=tuple(hi for _, hi in widths),
                    value=value)
    for axis, (lo, hi) in enumerate(widths):
        n = _shape(x)[axis]
        if lo == hi == 0:
            continue
        if n == 0:
            raise _fail("pad", f"mode {mode!r} cannot pad the empty axis {axis}", x)
        x = bind("gather", x, _source_positions(mode, n, lo, hi).astype(np.int32), axis=axis, batch_dims=0)
    return x


# --- diagonals and triangles ----------------------------------------------------------------

def diagonal(x: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Any:
    """The `offset`-th diagonal of the (axis1, axis2) planes, as a new last axis."""
    x = asarray(x)
    if type_of(x).ndim < 2:
        raise _fail("diagonal", "needs an array of rank 2 or more", x)
    a, b = _axis("diagonal", x, axis1), _axis("diagonal", x, axis2)
    if a == b:
        raise _fail("diagonal", "axis1 and axis2 must differ", x)
    x = moveaxis(x, (a, b), (-2, -1))
    rows, cols = _shape(x)[-2:]
    start_row, start_col = builtins.max(-offset, 0), builtins.max(offset, 0)
    length = builtins.max(0, builtins.min(rows - start_row, cols - start_col))
    flat = reshape(x, _shape(x)[:-2] + (rows * cols,))
    positions = (np.arange(length) + start_row) * cols + np.arange(length) + start_col
    return take(flat, positions.astype(np.int32), -1)


def diag(v: Any, k: int = 0) -> Any:
    """A 1-D `v` on the k-th diagonal of a square matrix, or the k-th diagonal of a matrix."""
    v = asarray(v)
    rank = type_of(v).ndim
    if rank == 2:
        return diagonal(v, k)
    if rank != 1:
        raise _fail("diag", "needs a 1-D or 2-D array", v)
    n = _shape(v)[0] + builtins.abs(k)
    padded = bind("pad", v, low=(0,), high=(builtins.abs(k),), value=astype(0, _dtype_of(v)).item())
    # Row i holds v[i] at column i + k (k >= 0); column j holds v[j] at row j - k (k < 0).
    spread = bind("broadcast_in_dim", padded, shape=(n, n), dims=(0,) if k >= 0 else (1,))
    return where(equal(_offsets(n, n), k), spread, full_like(spread, 0))


def trace(x: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None) -> Any:
    return sum(diagonal(x, offset, axis1, axis2), -1, dtype)


def tri(N: int, M: int | None = None, k: int = 0, dtype: Any = np.float32) -> Any:
    """Ones at and below the k-th diagonal of an N x M matrix, zeros above."""
    return astype(less_equal(_offsets(N, N if M is None else M), k), dtype)


# --- ranges and grids -----------------------------------------------------------------------

def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype: Any = None, axis: int = 0) -> Any:
    """`num` evenly spaced values from start to stop (array bounds give one line per element,
    along the new `axis`); integer dtypes take the floor, as in JAX."""
    num = int(num)
    if num < 0:
        raise _fail("linspace", f"num must be non-negative, got {num}")
    out_dtype = to_dtype(dtype) if dtype is not None else result_dtype(start, stop, 1.0)
    compute = out_dtype if out_dtype.is_float else dt.DEFAULT_FLOAT
    start, stop = astype(start, compute), astype(stop, compute)
    bounds = broadcast_shapes(_shape(start), _shape(stop))
    start, stop = broadcast_to(start, bounds), broadcast_to(stop, bounds)
    div = num - 1 if endpoint else num
    step = true_divide(subtract(stop, start), div) if div > 0 else full_like(start, np.nan)
    steps = builtins.max(div, 0)  # the points before the endpoint
    grid = bind("iota", dtype=compute, shape=(steps,) + bounds, dimension=0)
    line = add(broadcast_to(start, (steps,) + bounds), multiply(grid, step))
    if endpoint and num > 0:
        line = concatenate([line, expand_dims(stop, 0)], 0) if num > 1 else expand_dims(start, 0)
    line = moveaxis(line, 0, _axis("linspace", line, axis))
    if not out_dtype.is_float:
        line = floor(line)
    line = astype(line, out_dtype)
    return (line, astype(step, out_dtype)) if retstep else line


def meshgrid(*xi: Any, copy: bool = True, sparse: bool = False, indexing: str = "xy") -> list[Any]:
    """Coordinate arrays over the grid of the 1-D `xi`; "xy" indexing swaps the first two axes."""
    if indexing not in ("xy", "ij"):
        raise _fail("meshgrid", f"indexing must be 'xy' or 'ij', not {indexing!r}")
    lines = [ravel(x) for x in xi]
    rank = len(lines)
    sizes = [_shape(line)[0] for line in lines]
    axes = list(range(rank))
    if indexing == "xy" and rank >= 2:
        axes[0], axes[1] = 1, 0
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for line, axis in zip(lines, axes):
        own = tuple(_shape(line)[0] if i == axis else 1 for i in range(rank))
        target = own if sparse else tuple(sizes)
        out.append(bind("broadcast_in_dim", line, shape=target, dims=(axis,)))
    return out


__all__ = ["ndim", "shape", "size", "atleast_1d", "atleast_2d", "atleast_3d", "vstack", "hstack",
           "dstack", "column_stack", "array_split", "tile", "repeat", "roll", "pad", "diagonal",
           "diag", "trace", "tri", "linspace", "meshgrid"]
