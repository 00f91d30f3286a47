"""How `attention` and `attention_bwd` run: tiled, as scans whose body handles one tile of
queries against one tile of keys, so that no buffer of T x S scores is ever made.

`expand_attention(graph)` replaces every attention equation, before fusion, by:
- forward: one scan per query tile over the key tiles it reads (causal: none above the
  diagonal; the diagonal tile is masked), FlashAttention's online softmax with the running
  row max, row sum and output as carries; the tiles' outputs and row logsumexps concatenated;
- backward: P recomputed from the saved logsumexp in two passes, a scan per query tile over
  its key tiles (dq, and the bias's gradient) and a scan per key tile over the query tiles
  that read it (dk, dv), both skipping the causal tiles above the diagonal.
q is folded to (B, K, G*rows, H), so a group of query heads shares its kv head's tiles; k and
v are stacked tile by tile once, and each step gathers its tile (a scan over the first n tiles
copies none). Both backends run the scans as the call kernels they already have, each body
compiled once; `tile_attention` is the scheduler step that recognises hand-written attention
and then tiles every attention equation.

The math is written once against `Ops`, over any emitter (`GraphBuilder` here; the frontend's
`emit` for the derivative rules, which use `unfused_attention` and `unfused_attention_bwd`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from glue.ir import Eqn, Graph, Literal, TensorType, Var, infer_types, params_tuple, primitive
from glue.ir import dtypes as dt
from glue.ir.primitives import attention_accumulator, attention_dims
from glue.ir.printer import format_param
from glue.scheduler.fusion import Fusion, fuse
from glue.scheduler.passes import optimize
from glue.scheduler.passes.attention import recognize_attention
from glue.settings import config

# A step's scores over every (B, N) hold at most this many elements (1 MiB in float32: the tile,
# its exponentials and the running output stay in the CPU's L2), but a tile has at least
# MIN_TILE rows: each tile is a step of the scans and a piece of the outputs' concatenation,
# which every kernel reading it tests piece by piece. The GPT-2-width step (B=8, 12 heads,
# T=512) had 16 tiles of 32 rows: its qkv bias gradient read 96 pieces (1.3 s of LLVM), the
# 2-layer step compiled in 5.0 s on the 2-core cpu and ran 11.7-12.0 s a step; at 64 rows,
# 3.8 s and 9.2-10.4 s. Nor is a sequence cut into more than MAX_TILES tiles a side (below
# MAX_TILE rows): the scans' steps grow with the square of the tiles, and at 128 rows (4 tiles)
# the 4-layer GPT-width step compiled in 2.5-3.4 s against 3.2-5.6 s at 64, with the same step
# times (8.3-10.9 s against 9.8-11.4, alternating runs on the 2-core cpu).
TILE_ELEMENTS = 1 << 18
MIN_TILE, MAX_TILE = 64, 256
MAX_TILES = 4


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

    def dot(self, a: Any, b: Any, contract: tuple[int, int], precision: str) -> Any:
        """A product batched over the two leading axes, contracting axis `contract[0]` of a
        with axis `contract[1]` of b (both rank 4), at the attention's `precision`."""
        return self.emit("dot_general", a, b, dimension_numbers=(((contract[0],), (contract[1],)), ((0, 1), (0, 1))),
                         precision=precision, preferred_element_type=None)

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
    precision: str  # of the products (an equation that names none is exact: "highest")

    @staticmethod
    def of(q: TensorType, k: TensorType, v: TensorType, params: dict[str, Any]) -> "Spec":
        dims = attention_dims(q, k, v, params["layout"])
        return Spec(*dims, params["scale"], params["causal"], params["layout"], params["masked_value"],
                    params["has_bias"], params["has_mask"], q.dtype, params.get("precision") or "highest")

    @property
    def group(self) -> int:
        return self.n // self.kv

    @property
    def acc(self) -> dt.DType:
        return attention_accumulator(self.dtype)

    @property
    def rows(self) -> tuple[int, ...]:
        """(B, K, G*T): one row per query of each head, grouped under its kv head."""
        return self.b, self.kv, self.group * self.t


def _folded(ops: Ops, x: Any, spec: Spec, rows: int) -> Any:
    """A (B, N, rows, cols) value as (B, K, G*rows, cols)."""
    shape = ops.shape(x)
    return ops.reshape(x, (spec.b, spec.kv, spec.group * rows, shape[-1]))


def _unfolded(ops: Ops, x: Any, spec: Spec, rows: int) -> Any:
    return ops.reshape(x, (spec.b, spec.n, rows, ops.shape(x)[-1]))


def _keep(ops: Ops, spec: Spec, mask: Any | None, rows: int, cols: int, q_start: Any | None = None,
          k_start: Any | None = None) -> tuple[Any | None, Any | None]:
    """Which logits of a (B, K, G*rows, cols) block of queries from `q_start` and keys from
    `k_start` on (None: 0) count: (keep, valid), keep for the causal rule and the mask, valid
    for keys inside S (None: all)."""
    keep = valid = None
    if spec.causal or k_start is not None:
        def index(axis: int, start: Any | None) -> Any:
            i = ops.iota((rows, cols), axis)
            return i if start is None else ops.emit("add", i, ops.broadcast(start, (rows, cols), ()))
        query, key = index(0, q_start), index(1, k_start)
        if k_start is not None and spec.s % cols:
            valid = ops.emit("lt", key, ops.lit(spec.s, key))
        if spec.causal:
            keep = ops.emit("ge", query, key)
    full = (spec.b, spec.n, rows, cols)
    if mask is not None:
        mask = ops.broadcast(mask, full)
        keep = mask if keep is None else ops.emit("and", mask, ops.broadcast(keep, full, (2, 3)))
    elif keep is not None:
        keep = ops.broadcast(keep, full, (2, 3))
    if valid is not None:
        valid = ops.broadcast(valid, full, (2, 3))
    fold = lambda x: None if x is None else _folded(ops, x, spec, rows)  # noqa: E731
    return fold(keep), fold(valid)


