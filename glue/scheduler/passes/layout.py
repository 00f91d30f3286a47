"""Layout folding: transposes, reshapes and broadcasts that compose into one or do nothing,
slices and pads that keep the whole array, layout changes of a splat (a broadcast literal),
which are that splat in the new shape, and the transpose of a matrix product, which is the
product with its operands swapped (so the epilogue that follows can fuse into it)."""
from __future__ import annotations

from glue.ir import Eqn
from glue.scheduler.passes.rewrite import Replacement, Rule, Sweep, derive, fill, splat, table_pass


def _unchanged(eqn: Eqn, ctx: Sweep) -> Replacement:
    # A slice, pad or broadcast whose result has its operand's type takes every element in place.
    x = eqn.inputs[0]
    return x if x.type == eqn.outvars[0].type else None


def _of_splat(eqn: Eqn, ctx: Sweep) -> Replacement:
    value = splat(eqn.inputs[0], ctx)
    return None if value is None else fill(value.value, eqn)


def _transpose(eqn: Eqn, ctx: Sweep) -> Replacement:
    (x,) = eqn.inputs
    perm = eqn.param_dict["permutation"]
    inner = ctx.producer(x)
    if inner is not None and inner.primitive == "transpose":
        first = inner.param_dict["permutation"]
        x, perm = inner.inputs[0], tuple(first[p] for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    if inner is not None and inner.primitive == "dot_general" and ctx.uses(x) == 1:
        swapped = _swapped_dot(eqn, inner, perm)
        if swapped is not None:
            return (swapped,)
    if x is not eqn.inputs[0]:
        return (derive(eqn, "transpose", (x,), permutation=perm),)
    return _of_splat(eqn, ctx)


def _swapped_dot(eqn: Eqn, dot: Eqn, perm: tuple[int, ...]) -> Eqn | None:
    """dot_general(rhs, lhs) when `perm` moves the product's rhs-free dims before its lhs-free
    ones (keeping the batch dims first): (A B)^T = B^T A^T without moving any data. The product
    keeps its other params (its precision, its preferred element type)."""
    lhs, rhs = dot.inputs
    (lc, rc), (lb, rb) = dot.param_dict["dimension_numbers"]
    nb = len(lb)
    nl, nr = lhs.type.ndim - len(lc) - nb, rhs.type.ndim - len(rc) - nb
    if perm != tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr)) + tuple(range(nb, nb + nl)):
        return None
    return derive(eqn, "dot_general", (rhs, lhs), **{**dot.param_dict, "dimension_numbers": ((rc, lc), (rb, lb))})


def _reshape(eqn: Eqn, ctx: Sweep) -> Replacement:
    (x,) = eqn.inputs
    inner = ctx.producer(x)
    if inner is not None and inner.primitive == "reshape":
        x = inner.inputs[0]
    if x.type == eqn.outvars[0].type:
        return x
    if x is not eqn.inputs[0]:
        return (derive(eqn, "reshape", (x,), shape=eqn.param_dict["shape"]),)
    return _of_splat(eqn, ctx)


def _broadcast_in_dim(eqn: Eqn, ctx: Sweep) -> Replacement:
    (x,) = eqn.inputs
    shape, dims = eqn.param_dict["shape"], eqn.param_dict["dims"]
    inner = ctx.producer(x)
    if inner is not None and inner.primitive == "broadcast_in_dim":
        x, dims = inner.inputs[0], tuple(dims[d] for d in inner.param_dict["dims"])
        return x if x.type == eqn.outvars[0].type else \
            (derive(eqn, "broadcast_in_dim", (x,), shape=shape, dims=dims),)
    return _unchanged(eqn, ctx)


def _slice(eqn: Eqn, ctx: Sweep) -> Replacement:
    return _unchanged(eqn, ctx) or _of_splat(eqn, ctx)


def _concatenate(eqn: Eqn, ctx: Sweep) -> Replacement:
    return eqn.inputs[0] if len(eqn.inputs) == 1 else None


RULES: dict[str, Rule] = {
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast_in_dim": _broadcast_in_dim,
    "slice": _slice,
    "pad": _unchanged,
    "concatenate": _concatenate,
}

layout = table_pass(RULES)
