"""Recognition of the attention programs write out by hand, rewritten to one `attention`
equation (which the scheduler then runs tiled, never making the T x S scores).

The pattern, read backwards from the product with v (`P @ v`, contracting P's last axis, over
P's two leading batch axes):

- P is a row softmax of logits x along the last axis: `e / sum(e)` with `e = exp(x - c)` for
  any per-row c (glue.nn.softmax's max-subtracted form), or `exp(x - logsumexp(x))`; 16-bit
  programs may compute it in float32 between converts;
- x is `where(mask, s, fill)` (optional; a mask that depends on no input and equals
  `tril(ones(T, S))` is the causal rule, any other is a mask operand), over `s + bias`
  (optional), over `s * scale` or `s / scale` (or q scaled before the product), over
  `s = q @ k^T`, a rank-4 product over two batch axes contracting the head size (any layout:
  the axes of q, k and v are read from the products' dimension numbers, so B,T,H,D and B,H,T,D
  programs both match).

Every value between the two products must be used only inside the pattern; otherwise it stays
as written, and the "fusion" stage says why (for instance, the scores are an output of the
program). Programs whose product with v is not over such a softmax are not reported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from glue.errors import GlueTypeError
from glue.ir import Eqn, Graph, Literal, TensorType, Var, infer_types, params_tuple
from glue.ir.core import Atom
from glue.ir.printer import graph_var_names
from glue.ir.primitives import PRECISIONS
from glue.scheduler.passes.dce import dce


class _NoMatch(Exception):
    """Not attention: the reason (None when it does not even look like attention)."""


@dataclass(frozen=True)
class _Found:
    q: Atom
    k: Atom
    v: Atom
    q_axes: tuple[int, ...]  # q's B, N, T, H axes
    k_axes: tuple[int, ...]
    v_axes: tuple[int, ...]
    bias: tuple[Atom, tuple[int, ...]] | None  # the value, and its shape as a (B, N, T, S) operand
    mask: tuple[Atom, tuple[int, ...]] | None  # None for the causal rule
    drops: bool              # the mask says which logits to drop (`where(m, fill, s)`)
    causal: bool
    scale: float
    fill: float
    cone: frozenset[int]     # equations (indices) the attention replaces
    scores: Var
    precision: str           # the stricter of the two products' precisions


class _Graph:
    """Producers and users of a graph's variables, and their printed names (for the notes)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        # Named once per graph: naming is linear in the graph, and every product is matched.
        self.names = graph_var_names(graph)
        self.producer: dict[int, int] = {}
        self.users: dict[int, list[int]] = {}
        for i, e in enumerate(graph.eqns):
            for v in e.outvars:
                self.producer[v.id] = i
            for a in e.inputs:
                if isinstance(a, Var):
                    self.users.setdefault(a.id, []).append(i)
        self.outputs = {a.id for a in graph.outvars if isinstance(a, Var)}

    def eqn(self, atom: Atom, *primitives: str) -> Eqn | None:
        """The equation defining `atom` when it is one of `primitives`."""
        i = self.producer.get(atom.id) if isinstance(atom, Var) else None
        e = None if i is None else self.graph.eqns[i]
        return e if e is not None and e.primitive in primitives else None

    def strip(self, atom: Atom, *primitives: str) -> Atom:
        """`atom` with the unary `primitives` defining it peeled off."""
        while (e := self.eqn(atom, *primitives)) is not None:
            atom = e.inputs[0]
        return atom

    def depends_on_inputs(self, atom: Atom) -> bool:
        seen, todo = set(), [atom]
        inputs = {v.id for v in self.graph.invars + self.graph.constvars}
        while todo:
            a = todo.pop()
            if not isinstance(a, Var) or a.id in seen:
                continue
            seen.add(a.id)
            if a.id in inputs:
                return True
            todo.extend(self.graph.eqns[self.producer[a.id]].inputs)
        return False


def _literal(atom: Atom) -> float | None:
    return float(atom.value) if isinstance(atom, Literal) else None


def _row_value(g: _Graph, atom: Atom, rows: tuple[int, ...]) -> Atom | None:
    """The per-row value (constant along the last axis) `atom` broadcasts, or None."""
    e = g.eqn(atom, "broadcast_in_dim")
    if e is None:
        return None
    src = e.inputs[0]
    p = e.param_dict
    last = len(p["shape"]) - 1
    per_row = last not in p["dims"] or src.type.shape[p["dims"].index(last)] == 1
    return g.strip(src, "reshape") if per_row and tuple(p["shape"][:-1]) == rows else None


