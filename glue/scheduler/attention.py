"""How `attention` and `attention_bwd` run: tiled over the key/value positions, as scans whose
body handles one K/V tile, so that no buffer of T x S scores is ever made (FlashAttention's
online softmax: a running row max, row sum and output accumulator are the scan's carries).

`expand_attention(graph)` replaces every attention equation by such a scan with the layout
work around it (q folded to (B, K, G*T, H) so a group of query heads shares its kv head, k and
v padded to whole tiles and stacked tile by tile); both backends then run the scan as the
call kernel they already have, compiling its body once. The backward is one scan too: P is
recomputed from the saved row logsumexp, dq is a carry, dk and dv come out tile by tile.

The math is written once against `Ops`, over any emitter (`GraphBuilder` here; the frontend's
`emit` for the JVP rule, which uses `unfused_attention`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from glue.ir import Eqn, Graph, Literal, TensorType, Var, infer_types, params_tuple, primitive
from glue.ir import dtypes as dt
from glue.ir.primitives import attention_accumulator, attention_dims
from glue.scheduler.fusion import Fusion, fuse
from glue.scheduler.passes import optimize
from glue.scheduler.passes.attention import recognize_attention

# A scores tile of at most this many elements per scan step: a few MiB, the size at which the
# tile's row kernels still run from the last-level cache on the CPU.
TILE_ELEMENTS = 1 << 20
MIN_TILE, MAX_TILE = 16, 256


class Ops:
    """Array operations over an emitter `emit(primitive, *operands, **params)`, `type_of(x)`
    and `scalar(value, dtype)` (a literal operand)."""

    def __init__(self, emit: Callable[..., Any], type_of: Callable[[Any], TensorType],
                 scalar: Callable[[Any, dt.DType], Any]):
        self.emit, self.type_of, self.scalar = emit, type_of, scalar

    def shape(self, x: Any) -> tuple[int, ...]:
        return self.type_of(x).shape

    def lit(self, value: Any, like: Any) -> Any:
        return self.scalar(value, self.type_of(like).dtype)

    def convert(self, x: Any, dtype: dt.DType) -> Any:
        return x if self.type_of(x).dtype == dtype else self.emit("convert_element_type", x, new_dtype=dtype)

    def reshape(self, x: Any, shape: Sequence[int]) -> Any:
        return x if self.shape(x) == tuple(shape) else self.emit("reshape", x, shape=tuple(shape))

    def transpose(self, x: Any, perm: Sequence[int]) -> Any:
        perm = tuple(perm)
        return x if perm == tuple(range(len(perm))) else self.emit("transpose", x, permutation=perm)

    def broadcast(self, x: Any, shape: Sequence[int], dims: Sequence[int] | None = None) -> Any:
        """x broadcast to `shape`; by default x has `shape`'s rank with 1s where it stretches."""
        dims = tuple(range(len(shape))) if dims is None else tuple(dims)
        if self.shape(x) == tuple(shape) and dims == tuple(range(len(shape))):
            return x
        return self.emit("broadcast_in_dim", x, shape=tuple(shape), dims=dims)

    def rows(self, x: Any, like: Any) -> Any:
        """A per-row value (..., R) broadcast along the last axis of `like` (..., R, C)."""
        shape = self.shape(like)
        return self.broadcast(x, shape, range(len(shape) - 1))

    def dot(self, a: Any, b: Any, contract: tuple[int, int]) -> Any:
        """A product batched over the two leading axes, contracting axis `contract[0]` of a
        with axis `contract[1]` of b (both rank 4)."""
        return self.emit("dot_general", a, b, dimension_numbers=(((contract[0],), (contract[1],)), ((0, 1), (0, 1))),
                         precision="highest", preferred_element_type=None)

    def reduce(self, name: str, x: Any, axis: int) -> Any:
        return self.emit(name, x, axes=(axis,))

    def to_bnth(self, x: Any, layout: str) -> Any:
        return self.transpose(x, (0, 2, 1, 3)) if layout == "BTNH" else x

    def iota(self, shape: Sequence[int], dimension: int) -> Any:
        return self.emit("iota", dtype=dt.int32, shape=tuple(shape), dimension=dimension)


