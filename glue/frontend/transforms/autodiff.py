"""Differentiation of Graphs: a JVP and a VJP rule per primitive, and the interpreters that
apply them (forward mode: `jvp_graph`; reverse mode: `Linearized`, then its `transpose`).

Both interpreters walk a traced Graph and re-emit it through `bind`, so the derivative program
lands in whatever trace is active (an enclosing jit, grad or vmap) or is evaluated eagerly, and
differentiating a derivative program is just differentiating another Graph.

Tangents and cotangents are `None` where they are symbolically zero: integer and boolean
values, values that do not depend on the differentiated inputs, and stopped values never get
one, and no rule is run for them. Rules:

- `JVP[name](tangents, primals, out, **params)` -> the output tangent (or None; for a primitive
  with multiple results, `out` is the list of outputs and the rule gives a list of tangents); it is only
  called when some input tangent is not None and the output is floating-point.
- `VJP[name](ct, wanted, primals, out, **params)` -> one cotangent (or None) per input; only
  inputs whose `wanted` flag is set need one (with multiple results, `ct` and `out` are lists,
  a None in `ct` standing for a zero cotangent).

An elementwise primitive's Jacobian is diagonal, so its VJP rule is its JVP rule applied with
the cotangent as the tangent of one input at a time (summed down where a rank-0 operand was
broadcast). Forward values are reused (`exp`'s derivative is its output), never recomputed.
`reduce_max`/`reduce_min` and `max`/`min` split the derivative equally among tied maxima, as
JAX does.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from glue.frontend.transforms.core import (Env, add, aval, broadcast, convert, div, emit, emit_eqn,
                                           fit, kept_axes, like, mul, neg, plus, reduce_sum,
                                           reshape, source_line, sub, sum_to, transpose, zeros)
from glue.frontend.tracing import results_of
from glue.frontend.transforms.stop_gradient import Stopped, stop_gradient
from glue.ir import PRIMITIVES, ClosedGraph, Eqn, Graph, RuleTable, Var, every_primitive
from glue.scheduler.passes.attention import recognize_attention
from glue.settings import config

JvpRule = Callable[..., Any]
VjpRule = Callable[..., list]
JVP = RuleTable("jvp", every_primitive)
VJP = RuleTable("vjp", every_primitive)
# Forward mode of primitives that compute their outputs and tangents together (a scan of the
# primal and tangent carries): `JVP_JOINT[name](tangents, primals, **params)` emits both and
# gives (outputs, tangents), one per output variable, instead of the equation being emitted
# first and its JVP rule after it. A partial table.
JVP_JOINT = RuleTable("jvp with outputs")
# Reverse mode of primitives that keep what their backward needs while they compute their
# forward (a scan's residuals, a custom_vjp's): `LINEARIZE[name](primals, active, **params)`
# emits the forward and gives its outputs (one per output variable) and a pullback
# `(cts, wanted) -> one cotangent per input`. A partial table.
LINEARIZE = RuleTable("linearize")


def jvp_by_joint(name: str) -> JvpRule:
    """A JVP rule from `name`'s JVP_JOINT rule (which computes the outputs again)."""
    def jvp(tangents: list, primals: list, out: Any, **params: Any) -> Any:
        return JVP_JOINT[name](tangents, primals, **params)[1]
    return jvp


def vjp_by_linearizing(name: str) -> VjpRule:
    """A VJP rule from `name`'s LINEARIZE rule: computes the forward again, then pulls back."""
    def vjp(ct: Any, wanted: Sequence[bool], primals: list, out: Any, **params: Any) -> list:
        cts = ct if PRIMITIVES[name].multiple_results else [ct]
        return LINEARIZE[name](primals, wanted, **params)[1](list(cts), wanted)
    return vjp