def _reduces(g: _Graph, atom: Atom, name: str, of: Atom) -> bool:
    e = g.eqn(g.strip(atom, "reshape"), name)
    return e is not None and e.inputs[0] is of and e.param_dict["axes"] == (of.type.ndim - 1,)


def _shifted_exp(g: _Graph, atom: Atom) -> tuple[Atom, Atom] | None:
    """(x, c) where atom is exp(x - broadcast c) with c per row."""
    e = g.eqn(atom, "exp")
    sub = e and g.eqn(e.inputs[0], "sub")
    if sub is None:
        return None
    x, shift = sub.inputs
    c = _row_value(g, shift, x.type.shape[:-1])
    return None if c is None else (x, c)


def _is_logsumexp(g: _Graph, atom: Atom, x: Atom) -> bool:
    """atom is log(sum(exp(x - c))) + c (c per row), as logsumexp writes it."""
    add = g.eqn(atom, "add")
    if add is None:
        return False
    for log_side, c in (add.inputs, add.inputs[::-1]):
        log = g.eqn(log_side, "log")
        if log is None:
            continue
        total = g.eqn(g.strip(g.strip(log.inputs[0], "abs"), "reshape"), "reduce_sum")
        inner = total and _shifted_exp(g, total.inputs[0])
        if inner and inner[0] is x and g.strip(inner[1], "reshape") is g.strip(c, "reshape") \
                and total.param_dict["axes"] == (x.type.ndim - 1,):
            return True
    return False


def _softmax_of(g: _Graph, p: Atom) -> Atom:
    """The logits x that p is the row softmax of (raises _NoMatch(None) when it is none)."""
    p = g.strip(p, "convert_element_type")
    div = g.eqn(p, "div")
    if div is not None:
        shifted = _shifted_exp(g, div.inputs[0])
        total = _row_value(g, div.inputs[1], p.type.shape[:-1])
        if shifted and total is not None and _reduces(g, total, "reduce_sum", div.inputs[0]):
            return shifted[0]
    shifted = _shifted_exp(g, p)
    if shifted and _is_logsumexp(g, shifted[1], shifted[0]):
        return shifted[0]
    raise _NoMatch(None)


def _four_d(g: _Graph, atom: Atom) -> tuple[Atom, tuple[int, ...]]:
    """What a (B, N, T, S) broadcast value broadcasts: its source, with the rank-4 shape it
    has once reshaped (1 for the axes it stretches along)."""
    e = g.eqn(atom, "broadcast_in_dim")
    if e is None:
        return atom, atom.type.shape
    p = e.param_dict
    shape = [1] * 4
    for n, d in zip(e.inputs[0].type.shape, p["dims"]):
        shape[d] = n
    return e.inputs[0], tuple(shape)


def _causal(g: _Graph, mask: Atom, shape4: tuple[int, ...], drops: bool) -> bool:
    """Whether a mask that depends on no input keeps tril(ones(T, S)) in every (B, N) (drops
    its complement, with `drops`)."""
    from glue.reference import run_graph

    if g.depends_on_inputs(mask) or shape4[0] != 1 or shape4[1] != 1:
        return False
    needed, todo = set(), [mask]
    while todo:
        a = todo.pop()
        if isinstance(a, Var) and g.producer[a.id] not in needed:
            needed.add(g.producer[a.id])
            todo.extend(g.graph.eqns[g.producer[a.id]].inputs)
    sub = Graph((), (), tuple(g.graph.eqns[i] for i in sorted(needed)), (mask,))
    value = np.asarray(run_graph(sub, [])[0]).reshape(shape4[2:]) != drops
    return bool(np.array_equal(value, np.tril(np.ones(value.shape, bool))))


def _scale(g: _Graph, s: Atom) -> tuple[Atom, float]:
    """(product, scale) of `s = product * scale` or `product / scale` (scale 1 when neither)."""
    e = g.eqn(s, "mul", "div")
    if e is not None:
        a, b = e.inputs
        if e.primitive == "mul" and _literal(a) is not None:
            a, b = b, a
        if _literal(b) is not None:
            return a, (1.0 / _literal(b)) if e.primitive == "div" else _literal(b)
    return s, 1.0