@dataclass(frozen=True)
class Spec:
    """An attention equation's dimensions and params."""

    b: int
    n: int
    t: int
    h: int
    kv: int
    s: int
    hv: int
    scale: float
    causal: bool
    layout: str
    masked_value: float
    has_bias: bool
    has_mask: bool
    dtype: dt.DType

    @staticmethod
    def of(q: TensorType, k: TensorType, v: TensorType, params: dict[str, Any]) -> "Spec":
        dims = attention_dims(q, k, v, params["layout"])
        return Spec(*dims, params["scale"], params["causal"], params["layout"], params["masked_value"],
                    params["has_bias"], params["has_mask"], q.dtype)

    @property
    def group(self) -> int:
        return self.n // self.kv

    @property
    def acc(self) -> dt.DType:
        return attention_accumulator(self.dtype)

    def folded(self, cols: int) -> tuple[int, ...]:
        """(B, K, G*T, cols): q's rows grouped under the kv head they read."""
        return self.b, self.kv, self.group * self.t, cols


def _folded(ops: Ops, x: Any, spec: Spec, cols: int) -> Any:
    """A (B, N, T, cols) value as (B, K, G*T, cols)."""
    return ops.reshape(x, spec.folded(cols))


def _unfolded(ops: Ops, x: Any, spec: Spec) -> Any:
    cols = ops.shape(x)[-1]
    return ops.reshape(x, (spec.b, spec.n, spec.t, cols))


def _keep(ops: Ops, spec: Spec, mask: Any | None, start: Any | None, cols: int) -> tuple[Any | None, Any | None]:
    """Which logits of a (B, K, G*T, cols) block of keys from `start` on count: (keep, valid),
    keep for the causal rule and the mask, valid for keys inside S (None: all)."""
    keep = valid = None
    if spec.causal or start is not None:
        query = ops.iota((spec.t, cols), 0)
        key = ops.iota((spec.t, cols), 1)
        if start is not None:
            key = ops.emit("add", key, ops.broadcast(start, (spec.t, cols), ()))
            if spec.s % cols or cols != spec.s:
                valid = ops.emit("lt", key, ops.lit(spec.s, key))
        if spec.causal:
            keep = ops.emit("ge", query, key)
    full = (spec.b, spec.n, spec.t, cols)
    if mask is not None:
        mask = ops.broadcast(mask, full)
        keep = mask if keep is None else ops.emit("and", mask, ops.broadcast(keep, full, (2, 3)))
    elif keep is not None:
        keep = ops.broadcast(keep, full, (2, 3))
    if valid is not None:
        valid = ops.broadcast(valid, full, (2, 3))
    fold = lambda x: None if x is None else _folded(ops, x, spec, cols)  # noqa: E731
    return fold(keep), fold(valid)


def _logits(ops: Ops, spec: Spec, q5: Any, k: Any, bias: Any | None, keep: Any | None, fill: float) -> Any:
    """Scores (B, K, G*T, cols) of the scaled, folded q against keys k (B, K, cols, H), `fill`
    where `keep` is false."""
    s = ops.dot(q5, k, (3, 3))
    cols = ops.shape(k)[2]
    if bias is not None:
        full = ops.broadcast(ops.convert(bias, spec.acc), (spec.b, spec.n, spec.t, cols))
        s = ops.emit("add", s, _folded(ops, full, spec, cols))
    return s if keep is None else ops.emit("select", keep, s, ops.lit(fill, s))


def _scaled_q(ops: Ops, spec: Spec, q: Any) -> Any:
    q = ops.convert(ops.to_bnth(q, spec.layout), spec.acc)
    return _folded(ops, ops.emit("mul", q, ops.lit(spec.scale, q)), spec, spec.h)


def _kv(ops: Ops, spec: Spec, x: Any) -> Any:
    return ops.convert(ops.to_bnth(x, spec.layout), spec.acc)