def _logits(ops: Ops, spec: Spec, q5: Any, k: Any, bias: Any | None, keep: Any | None, fill: float,
            rows: int) -> Any:
    """Scores (B, K, G*rows, cols) of the scaled, folded q against keys k (B, K, cols, H),
    `fill` where `keep` is false."""
    s = ops.dot(q5, k, (3, 3), spec.precision)
    cols = ops.shape(k)[2]
    if bias is not None:
        full = ops.broadcast(ops.convert(bias, spec.acc), (spec.b, spec.n, rows, cols))
        s = ops.emit("add", s, _folded(ops, full, spec, rows))
    return s if keep is None else ops.emit("select", keep, s, ops.lit(fill, s))


def _scaled_q(ops: Ops, spec: Spec, q: Any) -> Any:
    """q * scale as (B, N, T, H), in the accumulation type."""
    q = ops.convert(ops.to_bnth(q, spec.layout), spec.acc)
    return ops.emit("mul", q, ops.lit(spec.scale, q))


def _kv(ops: Ops, spec: Spec, x: Any) -> Any:
    return ops.convert(ops.to_bnth(x, spec.layout), spec.acc)


def _back(ops: Ops, spec: Spec, x: Any, dtype: dt.DType) -> Any:
    """A (B, heads, T, cols) result in the equation's layout and `dtype`."""
    return ops.convert(ops.to_bnth(x, spec.layout), dtype)


def unfused_attention(ops: Ops, spec: Spec, q: Any, k: Any, v: Any, bias: Any | None,
                      mask: Any | None) -> tuple[Any, Any]:
    """(out, lse) computed the plain way, with the whole T x S scores (the JVP rule's form)."""
    q5 = _folded(ops, _scaled_q(ops, spec, q), spec, spec.t)
    keep, _ = _keep(ops, spec, mask, spec.t, spec.s)
    s = _logits(ops, spec, q5, _kv(ops, spec, k), bias, keep, spec.masked_value, spec.t)
    m = ops.reduce("reduce_max", s, 3)
    e = ops.emit("exp", ops.emit("sub", s, ops.rows(m, s)))
    total = ops.reduce("reduce_sum", e, 3)
    p = ops.emit("div", e, ops.rows(total, e))
    out = ops.dot(p, _kv(ops, spec, v), (3, 2), spec.precision)
    lse = ops.emit("add", m, ops.emit("log", total))
    return _back(ops, spec, _unfolded(ops, out, spec, spec.t), spec.dtype), ops.reshape(lse, (spec.b, spec.n, spec.t))


def unfused_attention_bwd(ops: Ops, spec: Spec, q: Any, k: Any, v: Any, bias: Any | None, mask: Any | None,
                          out: Any, d_out: Any, d_lse: Any, bias_grad: bool) -> list[Any]:
    """attention_bwd's results computed the plain way (the derivative rules' form): P from
    the logits, as the reference has it, so a fully masked row needs no special case."""
    q5 = _folded(ops, _scaled_q(ops, spec, q), spec, spec.t)
    k5, v5 = _kv(ops, spec, k), _kv(ops, spec, v)
    keep, _ = _keep(ops, spec, mask, spec.t, spec.s)
    s = _logits(ops, spec, q5, k5, bias, keep, spec.masked_value, spec.t)
    e = ops.emit("exp", ops.emit("sub", s, ops.rows(ops.reduce("reduce_max", s, 3), s)))
    p = ops.emit("div", e, ops.rows(ops.reduce("reduce_sum", e, 3), e))
    wide = lambda x: _folded(ops, ops.convert(ops.to_bnth(x, spec.layout), spec.acc), spec, spec.t)  # noqa: E731
    do5 = wide(d_out)
    delta = ops.emit("sub", ops.reduce("reduce_sum", ops.emit("mul", do5, wide(out)), 3), ops.reshape(d_lse, spec.rows))
    dp = ops.dot(do5, v5, (3, 3), spec.precision)
    ds = ops.emit("mul", p, ops.emit("sub", dp, ops.rows(delta, dp)))
    if keep is not None:
        ds = ops.emit("select", keep, ds, ops.lit(0.0, ds))
    dq = _unfolded(ops, ops.emit("mul", ops.dot(ds, k5, (3, 2), spec.precision), ops.lit(spec.scale, ds)), spec, spec.t)
    grads = [_back(ops, spec, dq, spec.dtype), _back(ops, spec, ops.dot(ds, q5, (2, 2), spec.precision), spec.dtype),
             _back(ops, spec, ops.dot(p, do5, (2, 2), spec.precision), spec.dtype)]
    if bias_grad:
        grads.append(ops.convert(_summed_to(ops, _unfolded(ops, ds, spec, spec.t), ops.shape(bias)), spec.dtype))
    return grads