def _match(g: _Graph, index: int) -> _Found:
    pv = g.graph.eqns[index]
    p, v = pv.inputs
    x = _softmax_of(g, p)
    if not isinstance(x, Var) or x.type.ndim != 4:
        raise _NoMatch("the softmax is not over rank-4 scores")
    (pc, vc), (pb, vb) = pv.param_dict["dimension_numbers"]
    if pc != (3,) or pb != (0, 1) or v.type.ndim != 4:
        raise _NoMatch("the product with v does not contract the softmax's last axis over its two leading axes")
    logits = g.strip(x, "convert_element_type")
    masked = g.eqn(logits, "select")
    mask = bias = None
    causal, fill, drops = False, -math.inf, False
    if masked is not None and _literal(masked.inputs[2]) is not None:
        mask, fill, logits = masked.inputs[0], _literal(masked.inputs[2]), masked.inputs[1]
    elif masked is not None and _literal(masked.inputs[1]) is not None:
        mask, fill, logits, drops = masked.inputs[0], _literal(masked.inputs[1]), masked.inputs[2], True
    add = g.eqn(logits, "add")
    if add is not None:
        logits, bias = add.inputs
        if g.eqn(logits, "dot_general", "mul", "div", "convert_element_type") is None:
            logits, bias = bias, logits
    product, scale = _scale(g, g.strip(logits, "convert_element_type"))
    scores = g.eqn(g.strip(product, "convert_element_type"), "dot_general")
    if scores is None:
        raise _NoMatch("the logits are not a product of q and k")
    (qc, kc), (qb, kb) = scores.param_dict["dimension_numbers"]
    q, k = scores.inputs
    if len(qc) != 1 or len(qb) != 2 or q.type.ndim != 4 or k.type.ndim != 4:
        raise _NoMatch("the scores are not a rank-4 product over two batch axes contracting one")
    if scale == 1.0:  # the scale applied to q instead
        q, scale = _scale(g, q)
    if not q.type.dtype == k.type.dtype == v.type.dtype:
        raise _NoMatch("q, k and v differ in dtype")
    def free(used: tuple[int, ...]) -> int:
        return next(i for i in range(4) if i not in used)

    q_axes = tuple(qb) + (free(qb + qc),) + tuple(qc)
    k_axes = tuple(kb) + (free(kb + kc),) + tuple(kc)
    v_axes = tuple(vb) + tuple(vc) + (free(vb + vc),)
    leaves = {id(a) for a in (q, k, v, bias, mask) if a is not None}
    found = []
    if mask is not None:
        mask, shape4 = _four_d(g, mask)
        causal = _causal(g, mask, shape4, drops)
        found.append((mask, shape4))
    if bias is not None:
        bias, bshape = _four_d(g, bias)
        found.append((bias, bshape))
    leaves |= {id(a) for a, _ in found}
    cone = _cone(g, p, leaves)
    _check_uses(g, cone, index, scores.outvars[0])
    return _Found(q, k, v, q_axes, k_axes, v_axes, None if bias is None else (bias, bshape),
                  None if mask is None or causal else (mask, shape4), drops, causal, scale, fill, frozenset(cone),
                  scores.outvars[0], _stricter(scores, pv))


def _stricter(*products: Eqn) -> str:
    """The most exact precision among the products' (one that names none counts as exact)."""
    return max((e.param_dict.get("precision") or "highest" for e in products), key=PRECISIONS.index)


def _cone(g: _Graph, p: Atom, leaves: set[int]) -> set[int]:
    """The equations computing p from the leaves."""
    cone, todo = set(), [p]
    while todo:
        a = todo.pop()
        if not isinstance(a, Var) or id(a) in leaves or a.id not in g.producer:
            continue
        i = g.producer[a.id]
        if i not in cone:
            cone.add(i)
            todo.extend(g.graph.eqns[i].inputs)
    return cone


def _check_uses(g: _Graph, cone: set[int], index: int, scores: Var) -> None:
    names = g.names
    for i in sorted(cone):
        for var in g.graph.eqns[i].outvars:
            what = "the scores" if var is scores else f"{names[var.id]} (between the two products)"
            if var.id in g.outputs:
                raise _NoMatch(f"{what} {'are' if var is scores else 'is'} an output of the program")
            outside = [u for u in g.users.get(var.id, []) if u not in cone and u != index]
            if outside:
                raise _NoMatch(f"{what} {'are' if var is scores else 'is'} also used by "
                               f"{g.graph.eqns[outside[0]].primitive} {names[g.graph.eqns[outside[0]].outvars[0].id]}")