def _back(ops: Ops, spec: Spec, x: Any, dtype: dt.DType) -> Any:
    """A (B, heads, T, cols) result in the equation's layout and `dtype`."""
    return ops.convert(ops.to_bnth(x, spec.layout), dtype)


def unfused_attention(ops: Ops, spec: Spec, q: Any, k: Any, v: Any, bias: Any | None,
                      mask: Any | None) -> tuple[Any, Any]:
    """(out, lse) computed the plain way, with the whole T x S scores (the JVP rule's form)."""
    q5 = _scaled_q(ops, spec, q)
    keep, _ = _keep(ops, spec, mask, None, spec.s)
    s = _logits(ops, spec, q5, _kv(ops, spec, k), bias, keep, spec.masked_value)
    m = ops.reduce("reduce_max", s, 3)
    e = ops.emit("exp", ops.emit("sub", s, ops.rows(m, s)))
    total = ops.reduce("reduce_sum", e, 3)
    p = ops.emit("div", e, ops.rows(total, e))
    out = ops.dot(p, _kv(ops, spec, v), (3, 2))
    lse = ops.emit("add", m, ops.emit("log", total))
    return _back(ops, spec, _unfolded(ops, out, spec), spec.dtype), ops.reshape(lse, (spec.b, spec.n, spec.t))


# --- building graphs ---------------------------------------------------------------------

class GraphBuilder:
    """Equations appended one by one, each typed by its primitive's rule."""

    def __init__(self, source: str | None):
        self.source = source
        self.eqns: list[Eqn] = []
        self.ops = Ops(self.emit, lambda a: a.type, lambda value, dtype: Literal(
            {"bool": bool, "int": int, "float": float}[dtype.kind](value), TensorType((), dtype)))

    def emit(self, name: str, *inputs: Any, outvars: Sequence[Var] | None = None, **params: Any) -> Any:
        types = infer_types(name, tuple(a.type for a in inputs), params, self.source)
        outs = tuple(outvars) if outvars is not None else tuple(Var(t) for t in types)
        self.eqns.append(Eqn(name, tuple(inputs), params_tuple(params), outs, self.source))
        return outs if primitive(name).multiple_results else outs[0]