# --- building graphs ---------------------------------------------------------------------

class GraphBuilder:
    """Equations appended one by one, each typed by its primitive's rule."""

    def __init__(self, source: str | None):
        self.source = source
        self.eqns: list[Eqn] = []
        self.ops = Ops(self.emit, lambda a: a.type, _literal)

    def emit(self, name: str, *inputs: Any, **params: Any) -> Any:
        types = infer_types(name, tuple(a.type for a in inputs), params, self.source)
        outs = tuple(Var(t) for t in types)
        self.eqns.append(Eqn(name, tuple(inputs), params_tuple(params), outs, self.source))
        return outs if primitive(name).multiple_results else outs[0]

    def name(self, value: Any, var: Var) -> None:
        """Make `var` (an output of the equation being replaced) the name of `value`."""
        last = self.eqns[-1]
        if last.outvars == (value,):  # the value was just made: it takes the name
            self.eqns[-1] = Eqn(last.primitive, last.inputs, last.params, (var,), last.source)
        else:  # a copy the graph passes fold away
            self.eqns.append(Eqn("reshape", (value,), params_tuple({"shape": var.type.shape}), (var,), self.source))


def _literal(value: Any, dtype: dt.DType) -> Literal:
    return Literal({"bool": bool, "int": int, "float": float}[dtype.kind](value), TensorType((), dtype))