def _replacement(found: _Found, pv: Eqn) -> tuple[Eqn, ...]:
    eqns = []

    def emit(name: str, inputs: tuple, type_: TensorType, **params: Any) -> Var:
        out = Var(type_)
        eqns.append(Eqn(name, inputs, params_tuple(params), (out,), pv.source))
        return out

    def bnth(x: Atom, axes: tuple[int, ...]) -> Atom:
        if axes == (0, 1, 2, 3):
            return x
        return emit("transpose", (x,), TensorType(tuple(x.type.shape[a] for a in axes), x.type.dtype),
                    permutation=axes)

    def four(extra: tuple[Atom, tuple[int, ...]] | None) -> list[Atom]:
        if extra is None:
            return []
        x, shape = extra
        return [x if x.type.shape == shape else emit("reshape", (x,), TensorType(shape, x.type.dtype), shape=shape)]

    q, k, v = bnth(found.q, found.q_axes), bnth(found.k, found.k_axes), bnth(found.v, found.v_axes)
    bias = four(found.bias)
    if bias and bias[0].type.dtype != q.type.dtype:
        bias = [emit("convert_element_type", (bias[0],), TensorType(bias[0].type.shape, q.type.dtype),
                     new_dtype=q.type.dtype)]
    mask = four(found.mask)
    if mask and found.drops:
        mask = [emit("not", (mask[0],), mask[0].type)]
    params = dict(scale=float(found.scale), causal=found.causal, layout="BNTH", masked_value=float(found.fill),
                  has_bias=bool(bias), has_mask=bool(mask), precision=found.precision)
    operands = (q, k, v, *bias, *mask)
    try:
        out_type, lse_type = infer_types("attention", tuple(a.type for a in operands), params)
    except GlueTypeError as err:
        raise _NoMatch(f"its operands do not make an attention: {err}") from None
    out = pv.outvars[0]
    if out_type != out.type:
        raise _NoMatch(f"attention would give {out_type} where the program has {out.type}")
    eqns.append(Eqn("attention", operands, params_tuple(params), (out, Var(lse_type)), pv.source))
    return tuple(eqns)


def recognize_attention(graph: Graph, dtypes: frozenset | None = None) -> tuple[Graph, tuple[str, ...]]:
    """`graph` with each hand-written attention replaced by an `attention` equation, and a line
    per attention-like product saying whether it matched and, if not, why; with `dtypes`, only
    attention over q, k and v of those types."""
    if not any(e.primitive == "dot_general" for e in graph.eqns):
        return graph, ()
    g = _Graph(graph)
    names = g.names
    notes, replaced, taken = [], {}, set()
    for i, eqn in enumerate(graph.eqns):
        if eqn.primitive != "dot_general" or eqn.inputs[0].type.ndim != 4:
            continue
        out = names[eqn.outvars[0].id]
        try:
            found = _match(g, i)
        except _NoMatch as no:
            if no.args[0] is not None:
                notes.append(f"{out} = attention not recognised: {no.args[0]}")
            continue
        if found.cone & taken:
            continue
        if dtypes is not None and found.q.type.dtype not in dtypes:
            continue
        try:
            replaced[i] = _replacement(found, eqn)
        except _NoMatch as no:
            notes.append(f"{out} = attention not recognised: {no.args[0]}")
            continue
        taken |= found.cone
        mask = "causal" if found.causal else "masked" if found.mask is not None else "no mask"
        notes.append(f"{out} = attention recognised: scores {names[found.scores.id]} (scale {found.scale:g}, "
                     f"{mask}{', bias' if found.bias is not None else ''}) over q {names[found.q.id]}, "
                     f"k {names[found.k.id]}, v {names[found.v.id]}")
    if not replaced:
        return graph, tuple(notes)
    eqns = [new for i, e in enumerate(graph.eqns) for new in (replaced[i] if i in replaced else (e,))]
    return dce(Graph(graph.constvars, graph.invars, tuple(eqns), graph.outvars)), tuple(notes)