def tile_size(spec: Spec) -> int:
    """Keys per scan step: a power of two whose scores tile fits TILE_ELEMENTS, within
    [MIN_TILE, MAX_TILE], and no more than S needs."""
    rows = spec.b * spec.n * spec.t
    size = 1 << max(0, (TILE_ELEMENTS // max(rows, 1)).bit_length() - 1)
    size = min(max(size, MIN_TILE), MAX_TILE)
    return min(size, -(-spec.s // 8) * 8)


@dataclass(frozen=True)
class _Tiled:
    """A (B|1, heads|1, rows|1, S) value cut along S: stacked tiles for the scan's xs, or, when
    it does not vary along S, one value every step sees."""

    value: Any
    stacked: bool


def _stack(b: GraphBuilder, x: Any, axis: int, tile: int, count: int, pad_value: Any) -> Any:
    """x cut along `axis` into `count` tiles of `tile` (padded with `pad_value`), the tile index
    first: (count, ..., tile, ...)."""
    ops = b.ops
    shape = ops.shape(x)
    extra = tile * count - shape[axis]
    if extra:
        high = tuple(extra if i == axis else 0 for i in range(len(shape)))
        x = ops.emit("pad", x, low=(0,) * len(shape), high=high, value=pad_value)
    split = ops.reshape(x, shape[:axis] + (count, tile) + shape[axis + 1:])
    return ops.transpose(split, (axis,) + tuple(i for i in range(len(shape) + 1) if i != axis))


def _along_keys(b: GraphBuilder, x: Any | None, tile: int, count: int, pad_value: Any) -> _Tiled | None:
    """A bias or mask (rank 4, keys last) tiled along the keys when it varies along them."""
    if x is None:
        return None
    if b.ops.shape(x)[3] == 1:
        return _Tiled(x, False)
    return _Tiled(_stack(b, x, 3, tile, count, pad_value), True)


def _body_graph(inputs: Sequence[Var], build: Callable[[GraphBuilder, list[Var]], Sequence[Any]],
                source: str | None) -> Graph:
    body = GraphBuilder(source)
    outs = build(body, list(inputs))
    return Graph((), tuple(inputs), tuple(body.eqns), tuple(outs))


def _slice_var(x: Any) -> Var:
    """A scan body's input for one slice of a stacked operand."""
    return Var(TensorType(x.type.shape[1:], x.type.dtype))


def _scan(b: GraphBuilder, carry: Sequence[Any], consts: Sequence[Any], xs: Sequence[Any], length: int,
          build: Callable[[GraphBuilder, list[Var]], Sequence[Any]]) -> Sequence[Var]:
    inputs = [Var(a.type) for a in list(carry) + list(consts)] + [_slice_var(x) for x in xs]
    body = _body_graph(inputs, build, b.source)
    return b.emit("scan", *carry, *consts, *xs, body=body, length=length, reverse=False,
                  num_carry=len(carry), num_consts=len(consts))


def _split(eqn: Eqn) -> tuple[Spec, Any, Any, Any, Any | None, Any | None, tuple]:
    params = eqn.param_dict
    q, k, v = eqn.inputs[:3]
    spec = Spec.of(q.type, k.type, v.type, params)
    extras = eqn.inputs[3:3 + spec.has_bias + spec.has_mask]
    bias = extras[0] if spec.has_bias else None
    mask = extras[spec.has_bias] if spec.has_mask else None
    return spec, q, k, v, bias, mask, eqn.inputs[3 + len(extras):]


class _Steps:
    """The per-tile inputs a scan body reads: k and v tiles, the tile's first key, bias and
    mask tiles (or whole values), in the order the body's inputs list them."""

    def __init__(self, b: GraphBuilder, spec: Spec, k: Any, v: Any, bias: Any | None, mask: Any | None):
        ops = b.ops
        self.tile = tile = tile_size(spec)
        self.count = count = -(-spec.s // tile)
        self.k = _stack(b, _kv(ops, spec, k), 2, tile, count, 0.0)
        self.v = _stack(b, _kv(ops, spec, v), 2, tile, count, 0.0)
        starts = ops.emit("mul", ops.iota((count,), 0), Literal(tile, TensorType((), dt.int32)))
        self.start = starts
        self.bias = _along_keys(b, bias, tile, count, 0.0)
        self.mask = _along_keys(b, mask, tile, count, False)
        self.extras = [x for x in (self.bias, self.mask) if x is not None]

    def consts(self) -> list[Any]:
        return [x.value for x in self.extras if not x.stacked]

    def xs(self) -> list[Any]:
        return [self.k, self.v, self.start] + [x.value for x in self.extras if x.stacked]

    def read(self, consts: list[Var], xs: list[Var]) -> tuple[Var, Var, Var, Var | None, Var | None]:
        """(k tile, v tile, start, bias, mask) among a body's inputs."""
        consts, (k, v, start), xs = list(consts), xs[:3], list(xs[3:])
        got = [(xs if x.stacked else consts).pop(0) for x in self.extras]
        bias = got.pop(0) if self.bias is not None else None
        mask = got.pop(0) if self.mask is not None else None
        return k, v, start, bias, mask


def _tile_logits(ops: Ops, spec: Spec, steps: _Steps, q5: Any, k: Any, start: Any, bias: Any | None,
                 mask: Any | None) -> tuple[Any, Any | None, Any | None]:
    """One tile's logits (B, K, G*T, tile), -inf where they do not count (masked, or padding
    past S), which count and which are keys inside S (None: all). Masked logits take masked_value in the definition;
    that is -inf too wherever a row keeps anything (exp underflows to 0 either way), and rows
    that keep nothing are the `_empty_rows` case."""
    keep, valid = _keep(ops, spec, mask, start, steps.tile)
    counted = keep if valid is None else valid if keep is None else ops.emit("and", keep, valid)
    return _logits(ops, spec, q5, k, bias, counted, -math.inf), counted, valid


def _empty_rows(spec: Spec) -> bool:
    """Whether a row may keep no logit and must then average v uniformly, as masking every
    logit with a finite masked_value does (JAX's), where the tiles' -inf would give 0 / 0.
    Only a mask can empty a row (the causal rule keeps key 0); a fill of -inf gives NaN in
    the definition too."""
    return spec.has_mask and spec.masked_value > -math.inf


def _empty_lse(spec: Spec) -> float:
    """The logsumexp of a row that keeps nothing: S logits of masked_value."""
    return spec.masked_value + math.log(spec.s)


def _safe_max(ops: Ops, m: Any) -> Any:
    """m with -inf (a row with nothing counted yet) as 0, so exp(x - m) is 0, not NaN."""
    return ops.emit("select", ops.emit("eq", m, ops.lit(-math.inf, m)), ops.lit(0.0, m), m)


def _expand_forward(eqn: Eqn) -> list[Eqn]:
    b = GraphBuilder(eqn.source)
    ops = b.ops
    spec, q, k, v, bias, mask, _ = _split(eqn)
    q5 = _scaled_q(ops, spec, q)
    steps = _Steps(b, spec, k, v, bias, mask)
    rows = spec.folded(0)[:3]
    m0 = ops.broadcast(ops.scalar(-math.inf, spec.acc), rows, ())
    l0 = ops.broadcast(ops.scalar(0.0, spec.acc), rows, ())
    acc0 = ops.broadcast(ops.scalar(0.0, spec.acc), spec.folded(spec.hv), ())

    def step(body: GraphBuilder, inputs: list[Var]) -> list[Any]:
        o = body.ops
        (m, l, acc, q5_), rest = inputs[:4], inputs[4:]
        consts, xs = rest[:len(steps.consts())], rest[len(steps.consts()):]
        kt, vt, start, bt, mt = steps.read(consts, xs)
        s, _, _ = _tile_logits(o, spec, steps, q5_, kt, start, bt, mt)
        m_new = o.emit("max", m, o.reduce("reduce_max", s, 3))
        shift = _safe_max(o, m_new)
        alpha = o.emit("exp", o.emit("sub", m, shift))
        p = o.emit("exp", o.emit("sub", s, o.rows(shift, s)))
        l_new = o.emit("add", o.emit("mul", l, alpha), o.reduce("reduce_sum", p, 3))
        acc_new = o.emit("add", o.emit("mul", acc, o.rows(alpha, acc)), o.dot(p, vt, (3, 2)))
        return [m_new, l_new, acc_new]

    m, l, acc = _scan(b, [m0, l0, acc0], [q5] + steps.consts(), steps.xs(), steps.count, step)
    out = ops.emit("div", acc, ops.rows(l, acc))
    lse = ops.emit("add", m, ops.emit("log", l))
    if _empty_rows(spec):
        empty = ops.emit("eq", l, ops.lit(0.0, l))
        mean = ops.emit("div", ops.reduce("reduce_sum", _kv(ops, spec, v), 2), ops.lit(spec.s, l))
        out = ops.emit("select", ops.rows(empty, out), ops.broadcast(mean, spec.folded(spec.hv), (0, 1, 3)), out)
        lse = ops.emit("select", empty, ops.broadcast(ops.lit(_empty_lse(spec), lse), rows, ()), lse)
    out_var, lse_var = eqn.outvars
    result = _back(ops, spec, _unfolded(ops, out, spec), spec.dtype)
    lse = ops.reshape(lse, (spec.b, spec.n, spec.t))
    _rename(b, result, out_var)
    _rename(b, lse, lse_var)
    return b.eqns


def _rename(b: GraphBuilder, value: Any, var: Var) -> None:
    """Make `var` (an output of the replaced equation) the name of `value`."""
    last = b.eqns[-1] if b.eqns else None
    if last is not None and last.outvars == (value,):
        b.eqns[-1] = Eqn(last.primitive, last.inputs, last.params, (var,), last.source)
        return
    b.eqns.append(Eqn("reshape", (value,), params_tuple({"shape": var.type.shape}), (var,), b.source))


def _gather_tiles(ops: Ops, stacked: Any, spec: Spec) -> Any:
    """(count, B, K, tile, cols) tiles back as (B, K, S, cols)."""
    count, bb, heads, tile, cols = ops.shape(stacked)
    whole = ops.reshape(ops.transpose(stacked, (1, 2, 0, 3, 4)), (bb, heads, count * tile, cols))
    if count * tile == spec.s:
        return whole
    return ops.emit("slice", whole, start=(0, 0, 0, 0), limit=(bb, heads, spec.s, cols), strides=(1, 1, 1, 1))


def _expand_backward(eqn: Eqn) -> list[Eqn]:
    b = GraphBuilder(eqn.source)
    ops = b.ops
    spec, q, k, v, bias, mask, (out, lse, d_out, d_lse) = _split(eqn)
    bias_grad = eqn.param_dict["bias_grad"]
    q5 = _scaled_q(ops, spec, q)
    steps = _Steps(b, spec, k, v, bias, mask)
    d_out5 = _folded(ops, ops.convert(ops.to_bnth(d_out, spec.layout), spec.acc), spec, spec.hv)
    out5 = _folded(ops, ops.convert(ops.to_bnth(out, spec.layout), spec.acc), spec, spec.hv)
    rows = spec.folded(0)[:3]
    delta = ops.emit("sub", ops.reduce("reduce_sum", ops.emit("mul", d_out5, out5), 3), ops.reshape(d_lse, rows))
    lse5 = ops.reshape(lse, rows)
    dq0 = ops.broadcast(ops.scalar(0.0, spec.acc), spec.folded(spec.h), ())
    carries = [dq0]
    bias_shape = bias.type.shape if bias is not None else None
    bias_carried = bias_grad and not steps.bias.stacked
    if bias_carried:
        carries.append(ops.broadcast(ops.scalar(0.0, spec.acc), bias_shape, ()))
    consts = [q5, d_out5, lse5, delta] + steps.consts()
    if _empty_rows(spec):  # the forward's empty rows, told apart by their logsumexp
        consts.append(ops.emit("le", lse5, ops.lit(_empty_lse(spec) / 2, lse5)))

    def step(body: GraphBuilder, inputs: list[Var]) -> list[Any]:
        o = body.ops
        carry, rest = inputs[:len(carries)], inputs[len(carries):]
        (q5_, do5, lse_, delta_), rest = rest[:4], rest[4:]
        n_consts = len(steps.consts()) + _empty_rows(spec)
        kt, vt, start, bt, mt = steps.read(rest[:len(steps.consts())], rest[n_consts:])
        s, counted, valid = _tile_logits(o, spec, steps, q5_, kt, start, bt, mt)
        p = o.emit("exp", o.emit("sub", s, o.rows(lse_, s)))
        if _empty_rows(spec):
            uniform = o.broadcast(o.lit(1.0 / spec.s, p), o.shape(p), ())
            if valid is not None:
                uniform = o.emit("select", valid, uniform, o.lit(0.0, p))
            p = o.emit("select", o.rows(rest[n_consts - 1], p), uniform, p)
        dv = o.dot(p, do5, (2, 2))
        dp = o.dot(do5, vt, (3, 3))
        ds = o.emit("mul", p, o.emit("sub", dp, o.rows(delta_, dp)))
        if counted is not None:
            ds = o.emit("select", counted, ds, o.lit(0.0, ds))
        dq = o.emit("add", carry[0], o.dot(ds, kt, (3, 2)))
        dk = o.dot(ds, q5_, (2, 2))
        results = [dq] + ([] if not bias_grad else [None]) + [dk, dv]
        if bias_grad:
            d_bias = _summed_to(o, _unfolded(o, ds, spec), bias_shape[:3] + (steps.tile if steps.bias.stacked else 1,))
            if bias_carried:
                results[1] = o.emit("add", carry[1], d_bias)
            else:
                results.pop(1)
                results.append(d_bias)
        return results

    outs = list(_scan(b, carries, consts, steps.xs(), steps.count, step))
    dq = outs.pop(0)
    d_bias = outs.pop(0) if bias_carried else None
    dk_tiles, dv_tiles = outs[:2]
    if bias_grad and not bias_carried:
        stacked = outs[2]  # (count, B', N', T', tile)
        whole = ops.transpose(stacked, (1, 2, 3, 0, 4))
        sh = ops.shape(whole)
        d_bias = ops.reshape(whole, sh[:3] + (sh[3] * sh[4],))
        if sh[3] * sh[4] != spec.s:
            d_bias = ops.emit("slice", d_bias, start=(0, 0, 0, 0), limit=sh[:3] + (spec.s,), strides=(1, 1, 1, 1))
    dq = _unfolded(ops, ops.emit("mul", dq, ops.lit(spec.scale, dq)), spec)
    results = [_back(ops, spec, dq, spec.dtype), _back(ops, spec, _gather_tiles(ops, dk_tiles, spec), spec.dtype),
               _back(ops, spec, _gather_tiles(ops, dv_tiles, spec), spec.dtype)]
    if bias_grad:
        results.append(ops.convert(d_bias, spec.dtype))
    for value, var in zip(results, eqn.outvars):
        _rename(b, value, var)
    return b.eqns


def _summed_to(ops: Ops, x: Any, shape: tuple[int, ...]) -> Any:
    """x (rank 4) summed over the axes where `shape` has 1 and x does not, kept as 1s."""
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, ops.shape(x))) if n == 1 and m != 1)
    if not axes:
        return x
    return ops.reshape(ops.emit("reduce_sum", x, axes=axes), shape)


EXPANSIONS: dict[str, Callable[[Eqn], list[Eqn]]] = {"attention": _expand_forward,
                                                     "attention_bwd": _expand_backward}


def expand_attention(graph: Graph) -> tuple[Graph, tuple[str, ...]]:
    """`graph` with each attention equation replaced by its tiled scan (the same graph when it
    has none), and a line per equation saying how it is tiled."""
    if not any(e.primitive in EXPANSIONS for e in graph.eqns):
        return graph, ()
    eqns: list[Eqn] = []
    notes = []
    for eqn in graph.eqns:
        if eqn.primitive in EXPANSIONS:
            spec = Spec.of(*(a.type for a in eqn.inputs[:3]), eqn.param_dict)
            tile = tile_size(spec)
            notes.append(f"{eqn.primitive} (B={spec.b} N={spec.n} T={spec.t} S={spec.s} H={spec.h}) tiled: one scan "
                         f"of {-(-spec.s // tile)} steps over {tile} keys each, no {spec.t} x {spec.s} buffer")
            eqns.extend(EXPANSIONS[eqn.primitive](eqn))
        else:
            eqns.append(eqn)
    return Graph(graph.constvars, graph.invars, tuple(eqns), graph.outvars), tuple(notes)


@dataclass(frozen=True)
class Tiled:
    """A simplified graph after attention is recognised and tiled: what fusion starts from,
    and the lines the "fusion" stage shows about it."""

    graph: Graph
    notes: tuple[str, ...]

    def fused(self) -> Fusion:
        fusion = fuse(self.graph)
        fusion.notes.extend(self.notes)
        return fusion


def tile_attention(graph: Graph) -> Tiled:
    """The "attention" step between the graph passes and fusion: the plain attention a
    program writes becomes `attention` equations (glue.scheduler.passes.attention), and every
    attention equation its tiled scan (simplified again, since tiling adds layout work)."""
    recognised, found = recognize_attention(graph)
    expanded, tiled = expand_attention(recognised)
    if expanded is not recognised:
        expanded = optimize(expanded)
    return Tiled(expanded, found + tiled)