def _power_of_two_below(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def forward_tiles(spec: Spec) -> tuple[int, int]:
    """(queries, keys) per forward step: square power-of-two tiles whose scores over every
    (B, N) fit TILE_ELEMENTS, but at least MIN_TILE rows and at most MAX_TILES tiles a side,
    within MAX_TILE, no larger than T and S need."""
    side = _power_of_two_below(math.isqrt(max(TILE_ELEMENTS // (spec.b * spec.n), 1)))
    few = _power_of_two_at_least(-(-max(spec.t, spec.s) // MAX_TILES))
    side = min(max(side, MIN_TILE, few), MAX_TILE)
    return min(side, _round8(spec.t)), min(side, _round8(spec.s))


def _stack(ops: Ops, x: Any, axis: int, tile: int, count: int, pad_value: Any) -> Any:
    """x cut along `axis` into `count` tiles of `tile` (padded with `pad_value`), the tile index
    first: (count, ..., tile, ...)."""
    shape = ops.shape(x)
    x = _padded(ops, x, axis, tile * count, pad_value)
    split = ops.reshape(x, shape[:axis] + (count, tile) + shape[axis + 1:])
    return ops.transpose(split, (axis,) + tuple(i for i in range(len(shape) + 1) if i != axis))


def _padded(ops: Ops, x: Any, axis: int, size: int, value: Any) -> Any:
    shape = ops.shape(x)
    if shape[axis] == size:
        return x
    high = tuple(size - shape[axis] if i == axis else 0 for i in range(len(shape)))
    return ops.emit("pad", x, low=(0,) * len(shape), high=high, value=value)


def _sliced(ops: Ops, x: Any, axis: int, start: int, stop: int) -> Any:
    shape = ops.shape(x)
    if (start, stop) == (0, shape[axis]):
        return x
    return ops.emit("slice", x, start=tuple(start if i == axis else 0 for i in range(len(shape))),
                    limit=tuple(stop if i == axis else n for i, n in enumerate(shape)), strides=(1,) * len(shape))


class _Inputs:
    """What a scan body reads besides its carries, by name: values every step sees (consts),
    and stacks of tiles (count, ...) of which step j reads tile `index[j]`. The stacks are
    consts too, each step gathering its tile, so that a scan over the first n tiles (a causal
    query tile) needs no copy of them: the scan's only xs are the tile indices."""

    def __init__(self, tiles: int, first: int = 0) -> None:
        self.consts: dict[str, Any] = {}
        self.stacks: dict[str, Any] = {}
        self.tiles, self.first = tiles, first

    def add(self, name: str, value: Any, stacked: bool = False) -> None:
        (self.stacks if stacked else self.consts)[name] = value


def _scan(b: GraphBuilder, carry: Sequence[Any], inputs: _Inputs,
          step: Callable[[Ops, list[Var], dict[str, Any]], list[Any]]) -> Sequence[Var]:
    """A scan over tiles first .. first + tiles - 1 of `step(ops, carries, inputs by name)` ->
    new carries and one slice per y; the inputs also hold the tile's number as "index"."""
    ops = b.ops
    carry_in = [Var(a.type) for a in carry]
    named = {**inputs.consts, **inputs.stacks}
    const_in = {name: Var(a.type) for name, a in named.items()}
    index = Var(TensorType((), dt.int32))
    body = GraphBuilder(b.source)
    got = {name: body.emit("gather", const_in[name], index, axis=0, batch_dims=0) if name in inputs.stacks
           else var for name, var in const_in.items()}
    got["index"] = index
    outs = step(body.ops, carry_in, got)
    graph = Graph((), tuple(carry_in) + tuple(const_in.values()) + (index,), tuple(body.eqns), tuple(outs))
    indices = ops.iota((inputs.tiles,), 0)
    if inputs.first:
        indices = ops.emit("add", indices, ops.scalar(inputs.first, dt.int32))
    return b.emit("scan", *carry, *named.values(), indices, body=graph, length=inputs.tiles, reverse=False,
                  num_carry=len(carry), num_consts=len(named))


def _split(eqn: Eqn) -> tuple[Spec, Any, Any, Any, Any | None, Any | None, tuple]:
    params = eqn.param_dict
    q, k, v = eqn.inputs[:3]
    spec = Spec.of(q.type, k.type, v.type, params)
    extras = eqn.inputs[3:3 + spec.has_bias + spec.has_mask]
    bias = extras[0] if spec.has_bias else None
    mask = extras[spec.has_bias] if spec.has_mask else None
    return spec, q, k, v, bias, mask, eqn.inputs[3 + len(extras):]


@dataclass(frozen=True)
class _Keys:
    """k and v in the accumulation type stacked tile by tile (count, B, K, tile, H)."""

    k: Any
    v: Any
    tile: int
    count: int

    @staticmethod
    def of(ops: Ops, spec: Spec, k: Any, v: Any, tile: int) -> "_Keys":
        count = -(-spec.s // tile)
        return _Keys(_stack(ops, _kv(ops, spec, k), 2, tile, count, 0.0),
                     _stack(ops, _kv(ops, spec, v), 2, tile, count, 0.0), tile, count)

    def add_to(self, ops: Ops, inputs: _Inputs, bias: Any | None, mask: Any | None) -> None:
        """The tiles, and a bias and mask cut along the keys as they are."""
        inputs.add("k", self.k, True)
        inputs.add("v", self.v, True)
        _add_bias_mask(ops, inputs, bias, mask, 3, self.tile, self.count)


def _add_bias_mask(ops: Ops, inputs: _Inputs, bias: Any | None, mask: Any | None, axis: int, tile: int,
                   count: int) -> None:
    """A bias and mask (B|1, N|1, T|1, S|1) for a scan along `axis` (2: queries, 3: keys):
    stacked tiles where they vary along it, else whole."""
    for name, x, pad in (("bias", bias, 0.0), ("mask", mask, False)):
        if x is not None:
            varies = ops.shape(x)[axis] != 1
            inputs.add(name, _stack(ops, x, axis, tile, count, pad) if varies else x, varies)


def _tile_logits(ops: Ops, spec: Spec, got: dict[str, Any], rows: int, cols: int, q_start: Any | None,
                 k_start: Any) -> tuple[Any, Any, Any]:
    """One step's logits (B, K, G*rows, cols), -inf where they do not count (masked, or
    padding past S), which count and which are keys inside S (None: all). Masked logits
    take masked_value in the definition: that is -inf too wherever a row keeps anything (exp
    underflows to 0 either way), and rows that keep nothing are the `_empty_rows` case."""
    keep, valid = _keep(ops, spec, got.get("mask"), rows, cols, q_start, k_start)
    counted = keep if valid is None else valid if keep is None else ops.emit("and", keep, valid)
    return _logits(ops, spec, got["q"], got["k"], got.get("bias"), counted, -math.inf, rows), counted, valid


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


def _whole_tiles(ops: Ops, x: Any | None, axis: int, size: int) -> Any | None:
    """A bias or mask padded along `axis` to `size` (when it varies along it; a mask with
    False, a bias with 0)."""
    if x is None or ops.shape(x)[axis] == 1:
        return x
    return _padded(ops, x, axis, size, False if x.type.dtype == dt.bool_ else 0.0)


def _cut(ops: Ops, x: Any | None, axis: int, start: int, stop: int) -> Any | None:
    """A bias or mask cut to start..stop along `axis` (as it is when it does not vary along it)."""
    if x is None or ops.shape(x)[axis] == 1:
        return x
    return _sliced(ops, x, axis, start, stop)


def _forward_step(spec: Spec, rows: int, cols: int) -> Callable[[Ops, list[Var], dict[str, Var]], list[Any]]:
    """The online softmax over one key tile: carries the running row max, row sum and output."""
    def step(o: Ops, carry: list[Var], got: dict[str, Any]) -> list[Any]:
        m, l, acc = carry
        s, _, _ = _tile_logits(o, spec, got, rows, cols, got.get("q_start"), _first(o, got, cols))
        m_new = o.emit("max", m, o.reduce("reduce_max", s, 3))
        shift = _safe_max(o, m_new)
        alpha = o.emit("exp", o.emit("sub", m, shift))
        p = o.emit("exp", o.emit("sub", s, o.rows(shift, s)))
        l_new = o.emit("add", o.emit("mul", l, alpha), o.reduce("reduce_sum", p, 3))
        acc_new = o.emit("add", o.emit("mul", acc, o.rows(alpha, acc)), o.dot(p, got["v"], (3, 2), spec.precision))
        return [m_new, l_new, acc_new]
    return step


def _first(ops: Ops, got: dict[str, Any], tile: int) -> Any:
    """The first position of the step's tile."""
    return ops.emit("mul", got["index"], ops.scalar(tile, dt.int32))


def _key_tiles_needed(spec: Spec, keys: _Keys, stop: int) -> int:
    """How many key tiles queries before `stop` read: all, or (causal) those up to the last
    query's own position."""
    return keys.count if not spec.causal else min(keys.count, -(-stop // keys.tile))


def _expand_forward(eqn: Eqn) -> list[Eqn]:
    """One scan per tile of queries over the key tiles it needs (causal: tiles above the
    diagonal are never visited, the diagonal's masked), the tiles' outputs concatenated."""
    b = GraphBuilder(eqn.source)
    ops = b.ops
    spec, q, k, v, bias, mask, _ = _split(eqn)
    rows, cols = forward_tiles(spec)
    keys = _Keys.of(ops, spec, k, v, cols)
    n_q = -(-spec.t // rows)
    grouped = (spec.b, spec.kv, spec.group)
    q_all = _padded(ops, ops.reshape(_scaled_q(ops, spec, q), grouped + (spec.t, spec.h)), 3, n_q * rows, 0.0)
    bias_all, mask_all = _whole_tiles(ops, bias, 2, n_q * rows), _whole_tiles(ops, mask, 2, n_q * rows)
    block = spec.b, spec.kv, spec.group * rows
    mean_v = ops.emit("div", ops.reduce("reduce_sum", _kv(ops, spec, v), 2), ops.scalar(spec.s, spec.acc)) \
        if _empty_rows(spec) else None
    outs, lses = [], []
    for i in range(n_q):
        start, stop = i * rows, (i + 1) * rows
        inputs = _Inputs(_key_tiles_needed(spec, keys, min(stop, spec.t)))
        inputs.add("q", ops.reshape(_sliced(ops, q_all, 3, start, stop), block + (spec.h,)))
        if spec.causal:
            inputs.add("q_start", ops.scalar(start, dt.int32))
        keys.add_to(ops, inputs, _cut(ops, bias_all, 2, start, stop), _cut(ops, mask_all, 2, start, stop))
        init = [ops.broadcast(ops.scalar(value, spec.acc), block, ()) for value in (-math.inf, 0.0)]
        init.append(ops.broadcast(ops.scalar(0.0, spec.acc), block + (spec.hv,), ()))
        m, l, acc = _scan(b, init, inputs, _forward_step(spec, rows, cols))
        out = ops.emit("div", acc, ops.rows(l, acc))
        lse = ops.emit("add", m, ops.emit("log", l))
        if mean_v is not None:
            empty = ops.emit("eq", l, ops.lit(0.0, l))
            out = ops.emit("select", ops.rows(empty, out), ops.broadcast(mean_v, block + (spec.hv,), (0, 1, 3)), out)
            lse = ops.emit("select", empty, ops.broadcast(ops.lit(_empty_lse(spec), lse), block, ()), lse)
        outs.append(ops.reshape(out, grouped + (rows, spec.hv)))
        lses.append(ops.reshape(lse, grouped + (rows,)))
    out = _sliced(ops, _joined(ops, outs, 3), 3, 0, spec.t)
    lse = _sliced(ops, _joined(ops, lses, 3), 3, 0, spec.t)
    out_var, lse_var = eqn.outvars
    b.name(ops.reshape(lse, (spec.b, spec.n, spec.t)), lse_var)
    b.name(_back(ops, spec, ops.reshape(out, (spec.b, spec.n, spec.t, spec.hv)), spec.dtype), out_var)
    return b.eqns


def _joined(ops: Ops, parts: list[Any], axis: int) -> Any:
    return parts[0] if len(parts) == 1 else ops.emit("concatenate", *parts, dimension=axis)


def _summed_to(ops: Ops, x: Any, shape: tuple[int, ...]) -> Any:
    """x (rank 4) summed over the axes where `shape` has 1 and x does not, kept as 1s."""
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, ops.shape(x))) if n == 1 and m != 1)
    if not axes:
        return x
    return ops.reshape(ops.emit("reduce_sum", x, axes=axes), shape)


def _probabilities(o: Ops, spec: Spec, got: dict[str, Any], rows: int, cols: int, q_start: Any | None,
                   k_start: Any) -> tuple[Any, Any]:
    """A backward step's P, recomputed from the saved logsumexp (a row the forward found
    empty averages v: P is 1/S on every key), and ds = P * (dP - delta), 0 where not counted."""
    s, counted, valid = _tile_logits(o, spec, got, rows, cols, q_start, k_start)
    p = o.emit("exp", o.emit("sub", s, o.rows(got["lse"], s)))
    if "empty" in got:
        uniform = o.broadcast(o.lit(1.0 / spec.s, p), o.shape(p), ())
        if valid is not None:
            uniform = o.emit("select", valid, uniform, o.lit(0.0, p))
        p = o.emit("select", o.rows(got["empty"], p), uniform, p)
    dp = o.dot(got["d_out"], got["v"], (3, 3), spec.precision)
    ds = o.emit("mul", p, o.emit("sub", dp, o.rows(got["delta"], dp)))
    return p, ds if counted is None else o.emit("select", counted, ds, o.lit(0.0, ds))


def _dq_step(spec: Spec, rows: int, cols: int, bias_shape: tuple[int, ...] | None):
    """dq of a query tile over one key tile (a carry), and the bias's gradient: a y per key
    tile where the bias varies along the keys, else a carry."""
    def step(o: Ops, carry: list[Var], got: dict[str, Any]) -> list[Any]:
        _, ds = _probabilities(o, spec, got, rows, cols, got.get("q_start"), _first(o, got, cols))
        new_carry, ys = [o.emit("add", carry[0], o.dot(ds, got["k"], (3, 2), spec.precision))], []
        if bias_shape is not None:  # summed over what the bias broadcasts along
            along_keys = bias_shape[3] != 1
            d_bias = _summed_to(o, _unfolded(o, ds, spec, rows),
                                bias_shape[:2] + (rows if bias_shape[2] != 1 else 1, cols if along_keys else 1))
            if along_keys:
                ys.append(d_bias)
            else:
                new_carry.append(o.emit("add", carry[1], d_bias))
        return new_carry + ys
    return step


def _dkv_step(spec: Spec, rows: int, cols: int):
    """dk and dv of a key tile over one query tile (carries)."""
    def step(o: Ops, carry: list[Var], got: dict[str, Any]) -> list[Any]:
        p, ds = _probabilities(o, spec, got, rows, cols, _first(o, got, rows), got.get("k_start"))
        return [o.emit("add", carry[0], o.dot(ds, got["q"], (2, 2), spec.precision)),
                o.emit("add", carry[1], o.dot(p, got["d_out"], (2, 2), spec.precision))]
    return step


def _query_tiles(ops: Ops, spec: Spec, x: Any, rows: int, n_q: int) -> Any:
    """A (B, N, T, cols) value as query tiles (n_q, B, K, G*rows, cols), zero past T."""
    cols = ops.shape(x)[-1]
    grouped = ops.reshape(x, (spec.b, spec.kv, spec.group, spec.t, cols))
    split = ops.reshape(_padded(ops, grouped, 3, n_q * rows, 0.0),
                        (spec.b, spec.kv, spec.group, n_q, rows, cols))
    return ops.reshape(ops.transpose(split, (3, 0, 1, 2, 4, 5)), (n_q, spec.b, spec.kv, spec.group * rows, cols))


def _expand_backward(eqn: Eqn) -> list[Eqn]:
    """Two passes over the tiles, each recomputing P from the saved logsumexp: per query tile
    a scan over the key tiles it reads gives dq (and the bias's gradient); per key tile a scan
    over the query tiles that read it gives dk and dv. Causal tiles above the diagonal are
    skipped by both."""
    b = GraphBuilder(eqn.source)
    ops = b.ops
    spec, q, k, v, bias, mask, (out, lse, d_out, d_lse) = _split(eqn)
    bias_grad = eqn.param_dict["bias_grad"]
    rows, cols = forward_tiles(spec)
    keys = _Keys.of(ops, spec, k, v, cols)
    n_q = -(-spec.t // rows)
    wide = lambda x: ops.convert(ops.to_bnth(x, spec.layout), spec.acc)  # noqa: E731
    column = lambda x: ops.reshape(x, (spec.b, spec.n, spec.t, 1))  # noqa: E731
    d_out_ = wide(d_out)
    delta = ops.emit("sub", ops.reduce("reduce_sum", ops.emit("mul", d_out_, wide(out)), 3), d_lse)
    per_row = {"q": _scaled_q(ops, spec, q), "d_out": d_out_, "lse": column(lse), "delta": column(delta)}
    if _empty_rows(spec):  # the forward's empty rows, told apart by their logsumexp
        per_row["empty"] = column(ops.emit("le", lse, ops.lit(_empty_lse(spec) / 2, lse)))
    block = spec.b, spec.kv, spec.group * rows
    tiles = {name: _query_tiles(ops, spec, x, rows, n_q) for name, x in per_row.items()}
    for name in ("lse", "delta", "empty"):  # one value per row: (n_q, B, K, G*rows)
        if name in tiles:
            tiles[name] = ops.reshape(tiles[name], (n_q,) + block)
    bias_all, mask_all = _whole_tiles(ops, bias, 2, n_q * rows), _whole_tiles(ops, mask, 2, n_q * rows)
    bias_shape = bias.type.shape if bias_grad else None
    dqs, d_biases = [], []
    for i in range(n_q):
        start, stop = i * rows, (i + 1) * rows
        inputs = _Inputs(_key_tiles_needed(spec, keys, min(stop, spec.t)))
        for name, stacked in tiles.items():
            inputs.add(name, ops.reshape(_sliced(ops, stacked, 0, i, i + 1), ops.shape(stacked)[1:]))
        if spec.causal:
            inputs.add("q_start", ops.scalar(start, dt.int32))
        keys.add_to(ops, inputs, _cut(ops, bias_all, 2, start, stop), _cut(ops, mask_all, 2, start, stop))
        carries = [ops.broadcast(ops.scalar(0.0, spec.acc), block + (spec.h,), ())]
        along_keys = bias_grad and bias_shape[3] != 1
        if bias_grad and not along_keys:
            carries.append(ops.broadcast(ops.scalar(0.0, spec.acc),
                                         bias_shape[:2] + (rows if bias_shape[2] != 1 else 1, 1), ()))
        outs = list(_scan(b, carries, inputs, _dq_step(spec, rows, cols, bias_shape)))
        dqs.append(ops.reshape(outs[0], (spec.b, spec.kv, spec.group, rows, spec.h)))
        if bias_grad:
            d_bias = outs[1]
            if along_keys:  # (count, B', N', rows', cols) -> (B', N', rows', S), zero past the diagonal
                count = inputs.tiles
                whole = ops.transpose(d_bias, (1, 2, 3, 0, 4))
                d_bias = ops.reshape(whole, ops.shape(whole)[:3] + (count * cols,))
                d_bias = _sliced(ops, _padded(ops, d_bias, 3, keys.count * cols, 0.0), 3, 0, spec.s)
            d_biases.append(d_bias)
    dq = _sliced(ops, _joined(ops, dqs, 3), 3, 0, spec.t)
    dq = ops.reshape(ops.emit("mul", dq, ops.lit(spec.scale, dq)), (spec.b, spec.n, spec.t, spec.h))
    dks, dvs = [], []
    for j in range(keys.count):
        first = (j * cols) // rows if spec.causal else 0
        inputs = _Inputs(n_q - first, first)
        for name, stacked in tiles.items():
            inputs.add(name, stacked, True)
        for name in ("k", "v"):
            stacked = getattr(keys, name)
            inputs.add(name, ops.reshape(_sliced(ops, stacked, 0, j, j + 1), ops.shape(stacked)[1:]))
        inputs.add("k_start", ops.scalar(j * cols, dt.int32))
        columns = [_cut(ops, _whole_tiles(ops, x, 3, keys.count * cols), 3, j * cols, (j + 1) * cols) for x in (bias, mask)]
        _add_bias_mask(ops, inputs, *columns, 2, rows, n_q)
        zeros = [ops.broadcast(ops.scalar(0.0, spec.acc), (spec.b, spec.kv, cols, width), ())
                 for width in (spec.h, spec.hv)]
        dk, dv = _scan(b, zeros, inputs, _dkv_step(spec, rows, cols))
        dks.append(dk)
        dvs.append(dv)
    results = [_back(ops, spec, dq, spec.dtype)] + [
        _back(ops, spec, _sliced(ops, _joined(ops, parts, 2), 2, 0, spec.s), spec.dtype) for parts in (dks, dvs)]
    if bias_grad:
        d_bias = _joined(ops, d_biases, 2) if bias_shape[2] != 1 else _summed(ops, d_biases)
        results.append(ops.convert(_sliced(ops, d_bias, 2, 0, bias_shape[2]), spec.dtype))
    for value, var in zip(results, eqn.outvars):
        b.name(value, var)
    return b.eqns


def _summed(ops: Ops, parts: list[Any]) -> Any:
    total = parts[0]
    for part in parts[1:]:
        total = ops.emit("add", total, part)
    return total


EXPANSIONS: dict[str, Callable[[Eqn], list[Eqn]]] = {"attention": _expand_forward,
                                                     "attention_bwd": _expand_backward}


def _describe(eqn: Eqn) -> str:
    spec = Spec.of(*(a.type for a in eqn.inputs[:3]), eqn.param_dict)
    rows, cols = forward_tiles(spec)
    n_q, n_k = -(-spec.t // rows), -(-spec.s // cols)
    steps = sum(min(n_k, -(-min((i + 1) * rows, spec.t) // cols)) if spec.causal else n_k for i in range(n_q))
    skipped = " (causal: those above the diagonal skipped)" if spec.causal else ""
    passes = "a scan per query tile" if eqn.primitive == "attention" else \
        "a scan per query tile (dq) and one per key tile (dk, dv)"
    return (f"{eqn.primitive} (B={spec.b} N={spec.n} T={spec.t} S={spec.s} H={spec.h}) tiled {rows} x {cols}: "
            f"{passes}, {steps} of {n_q * n_k} tile pairs{skipped}, no {spec.t} x {spec.s} buffer")


def _expand_unfused(eqn: Eqn) -> list[Eqn]:
    """The plain math, the T x S scores in memory (`unfused_attention`, `unfused_attention_bwd`)."""
    b = GraphBuilder(eqn.source)
    spec, q, k, v, bias, mask, rest = _split(eqn)
    if eqn.primitive == "attention":
        results = unfused_attention(b.ops, spec, q, k, v, bias, mask)
    else:
        out, _, d_out, d_lse = rest
        results = unfused_attention_bwd(b.ops, spec, q, k, v, bias, mask, out, d_out, d_lse,
                                        eqn.param_dict["bias_grad"])
    for value, var in zip(results, eqn.outvars):
        b.name(value, var)
    return b.eqns


@dataclass(frozen=True)
class AttentionPolicy:
    """How a backend runs attention equations: `native(eqn)` is a line for each it runs as a
    kernel of its own (None for the others); the others run as the tiled scans, or, where their
    B x N x T x S scores take at most `unfused_bytes`, as the plain math with the scores in
    memory (where the backend's contractions and row kernels outrun the scans' many small
    steps, as on the GPU; longer sequences stay tiled, their memory O(T)). `why_not(eqn)` says
    why an equation has no kernel of its own, for the line of those that do not."""

    native: Callable[[Eqn], "str | None"] | None = None
    unfused_bytes: int = 0
    why_not: Callable[[Eqn], "str | None"] | None = None

    def expansion(self, eqn: Eqn) -> tuple[str, list[Eqn] | None]:
        """The line for the "fusion" stage, and the equations replacing `eqn` (None: kept)."""
        how = self.native(eqn) if self.native is not None else None
        if how is not None:
            return how, None
        reason = self.why_not(eqn) if self.why_not is not None else None
        because = f" (no kernel of its own: {reason})" if reason else ""
        spec = Spec.of(*(a.type for a in eqn.inputs[:3]), eqn.param_dict)
        if spec.b * spec.n * spec.t * spec.s * spec.acc.bits // 8 <= self.unfused_bytes:
            return (f"{eqn.primitive} (B={spec.b} N={spec.n} T={spec.t} S={spec.s} H={spec.h}) unfused: "
                    f"its {spec.t} x {spec.s} scores in memory{because}"), _expand_unfused(eqn)
        return _describe(eqn) + because, EXPANSIONS[eqn.primitive](eqn)


def expand_attention(graph: Graph, policy: AttentionPolicy = AttentionPolicy()) -> tuple[Graph, tuple[str, ...]]:
    """`graph` with each attention equation replaced as `policy` says (by default by its tiled
    scans; the same graph when none is replaced), and a line per equation saying how it runs."""
    if not any(e.primitive in EXPANSIONS for e in graph.eqns):
        return graph, ()
    eqns: list[Eqn] = []
    notes = []
    expanded = False
    # A model's layers repeat their attention: each structure is expanded once, and the
    # expansion copied for the equations like it (its body Graphs shared, not rebuilt).
    made: dict[tuple, tuple[Eqn, str, list[Eqn] | None]] = {}
    for eqn in graph.eqns:
        if eqn.primitive not in EXPANSIONS:
            eqns.append(eqn)
            continue
        key = _structure(eqn)
        if key in made:
            first, how, replacement = made[key]
            replacement = None if replacement is None else _renamed(replacement, first, eqn)
        else:
            how, replacement = policy.expansion(eqn)
            if replacement is not None:
                replacement = _simplified(replacement, eqn)
            made[key] = eqn, how, replacement
        notes.append(how)
        eqns.extend([eqn] if replacement is None else replacement)
        expanded = expanded or replacement is not None
    if not expanded:
        return graph, tuple(notes)
    return Graph(graph.constvars, graph.invars, tuple(eqns), graph.outvars), tuple(notes)


def _simplified(expansion: list[Eqn], eqn: Eqn) -> list[Eqn]:
    """`expansion` (of `eqn`) simplified on its own, as a graph from the equation's operands to
    its results: once per distinct attention, not over the whole program once per program (a
    16-layer step's second `optimize` took 0.9 s). Where simplifying would give a result
    another value's producer (a result equal to an operand), the expansion stays as it is."""
    invars = tuple(dict.fromkeys(a for a in eqn.inputs if isinstance(a, Var)))
    simpler = optimize(Graph((), invars, tuple(expansion), eqn.outvars))
    made = {id(v) for e in simpler.eqns for v in e.outvars}
    results = {id(new): old for new, old in zip(simpler.outvars, eqn.outvars)}
    kept = {id(v) for v in eqn.outvars} & made  # a result's Var still made, not as a result
    if len(results) != len(eqn.outvars) or not results.keys() <= made or not kept <= results.keys():
        return expansion
    # the passes may give a result a fresh Var: it is the equation's result again
    return [Eqn(e.primitive, tuple(results.get(id(a), a) for a in e.inputs), e.params,
                tuple(results.get(id(v), v) for v in e.outvars), e.source) for e in simpler.eqns]


def _structure(eqn: Eqn) -> tuple:
    """All an attention equation's expansion depends on: its primitive, params (in their
    lossless text form), source line and operands, up to the identity of its values (which
    operands are one value stays in)."""
    first = {id(a): k for k, a in reversed(list(enumerate(eqn.inputs)))}
    operands = tuple((a.type, str(a) if isinstance(a, Literal) else first[id(a)]) for a in eqn.inputs)
    return eqn.primitive, format_param(eqn.params), eqn.source, operands


def _renamed(expansion: list[Eqn], was: Eqn, now: Eqn) -> list[Eqn]:
    """`expansion`, the equations replacing `was`, as those replacing `now` (an equation of
    the same structure): `now`'s operands and results in place of `was`'s, every other value
    made afresh (in the same order)."""
    values: dict[int, Var] = {a.id: b for a, b in zip(was.inputs, now.inputs) if isinstance(a, Var)}
    values.update((a.id, b) for a, b in zip(was.outvars, now.outvars))
    copies = []
    for e in expansion:
        for v in e.outvars:
            if v.id not in values:
                values[v.id] = Var(v.type)
        copies.append(Eqn(e.primitive, tuple(values[a.id] if isinstance(a, Var) else a for a in e.inputs),
                          e.params, tuple(values[v.id] for v in e.outvars), e.source))
    return copies


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


def tile_attention(graph: Graph, policy: AttentionPolicy = AttentionPolicy()) -> Tiled:
    """The "attention" step between the graph passes and fusion: the plain attention a
    program writes becomes `attention` equations (glue.scheduler.passes.attention), and every
    attention equation its tiled scans (simplified again, since tiling adds layout work), or
    what the backend's `policy` says instead."""
    recognised, found = recognize_attention(graph) if config.recognize_attention else (graph, ())
    expanded, tiled = expand_attention(recognised, policy)
    if expanded is not recognised:
        # Each distinct expansion was simplified on its own (`_simplified`); one round over the
        # program simplifies where they meet it (a literal operand, the layers' shared masks).
        expanded = optimize(expanded, rounds=1)
    return Tiled(expanded, found + tiled)
