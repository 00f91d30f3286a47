"""Batching of Graphs (vmap): a batching rule per primitive, and the interpreter that applies them.

Each value carries its batch axis (`None`: not batched, the same for every example). A rule
takes the operands, their batch axes and the batch size and returns the batched output and its
batch axis. Rules leave the batch axis where it is when the primitive allows it (elementwise
ops, reductions, slices, pads, contractions) and move it only when they must, so batched
programs gain few transposes.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from glue.frontend.transforms.core import (Env, aval, broadcast, emit, emit_eqn, moveaxis,
                                           source_line)
from glue.frontend.tracing import results_of
from glue.frontend.transforms.stop_gradient import stop_gradient
from glue.ir import PRIMITIVES, ClosedGraph, RuleTable, every_primitive

BatchRule = Callable[..., tuple[Any, int | None]]
BATCH = RuleTable("vmap", every_primitive)


def _example_shape(x: Any, bdim: int | None) -> tuple[int, ...]:
    shape = aval(x).shape
    return shape if bdim is None else shape[:bdim] + shape[bdim + 1:]


def move_batch(x: Any, bdim: int | None, to: int, size: int) -> Any:
    """x with its batch axis at `to`; an unbatched x is broadcast along a new axis there."""
    if bdim is not None:
        return moveaxis(x, bdim, to)
    shape = aval(x).shape
    return broadcast(x, shape[:to] + (size,) + shape[to:], [i + (i >= to) for i in range(len(shape))])


def _into(axes: Sequence[int], bdim: int) -> tuple[int, ...]:
    """Per-example axes as axes of a value batched along `bdim`."""
    return tuple(a + (a >= bdim) for a in axes)


def _elementwise(name: str) -> BatchRule:
    def rule(xs: list, bdims: list, size: int, **params: Any) -> tuple[Any, int]:
        shapes = [_example_shape(x, d) for x, d in zip(xs, bdims)]
        rank = max(len(s) for s in shapes)
        # Keep the batch axis of a full-rank batched operand; move the others to match it.
        to = next((d for d, s in zip(bdims, shapes) if d is not None and len(s) == rank), 0)
        out_shape = next(s for s in shapes if len(s) == rank)
        operands = []
        for x, d, s in zip(xs, bdims, shapes):
            if d is None and not s:
                operands.append(x)  # a rank-0 operand broadcasts implicitly
            elif len(s) == rank:
                operands.append(move_batch(x, d, to, size))
            else:  # a batched rank-0 operand meeting full-rank ones
                full = out_shape[:to] + (size,) + out_shape[to:]
                operands.append(broadcast(x, full, (to,)))
        return emit(name, *operands, **params), to
    return rule


for _name, _prim in PRIMITIVES.items():
    if _prim.kind == "elementwise":
        BATCH[_name] = _elementwise(_name)


def _reduction(name: str) -> BatchRule:
    def rule(xs, bdims, size, *, axes):
        d = bdims[0]
        return emit(name, xs[0], axes=_into(axes, d)), d - sum(a < d for a in axes)
    return rule


def _arg_reduction(name: str) -> BatchRule:
    def rule(xs, bdims, size, *, axis, index_dtype):
        d = bdims[0]
        return emit(name, xs[0], axis=axis + (axis >= d), index_dtype=index_dtype), d - (axis < d)
    return rule


def _broadcast_in_dim(xs, bdims, size, *, shape, dims):
    d = bdims[0]
    # The batch axis goes right after the target of the operand axis before it, which keeps
    # `dims` increasing without moving the operand's batch axis.
    to = dims[d - 1] + 1 if d > 0 else 0
    moved = tuple(t + (t >= to) for t in dims)
    return emit("broadcast_in_dim", xs[0], shape=shape[:to] + (size,) + shape[to:],
                dims=moved[:d] + (to,) + moved[d:]), to


def _reshape(xs, bdims, size, *, shape):
    return emit("reshape", move_batch(xs[0], bdims[0], 0, size), shape=(size,) + tuple(shape)), 0


def _transpose(xs, bdims, size, *, permutation):
    d = bdims[0]
    return emit("transpose", xs[0], permutation=(d,) + _into(permutation, d)), 0


def _insert(values: tuple, d: int, value: Any) -> tuple:
    return values[:d] + (value,) + values[d:]


def _slice(xs, bdims, size, *, start, limit, strides):
    d = bdims[0]
    return emit("slice", xs[0], start=_insert(start, d, 0), limit=_insert(limit, d, size),
                strides=_insert(strides, d, 1)), d


def _pad(xs, bdims, size, *, low, high, value):
    d = bdims[0]
    return emit("pad", xs[0], low=_insert(low, d, 0), high=_insert(high, d, 0), value=value), d


def _concatenate(xs, bdims, size, *, dimension):
    to = next(d for d in bdims if d is not None)
    parts = [move_batch(x, d, to, size) for x, d in zip(xs, bdims)]
    return emit("concatenate", *parts, dimension=dimension + (dimension >= to)), to


def _iota(xs, bdims, size, **params):
    return emit("iota", **params), None


def _dot_general(xs, bdims, size, *, dimension_numbers, **precision):
    (lc, rc), (lb, rb) = dimension_numbers
    (lhs, rhs), (dl, dr) = xs, bdims
    if dl is not None and dr is not None:
        lhs, rhs = moveaxis(lhs, dl, 0), moveaxis(rhs, dr, 0)
        numbers = ((_into(lc, 0), _into(rc, 0)), ((0,) + _into(lb, 0), (0,) + _into(rb, 0)))
        return emit("dot_general", lhs, rhs, dimension_numbers=numbers, **precision), 0
    if dl is not None:  # the batch axis is one of lhs's free axes in the output
        lc, lb = _into(lc, dl), _into(lb, dl)
        free = [i for i in range(aval(lhs).ndim) if i not in lc + lb]
        out = len(lb) + free.index(dl)
    else:
        rc, rb = _into(rc, dr), _into(rb, dr)
        free = [i for i in range(aval(rhs).ndim) if i not in rc + rb]
        out = len(lb) + (aval(lhs).ndim - len(lc) - len(lb)) + free.index(dr)
    return emit("dot_general", lhs, rhs, dimension_numbers=((lc, rc), (lb, rb)), **precision), out


def _gather(xs, bdims, size, *, axis, batch_dims):
    (x, idx), (dx, di) = xs, bdims
    if dx is None and batch_dims == 0:  # the indices' batch axis lands among gather's index axes
        return emit("gather", x, idx, axis=axis, batch_dims=0), axis + di
    x, idx = move_batch(x, dx, 0, size), move_batch(idx, di, 0, size)
    return emit("gather", x, idx, axis=axis + 1, batch_dims=batch_dims + 1), 0


def _scatter_add(xs, bdims, size, *, axis, batch_dims):
    x, idx, updates = (move_batch(v, d, 0, size) for v, d in zip(xs, bdims))
    return emit("scatter_add", x, idx, updates, axis=axis + 1, batch_dims=batch_dims + 1), 0


BATCH.update({name: _reduction(name) for name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")})
BATCH.update({name: _arg_reduction(name) for name in ("argmax", "argmin")})
BATCH.update(broadcast_in_dim=_broadcast_in_dim, reshape=_reshape, transpose=_transpose, slice=_slice,
             pad=_pad, concatenate=_concatenate, iota=_iota, dot_general=_dot_general,
             gather=_gather, scatter_add=_scatter_add)


def batch_graph(closed: ClosedGraph, args: Sequence[Any], bdims: Sequence[int | None],
                size: int) -> tuple[list[Any], list[int | None]]:
    """Run `closed` on `args` batched along `bdims` (all of size `size`): outputs and their batch axes."""
    env = Env(closed, list(zip(args, bdims)), lift=lambda v: (v, None),
              cut=lambda pair: (stop_gradient(pair[0]), pair[1]))
    for eqn in closed.graph.eqns:
        pairs = [env.read(a) for a in eqn.inputs]
        values, dims = [v for v, _ in pairs], [d for _, d in pairs]
        if all(d is None for d in dims):
            outs, out_dims = results_of(eqn, emit_eqn(eqn, values)), [None] * len(eqn.outvars)
        else:
            with source_line(eqn.source):
                out, out_dim = BATCH[eqn.primitive](values, dims, size, **eqn.param_dict)
            outs, out_dims = results_of(eqn, out), results_of(eqn, out_dim)
        for var, value, d in zip(eqn.outvars, outs, out_dims):
            env.write(var, (value, d))
    outs = [env.read(a) for a in closed.graph.outvars]
    return [v for v, _ in outs], [d for _, d in outs]