_LN2 = math.log(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


# --- elementwise: one JVP rule each, the VJP derived from it ---------------------------------

def _elementwise(name: str, rule: Callable[[list, list, Any], Any]) -> None:
    def jvp(tangents: list, primals: list, out: Any, **params: Any) -> Any:
        t = rule(tangents, primals, out)
        return None if t is None else fit(t, aval(out))

    def vjp(ct: Any, wanted: Sequence[bool], primals: list, out: Any, **params: Any) -> list:
        cts = []
        for i, want in enumerate(wanted):
            one_hot = [ct if j == i else None for j in range(len(primals))]
            g = rule(one_hot, primals, out) if want else None
            cts.append(None if g is None else sum_to(g, aval(primals[i])))
        return cts

    JVP[name], VJP[name] = jvp, vjp


def _unary(derivative: Callable[[Any, Any, Any], Any]) -> Callable[[list, list, Any], Any]:
    return lambda ts, xs, out: derivative(ts[0], xs[0], out)


def _safe_log_base(x: Any) -> Any:
    """log(x) where x != 0, else 0: d(x**y)/dy is 0 at x == 0 rather than nan."""
    return emit("log", emit("select", emit("eq", x, like(0, x)), like(1, x), x))


def _tie_share(x: Any, other: Any, out: Any) -> Any:
    """1 where x alone attains `out`, 1/2 where x and `other` tie, else 0."""
    share = emit("select", emit("eq", other, out), like(0.5, out), like(1, out))
    return emit("select", emit("eq", x, out), share, like(0, out))


def _sub_rule(ts: list, xs: list, out: Any) -> Any:
    tx, ty = ts
    return neg(ty) if tx is None else tx if ty is None else sub(tx, ty)


def _term(t: Any | None, scale: Callable[[Any], Any]) -> Any | None:
    """scale(t), or a symbolic zero for a zero tangent."""
    return None if t is None else scale(t)


def _chooser(ts: list, xs: list, out: Any) -> Any:
    (tx, ty), (x, y) = ts, xs
    return plus(_term(tx, lambda t: mul(t, _tie_share(x, y, out))),
                _term(ty, lambda t: mul(t, _tie_share(y, x, out))))


def _select_rule(ts: list, xs: list, out: Any) -> Any:
    _, ta, tb = ts
    if ta is None and tb is None:
        return None
    zero = like(0, out)
    return emit("select", xs[0], zero if ta is None else ta, zero if tb is None else tb)


_ELEMENTWISE: dict[str, Callable[[list, list, Any], Any]] = {
    "neg": _unary(lambda t, x, y: neg(t)),
    # 1 at 0 (and -0), as JAX: the derivative of the branch x >= 0
    "abs": _unary(lambda t, x, y: emit("select", emit("ge", x, like(0, x)), t, neg(t))),
    "exp": _unary(lambda t, x, y: mul(t, y)),
    "exp2": _unary(lambda t, x, y: mul(t, mul(y, like(_LN2, y)))),
    "log": _unary(lambda t, x, y: div(t, x)),
    "log2": _unary(lambda t, x, y: div(t, mul(x, like(_LN2, x)))),
    "log1p": _unary(lambda t, x, y: div(t, add(x, like(1, x)))),
    "expm1": _unary(lambda t, x, y: mul(t, add(y, like(1, y)))),
    "tanh": _unary(lambda t, x, y: mul(t, sub(like(1, y), mul(y, y)))),
    "logistic": _unary(lambda t, x, y: mul(t, mul(y, sub(like(1, y), y)))),
    "sqrt": _unary(lambda t, x, y: div(t, mul(y, like(2, y)))),
    "rsqrt": _unary(lambda t, x, y: mul(t, div(mul(y, like(-0.5, y)), x))),
    "sin": _unary(lambda t, x, y: mul(t, emit("cos", x))),
    "cos": _unary(lambda t, x, y: neg(mul(t, emit("sin", x)))),
    "erf": _unary(lambda t, x, y: mul(t, mul(emit("exp", neg(mul(x, x))), like(_TWO_OVER_SQRT_PI, x)))),
    "erfc": _unary(lambda t, x, y: mul(t, mul(emit("exp", neg(mul(x, x))), like(-_TWO_OVER_SQRT_PI, x)))),
    "add": lambda ts, xs, out: plus(*ts),
    "sub": _sub_rule,
    "mul": lambda ts, xs, out: plus(_term(ts[0], lambda t: mul(t, xs[1])),
                                    _term(ts[1], lambda t: mul(xs[0], t))),
    "div": lambda ts, xs, out: plus(_term(ts[0], lambda t: div(t, xs[1])),
                                    _term(ts[1], lambda t: neg(mul(t, div(out, xs[1]))))),
    # rem(x, y) = x - y * trunc(x / y), and trunc(x / y) = (x - rem) / y
    "rem": lambda ts, xs, out: plus(ts[0], _term(ts[1], lambda t: neg(mul(t, div(sub(xs[0], out), xs[1]))))),
    "pow": lambda ts, xs, out: plus(
        _term(ts[0], lambda t: mul(t, mul(xs[1], emit("pow", xs[0], sub(xs[1], like(1, xs[1])))))),
        _term(ts[1], lambda t: mul(t, mul(out, _safe_log_base(xs[0]))))),
    "max": _chooser,
    "min": _chooser,
    "select": _select_rule,
}
for _name, _rule in _ELEMENTWISE.items():
    _elementwise(_name, _rule)


def _no_derivative(*_: Any, **__: Any) -> None:
    """Piecewise-constant, integer- or boolean-valued primitives: the derivative is zero."""
    return None


def _no_cotangents(ct: Any, wanted: Sequence[bool], primals: list, out: Any, **_: Any) -> list:
    return [None] * len(primals)


# (bitcast_convert_type too: a float reinterpreted as another float's bits has no useful slope)
for _name in ("sign", "floor", "ceil", "round", "not", "and", "or", "xor", "eq", "ne", "lt", "le",
              "gt", "ge", "argmax", "argmin", "iota", "shift_left", "shift_right_logical",
              "shift_right_arithmetic", "population_count", "bitcast_convert_type"):
    JVP[_name], VJP[_name] = _no_derivative, _no_cotangents


def _convert_jvp(ts: list, xs: list, out: Any, *, new_dtype: Any) -> Any:
    return convert(ts[0], new_dtype) if new_dtype.is_float else None


def _convert_vjp(ct: Any, wanted: Sequence[bool], xs: list, out: Any, *, new_dtype: Any) -> list:
    dtype = aval(xs[0]).dtype
    return [convert(ct, dtype) if dtype.is_float else None]


JVP["convert_element_type"], VJP["convert_element_type"] = _convert_jvp, _convert_vjp


# --- linear primitives: the JVP applies the primitive to the tangent ----------------------

def _linear_jvp(name: str) -> JvpRule:
    return lambda ts, xs, out, **params: emit(name, ts[0], **params)


def _reduce_sum_vjp(ct, wanted, xs, out, *, axes):
    x = aval(xs[0])
    return [broadcast(ct, x.shape, kept_axes(x.ndim, axes))]


def _broadcast_vjp(ct, wanted, xs, out, *, shape, dims):
    x = aval(xs[0])
    stretched = [d for n, d in zip(x.shape, dims) if n == 1 and shape[d] != 1]
    return [reshape(reduce_sum(ct, [i for i in range(len(shape)) if i not in dims] + stretched), x.shape)]


def _reshape_vjp(ct, wanted, xs, out, *, shape):
    return [reshape(ct, aval(xs[0]).shape)]


def _transpose_vjp(ct, wanted, xs, out, *, permutation):
    return [transpose(ct, np.argsort(permutation).tolist())]


def _slice_vjp(ct, wanted, xs, out, *, start, limit, strides):
    x, picked = aval(xs[0]), aval(ct).shape
    if any(s > 1 for s in strides):
        # Give each picked element s - 1 zeros after it, so element i sits at offset i * s.
        split = [n for m, s in zip(picked, strides) for n in ((m, 1) if s > 1 else (m,))]
        gaps = [g for s in strides for g in ((0, s - 1) if s > 1 else (0,))]
        ct = emit("pad", reshape(ct, split), low=(0,) * len(split), high=tuple(gaps), value=0.0)
        ct = reshape(ct, [m * s for m, s in zip(picked, strides)])
    spans = [min(m * s, n - lo) for m, s, n, lo in zip(picked, strides, x.shape, start)]
    if tuple(spans) != aval(ct).shape:  # the last gap may run past the operand's end
        ct = emit("slice", ct, start=(0,) * x.ndim, limit=tuple(spans), strides=(1,) * x.ndim)
    return [emit("pad", ct, low=tuple(start),
                 high=tuple(n - lo - m for n, lo, m in zip(x.shape, start, spans)), value=0.0)]


def _pad_jvp(ts, xs, out, *, low, high, value):
    return emit("pad", ts[0], low=low, high=high, value=0.0)


def _pad_vjp(ct, wanted, xs, out, *, low, high, value):
    x = aval(xs[0])
    return [emit("slice", ct, start=tuple(low), limit=tuple(lo + n for lo, n in zip(low, x.shape)),
                 strides=(1,) * x.ndim)]


def _concatenate_jvp(ts, xs, out, *, dimension):
    parts = [zeros(aval(x)) if t is None else t for t, x in zip(ts, xs)]
    return emit("concatenate", *parts, dimension=dimension)


def _concatenate_vjp(ct, wanted, xs, out, *, dimension):
    shape, cts, offset = aval(out).shape, [], 0
    for want, x in zip(wanted, xs):
        size = aval(x).shape[dimension]
        if want:
            start = tuple(offset if i == dimension else 0 for i in range(len(shape)))
            limit = tuple(offset + size if i == dimension else n for i, n in enumerate(shape))
            cts.append(emit("slice", ct, start=start, limit=limit, strides=(1,) * len(shape)))
        else:
            cts.append(None)
        offset += size
    return cts


JVP.update({name: _linear_jvp(name) for name in
            ("reduce_sum", "broadcast_in_dim", "reshape", "transpose", "slice")})
VJP.update(reduce_sum=_reduce_sum_vjp, broadcast_in_dim=_broadcast_vjp, reshape=_reshape_vjp,
           transpose=_transpose_vjp, slice=_slice_vjp, pad=_pad_vjp, concatenate=_concatenate_vjp)
JVP.update(pad=_pad_jvp, concatenate=_concatenate_jvp)


# --- contraction ----------------------------------------------------------------------------

def _dot(lhs: Any, rhs: Any, dimension_numbers: Any, precision: str | None = None,
         preferred_element_type: Any = None) -> Any:
    return emit("dot_general", lhs, rhs, dimension_numbers=dimension_numbers, precision=precision,
                preferred_element_type=preferred_element_type)


def _dot_jvp(ts, xs, out, *, dimension_numbers, precision=None, preferred_element_type=None):
    (tl, tr), (lhs, rhs) = ts, xs
    return plus(_term(tl, lambda t: _dot(t, rhs, dimension_numbers, precision, preferred_element_type)),
                _term(tr, lambda t: _dot(lhs, t, dimension_numbers, precision, preferred_element_type)))


def _dot_transpose_lhs(ct: Any, lhs: Any, rhs: Any, dimension_numbers: Any, swap_ans: bool = False,
                       precision: str | None = None, preferred_element_type: Any = None) -> Any:
    """The cotangent of dot_general's lhs: contract ct with rhs over rhs's free axes (JAX's rule).
    With a wider `preferred_element_type` (bf16 operands, an f32 product), ct comes in the wide
    type: it meets rhs in the operands' type, the product accumulates wide, and the cotangent
    is rounded to lhs's type, as JAX does."""
    (lc, rc), (lb, rb) = dimension_numbers
    l_free = [i for i in range(aval(lhs).ndim) if i not in lc + lb]
    r_free = [i for i in range(aval(rhs).ndim) if i not in rc + rb]
    nb = len(lb)
    # ct's axes: batch, then lhs's free and rhs's free axes (the other way round when swapped).
    start = nb if swap_ans else nb + len(l_free)
    ct_r = tuple(range(start, start + len(r_free)))
    operand_dtype = aval(rhs).dtype
    wide = preferred_element_type is not None and preferred_element_type != operand_dtype
    got = _dot(convert(ct, operand_dtype) if wide else ct, rhs, ((ct_r, tuple(r_free)), (tuple(range(nb)), tuple(rb))),
               precision, preferred_element_type if wide else None)
    if wide:
        got = convert(got, aval(lhs).dtype)
    # `got` holds lhs's batch axes, its free axes, then its contracted axes in rhs's order.
    lc_by_r = [lc[i] for i in np.argsort(rc)]
    return transpose(got, np.argsort(list(lb) + l_free + lc_by_r).tolist())


def _dot_vjp(ct, wanted, xs, out, *, dimension_numbers, precision=None, preferred_element_type=None):
    lhs, rhs = xs
    (lc, rc), (lb, rb) = dimension_numbers
    swapped = ((rc, lc), (rb, lb))
    return [_dot_transpose_lhs(ct, lhs, rhs, dimension_numbers, False, precision, preferred_element_type)
            if wanted[0] else None,
            _dot_transpose_lhs(ct, rhs, lhs, swapped, True, precision, preferred_element_type)
            if wanted[1] else None]


JVP["dot_general"], VJP["dot_general"] = _dot_jvp, _dot_vjp


# --- indexing -------------------------------------------------------------------------------

def _gather_jvp(ts, xs, out, *, axis, batch_dims):
    return emit("gather", ts[0], xs[1], axis=axis, batch_dims=batch_dims)


def _gather_vjp(ct, wanted, xs, out, *, axis, batch_dims):
    x, idx = xs
    t = aval(x)
    n = t.shape[axis]
    # gather clamps its indices, scatter_add drops out-of-range ones: clamp so they agree.
    clamped = emit("max", emit("min", idx, like(n - 1, idx)), like(0, idx))
    if aval(idx).shape[batch_dims:] == (1,) and axis == batch_dims:
        # One index per batch point (take_along_axis picking one entry of each row): the
        # cotangent is one-hot along the axis, an elementwise select that fuses into its
        # consumers, where a scatter would first materialise an operand-sized array of zeros.
        # The indices' axes are x's batch axes and then `axis` (x's trailing axes follow it);
        # ct has x's shape with size 1 at `axis`.
        hit = emit("eq", emit("iota", dtype=aval(idx).dtype, shape=t.shape, dimension=axis),
                   broadcast(clamped, t.shape, tuple(range(batch_dims)) + (axis,)))
        return [emit("select", hit, broadcast(ct, t.shape, tuple(range(t.ndim))), like(0, ct)), None]
    return [emit("scatter_add", zeros(t), clamped, ct, axis=axis, batch_dims=batch_dims), None]


def _scatter_add_jvp(ts, xs, out, *, axis, batch_dims):
    (tx, _, tu), (x, idx, updates) = ts, xs
    return emit("scatter_add", zeros(aval(x)) if tx is None else tx, idx,
                zeros(aval(updates)) if tu is None else tu, axis=axis, batch_dims=batch_dims)


def _scatter_add_vjp(ct, wanted, xs, out, *, axis, batch_dims):
    x, idx, updates = xs
    if not wanted[2]:
        return [ct, None, None]
    n, index = aval(x).shape[axis], aval(idx)
    picked = emit("gather", ct, idx, axis=axis, batch_dims=batch_dims)
    # Updates at out-of-range indices were dropped, so they get no cotangent.
    inside = emit("and", emit("ge", idx, like(0, idx)), emit("lt", idx, like(n, idx)))
    where = tuple(range(batch_dims)) + tuple(range(axis, axis + index.ndim - batch_dims))
    mask = broadcast(inside, aval(updates).shape, where)
    return [ct if wanted[0] else None, None, emit("select", mask, picked, like(0, picked))]


JVP.update(gather=_gather_jvp, scatter_add=_scatter_add_jvp)
VJP.update(gather=_gather_vjp, scatter_add=_scatter_add_vjp)


# --- nonlinear reductions -------------------------------------------------------------------

def _chosen(x: Any, out: Any, axes: tuple[int, ...]) -> tuple[Any, Any]:
    """A 0/1 mask of the elements equal to their group's max (min), and each group's count."""
    t = aval(x)
    mask = convert(emit("eq", x, broadcast(out, t.shape, kept_axes(t.ndim, axes))), t.dtype)
    return mask, reduce_sum(mask, axes)


def _chooser_reduce_jvp(ts, xs, out, *, axes):
    mask, count = _chosen(xs[0], out, axes)
    return div(reduce_sum(mul(ts[0], mask), axes), count)


def _chooser_reduce_vjp(ct, wanted, xs, out, *, axes):
    t = aval(xs[0])
    mask, count = _chosen(xs[0], out, axes)
    return [mul(broadcast(div(ct, count), t.shape, kept_axes(t.ndim, axes)), mask)]


def _shift(v: Any, k: int, backward: bool) -> Any:
    """v moved k places along its last axis (toward the end, or toward the start), filled with 1."""
    shape = aval(v).shape
    rank, n = len(shape), shape[-1]
    zeros_but_last = (0,) * (rank - 1)
    padded = emit("pad", v, low=zeros_but_last + ((0 if backward else k),),
                  high=zeros_but_last + ((k if backward else 0),), value=1.0)
    first = k if backward else 0
    return emit("slice", padded, start=zeros_but_last + (first,), limit=shape[:-1] + (first + n,),
                strides=(1,) * rank)


def _exclusive_product(v: Any, backward: bool) -> Any:
    """Products of the elements before (or after) each position along the last axis, by
    log-depth doubling; exact where elements are zero, unlike out / x."""
    n = aval(v).shape[-1]
    p, k = _shift(v, 1, backward), 1
    while k < n:
        p, k = mul(p, _shift(p, k, backward)), 2 * k
    return p


def _product_of_others(x: Any, axes: tuple[int, ...]) -> Any:
    """For each element, the product of the other elements of its reduced group."""
    t = aval(x)
    order = list(kept_axes(t.ndim, axes)) + list(axes)
    moved = transpose(x, order)
    group = math.prod(t.shape[a] for a in axes)
    rows = reshape(moved, [t.shape[i] for i in order[:t.ndim - len(axes)]] + [group])
    others = mul(_exclusive_product(rows, False), _exclusive_product(rows, True))
    return transpose(reshape(others, aval(moved).shape), np.argsort(order).tolist())


def _reduce_prod_jvp(ts, xs, out, *, axes):
    return reduce_sum(mul(ts[0], _product_of_others(xs[0], axes)), axes)


def _reduce_prod_vjp(ct, wanted, xs, out, *, axes):
    t = aval(xs[0])
    return [mul(broadcast(ct, t.shape, kept_axes(t.ndim, axes)), _product_of_others(xs[0], axes))]


JVP.update(reduce_max=_chooser_reduce_jvp, reduce_min=_chooser_reduce_jvp, reduce_prod=_reduce_prod_jvp)
VJP.update(reduce_max=_chooser_reduce_vjp, reduce_min=_chooser_reduce_vjp, reduce_prod=_reduce_prod_vjp)


# --- interpreters ---------------------------------------------------------------------------

def _differentiable(atom: Any) -> bool:
    return atom.type.dtype.is_float


def jvp_graph(closed: ClosedGraph, primals: Sequence[Any],
              tangents: Sequence[Any | None]) -> tuple[list[Any], list[Any | None]]:
    """The outputs of `closed` at `primals` and their tangents along `tangents` (None: zero)."""
    env = Env(closed, list(zip(primals, tangents)), lift=lambda v: (v, None),
              cut=lambda pair: (stop_gradient(pair[0]), None))
    for eqn in closed.graph.eqns:
        pairs = [env.read(a) for a in eqn.inputs]
        values = [p for p, _ in pairs]
        ts = [t for _, t in pairs]
        tangents = [None] * len(eqn.outvars)
        moving = any(t is not None for t in ts) and any(map(_differentiable, eqn.outvars))
        if moving and eqn.primitive in JVP_JOINT:
            with source_line(eqn.source):
                outs, tangents = JVP_JOINT[eqn.primitive](ts, values, **eqn.param_dict)
        else:
            out = emit_eqn(eqn, values)
            outs = results_of(eqn, out)
            if moving:
                with source_line(eqn.source):
                    tangents = list(results_of(eqn, JVP[eqn.primitive](ts, values, out, **eqn.param_dict)))
        for var, value, tangent in zip(eqn.outvars, outs, tangents):
            env.write(var, (value, tangent if _differentiable(var) else None))
    outs = [env.read(a) for a in closed.graph.outvars]
    return [p for p, _ in outs], [t for _, t in outs]


def with_attention(closed: ClosedGraph) -> ClosedGraph:
    """`closed` with its hand-written attention rewritten to `attention` equations (where
    `config.recognize_attention`), before it is differentiated: the backward of a recognised
    attention is then `attention_bwd` (FlashAttention's, which recomputes P), where the
    derivative of the written-out softmax would keep the forward's T x S probabilities for the
    backward and no later pass could recognise either half.

    A `stop_gradient` in the trace is a constant standing for a value of the graph (glue.nn's
    softmax stops its row max), which the recogniser would take for an input: it reads a copy
    of the graph where each such constant is its source, and the equations it keeps go back to
    reading the constants (the cut stays where the program put it). A recognised attention that
    would read a stopped value directly is not taken."""
    if not config.recognize_attention:
        return closed
    graph = closed.graph
    stopped = {v.id: c.source for v, c in zip(graph.constvars, closed.consts) if isinstance(c, Stopped)}

    def source(atom: Any) -> Any:
        while isinstance(atom, Var) and atom.id in stopped:
            atom = stopped[atom.id]
        return atom

    def reading_sources(e: Eqn) -> Eqn:
        inputs = tuple(map(source, e.inputs))
        return e if inputs == e.inputs else replace(e, inputs=inputs)

    seen = tuple(map(reading_sources, graph.eqns)) if stopped else graph.eqns
    recognised, _ = recognize_attention(replace(graph, eqns=seen, outvars=tuple(map(source, graph.outvars))))
    if recognised.eqns is seen:
        return closed
    original = {id(s): e for s, e in zip(seen, graph.eqns)}
    cut = {a.id for a in stopped.values() if isinstance(a, Var)}
    eqns = []
    for eqn in recognised.eqns:
        if id(eqn) not in original and any(isinstance(a, Var) and a.id in cut for a in eqn.inputs):
            return closed
        eqns.append(original.get(id(eqn), eqn))
    return ClosedGraph(replace(graph, eqns=tuple(eqns)), closed.consts)


class Linearized:
    """A Graph evaluated at a point, ready to pull cotangents back through it (the VJP).

    An active equation whose primitive has a LINEARIZE rule computes its forward through the
    rule, which keeps what its backward needs (a scan's residuals); the others are re-emitted
    as they are and transposed by their VJP rules. `reuse` maps variables to values computed
    elsewhere (a checkpoint's saved values): equations defining only such variables are not
    emitted again."""

    def __init__(self, closed: ClosedGraph, primals: Sequence[Any], active: Sequence[bool],
                 reuse: Mapping[int, Any] | None = None):
        closed = with_attention(closed)
        self.graph: Graph = closed.graph
        self.env = Env(closed, primals, lift=lambda v: v, cut=stop_gradient)
        self.active = {v.id for v, a in zip(self.graph.invars, active) if a and _differentiable(v)}
        self.pullbacks: dict[int, Callable[[list, list], list]] = {}
        for i, eqn in enumerate(self.graph.eqns):
            values = [self.env.read(a) for a in eqn.inputs]
            flags = [self._is_active(a) for a in eqn.inputs]
            if reuse is not None and all(v.id in reuse for v in eqn.outvars):
                outs = [reuse[v.id] for v in eqn.outvars]
            elif any(flags) and eqn.primitive in LINEARIZE:
                with source_line(eqn.source):
                    outs, self.pullbacks[i] = LINEARIZE[eqn.primitive](values, flags, **eqn.param_dict)
            else:
                outs = results_of(eqn, emit_eqn(eqn, values))
            for var, value in zip(eqn.outvars, outs):
                self.env.write(var, value)
                if any(flags) and _differentiable(var):
                    self.active.add(var.id)
        self.outs = [self.env.read(a) for a in self.graph.outvars]

    def is_active(self, atom: Any) -> bool:
        """Whether `atom`'s value depends on the active inputs (it can have a cotangent)."""
        return self._is_active(atom)

    def _is_active(self, atom: Any) -> bool:
        return isinstance(atom, Var) and atom.id in self.active

    def transpose(self, out_cts: Sequence[Any | None]) -> list[Any | None]:
        """Cotangents of the inputs given those of the outputs (None: zero, both ways)."""
        cts: dict[int, Any] = {}

        def accumulate(atom: Any, ct: Any | None) -> None:
            if ct is not None and self._is_active(atom):
                cts[atom.id] = plus(cts.get(atom.id), ct)

        for atom, ct in zip(self.graph.outvars, out_cts):
            accumulate(atom, ct)
        for i in reversed(range(len(self.graph.eqns))):
            eqn = self.graph.eqns[i]
            out_cts = [cts.pop(v.id, None) for v in eqn.outvars]
            if all(ct is None for ct in out_cts):
                continue
            wanted = [self._is_active(a) for a in eqn.inputs]
            outs = [self.env.read(v) for v in eqn.outvars]
            ct, out = (out_cts, outs) if PRIMITIVES[eqn.primitive].multiple_results else (out_cts[0], outs[0])
            with source_line(eqn.source):
                pullback = self.pullbacks.get(i)
                in_cts = pullback(out_cts, wanted) if pullback is not None else \
                    VJP[eqn.primitive](ct, wanted, [self.env.read(a) for a in eqn.inputs], out, **eqn.param_dict)
                for atom, in_ct in zip(eqn.inputs, in_cts):
                    accumulate(atom, in_ct)
        return [cts.get(v.id) for v in self.graph.invars]
