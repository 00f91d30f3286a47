"""One hypothesis strategy per IR primitive: a tiny program around the primitive and inputs for
it, shared by the autodiff and vmap tests.

With `smooth=True` the inputs keep away from the primitive's kinks (|x| > 0.2 for abs, maxima
apart by more than 0.1, no comparison ties ...) so that central finite differences are a valid
reference; otherwise ties and out-of-range indices are welcome. Programs whose result is not
floating-point are weighted by an extra float argument (`convert(out) * w`) so that every case
has a float output to differentiate.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

import glue
from glue import lax
from glue.frontend.tracing import bind
from glue.ir import dtypes as dt


@dataclass
class Case:
    fn: Callable[..., Any]
    args: list[np.ndarray]
    eps: float = 1e-6  # the finite-difference step that suits the case
    forward: bool = True  # jvp applies (a custom_vjp function refuses it)
    reverse: bool = True  # vjp applies (a while_loop refuses it)

    def __post_init__(self):
        self.args = [np.asarray(a) for a in self.args]


def _rng(draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _shape(draw, min_rank: int = 0, max_rank: int = 3) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, 3), min_size=min_rank, max_size=max_rank)))


def _uniform(rng, shape, lo, hi) -> np.ndarray:
    return np.asarray(rng.uniform(lo, hi, shape), np.float64)


def _signed(rng, shape, lo, hi) -> np.ndarray:
    return _uniform(rng, shape, lo, hi) * rng.choice([-1.0, 1.0], shape)


def _distinct(rng, shape) -> np.ndarray:
    """Values at least 0.2 apart, so that maxima and minima are unique and stable."""
    size = math.prod(shape)
    return (rng.permutation(size) * 0.3 + rng.uniform(-0.05, 0.05, size) - size * 0.15).reshape(shape)


def _logical_values(rng, shape, as_bool: bool) -> np.ndarray:
    return rng.integers(0, 2, shape).astype(bool) if as_bool else rng.integers(-4, 5, shape).astype(np.int32)


def _weighted(fn: Callable[..., Any], args: list[np.ndarray], out_shape: tuple[int, ...], rng) -> Case:
    """A case for fn's (non-float) result converted to float64 and times an extra float argument."""
    def weighted(*all_args):
        *inputs, w = all_args
        return bind("mul", bind("convert_element_type", fn(*inputs), new_dtype=dt.float64), w)
    return Case(weighted, args + [_uniform(rng, out_shape, -2, 2)])


# --- elementwise ----------------------------------------------------------------------------

_UNARY_DOMAINS = {
    "exp": (-2, 2), "exp2": (-2, 2), "tanh": (-2, 2), "logistic": (-3, 3), "sin": (-3, 3),
    "cos": (-3, 3), "erf": (-2, 2), "erfc": (-2, 2), "neg": (-2, 2), "expm1": (-2, 2),
    "log": (0.5, 3), "log2": (0.5, 3), "sqrt": (0.5, 3), "rsqrt": (0.5, 3), "log1p": (-0.5, 2),
}


def _unary(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng, shape = _rng(draw), _shape(draw)
        if name in _UNARY_DOMAINS:
            x = _uniform(rng, shape, *_UNARY_DOMAINS[name])
        elif name in ("abs", "sign"):
            x = _signed(rng, shape, 0.2, 2)
        else:  # floor, ceil, round: away from integers and from halves
            x = rng.integers(-3, 3, shape) + rng.uniform(0.1, 0.4, shape) + 0.5 * rng.integers(0, 2, shape)
            x = np.asarray(x, np.float64)
        return Case(lambda a: bind(name, a), [x])
    return build


@st.composite
def _not(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw)
    return _weighted(lambda a: bind("not", a), [_logical_values(rng, shape, draw(st.booleans()))], shape, rng)


def _operand_shapes(draw, n: int) -> list[tuple[int, ...]]:
    """n elementwise operand shapes: equal, except that some may be rank 0."""
    shape = _shape(draw)
    shapes = [shape if draw(st.booleans()) or i == 0 else () for i in range(n)]
    return shapes if draw(st.booleans()) else shapes[::-1]


def _binary_values(name: str, rng, sx, sy, smooth: bool) -> tuple[np.ndarray, np.ndarray]:
    full = np.broadcast_shapes(sx, sy)
    if name == "div":
        return _uniform(rng, sx, -2, 2), _signed(rng, sy, 0.5, 2)
    if name == "rem":  # x / y = k + f with f away from integers, where fmod has kinks
        if sx == full:
            y = _signed(rng, sy, 0.5, 2)
            return (rng.integers(-3, 4, full) + rng.uniform(0.15, 0.85, full)) * y, y
        x = np.asarray(2.5 * rng.choice([-1.0, 1.0]))
        return x, x / _signed(rng, full, 1.15, 1.85)
    if name == "pow":
        return _uniform(rng, sx, 0.5, 2), _uniform(rng, sy, -2, 2)
    if name in ("max", "min") and smooth:  # operands at least 0.1 apart
        gap = _signed(rng, full, 0.1, 1)
        if sy == full:
            x = _uniform(rng, sx, -2, 2)
            return x, x + gap
        y = _uniform(rng, sy, -2, 2)
        return y + gap, y
    return _uniform(rng, sx, -2, 2), _uniform(rng, sy, -2, 2)


def _binary(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng = _rng(draw)
        sx, sy = _operand_shapes(draw, 2)
        x, y = _binary_values(name, rng, sx, sy, smooth)
        return Case(lambda a, b: bind(name, a, b), [x, y])
    return build


def _compare(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng = _rng(draw)
        sx, sy = _operand_shapes(draw, 2)
        x = rng.integers(-3, 4, sx) * 0.5
        y = rng.integers(-3, 4, sy) * 0.5 + (0.25 if smooth else 0.0)  # ties only when not smooth
        return _weighted(lambda a, b: bind(name, a, b), [x, np.asarray(y, np.float64)],
                         np.broadcast_shapes(sx, sy), rng)
    return build


def _logical(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng = _rng(draw)
        sx, sy = _operand_shapes(draw, 2)
        as_bool = draw(st.booleans())
        x, y = (_logical_values(rng, s, as_bool) for s in (sx, sy))
        return _weighted(lambda a, b: bind(name, a, b), [x, y], np.broadcast_shapes(sx, sy), rng)
    return build


@st.composite
def _shift(draw, smooth: bool, name: str = "shift_left") -> Case:
    rng = _rng(draw)
    sx, sy = _operand_shapes(draw, 2)
    dtype = draw(st.sampled_from([dt.int32, dt.uint32, dt.int8, dt.uint16]))
    info = np.iinfo(dtype.numpy)
    x = rng.integers(info.min, info.max, sx, endpoint=True).astype(dtype.numpy)
    y = rng.integers(-1, dtype.bits + 2, sy).astype(dtype.numpy)  # amounts past the width too
    return _weighted(lambda a, b: bind(name, a, b), [x, y], np.broadcast_shapes(sx, sy), rng)


@st.composite
def _population_count(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw)
    x = rng.integers(-2**31, 2**31, shape).astype(draw(st.sampled_from([np.int32, np.uint32])))
    return _weighted(lambda a: bind("population_count", a), [x], shape, rng)


@st.composite
def _bitcast(draw, smooth: bool) -> Case:
    """The bits of floats, reinterpreted as floats (integer inputs carry no derivative)."""
    rng, shape = _rng(draw), _shape(draw)
    bits = _uniform(rng, shape, -2, 2).astype(np.float32).view(np.uint32)
    return _weighted(lambda a: bind("bitcast_convert_type", a, new_dtype=dt.float32), [bits], shape, rng)


@st.composite
def _select(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    sp, st_, sf = _operand_shapes(draw, 3)
    pred = rng.integers(0, 2, sp).astype(bool)
    return Case(lambda p, a, b: bind("select", p, a, b),
                [pred, _uniform(rng, st_, -2, 2), _uniform(rng, sf, -2, 2)])


@st.composite
def _convert(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw)
    kind = draw(st.sampled_from(["f32_round_trip", "to_int", "from_int", "from_bool"]))
    if kind == "f32_round_trip":  # linear, so a large step is exact up to f32 rounding
        def fn(a):
            return bind("convert_element_type", bind("convert_element_type", a, new_dtype=dt.float32),
                        new_dtype=dt.float64)
        return Case(fn, [_uniform(rng, shape, -2, 2)], eps=0.5)
    if kind == "to_int":
        x = rng.integers(-3, 3, shape) + rng.uniform(0.1, 0.9, shape)
        return _weighted(lambda a: bind("convert_element_type", a, new_dtype=dt.int32), [x], shape, rng)
    x = _logical_values(rng, shape, kind == "from_bool")
    return _weighted(lambda a: bind("convert_element_type", a, new_dtype=dt.float64), [x], shape, rng)


# --- reductions -----------------------------------------------------------------------------

def _axes(draw, rank: int) -> tuple[int, ...]:
    return tuple(sorted(draw(st.sets(st.integers(0, rank - 1), max_size=rank)))) if rank else ()


def _reduce(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng, shape = _rng(draw), _shape(draw, 1)
        axes = _axes(draw, len(shape))
        if name == "reduce_prod":  # exact zeros test the product-of-others rule
            x = _signed(rng, shape, 0.5, 1.5) * (rng.uniform(size=shape) > 0.2)
        elif name == "reduce_sum" or not smooth:
            x = _uniform(rng, shape, -2, 2)
        else:
            x = _distinct(rng, shape)
        return Case(lambda a: bind(name, a, axes=axes), [np.asarray(x, np.float64)])
    return build


def _arg_reduce(name: str):
    @st.composite
    def build(draw, smooth: bool) -> Case:
        rng, shape = _rng(draw), _shape(draw, 1)
        axis = draw(st.integers(0, len(shape) - 1))
        index_dtype = draw(st.sampled_from([dt.int32, dt.int64]))
        out_shape = shape[:axis] + shape[axis + 1:]
        return _weighted(lambda a: bind(name, a, axis=axis, index_dtype=index_dtype), [_distinct(rng, shape)],
                         out_shape, rng)
    return build


# --- layout ---------------------------------------------------------------------------------

@st.composite
def _broadcast_in_dim(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw)
    dims = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), max_size=len(shape))))) if shape else ()
    operand = tuple(shape[d] if draw(st.booleans()) else 1 for d in dims)
    return Case(lambda a: bind("broadcast_in_dim", a, shape=shape, dims=dims),
                [_uniform(rng, operand, -2, 2)])


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def _reshape(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw)
    factors = draw(st.permutations(_factors(math.prod(shape)) + [1] * draw(st.integers(0, 1))))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(factors) - 1)), max_size=2))) if factors else []
    groups = [factors[a:b] for a, b in zip([0] + cuts, cuts + [len(factors)])]
    target = tuple(math.prod(g) for g in groups if g)
    return Case(lambda a: bind("reshape", a, shape=target), [_uniform(rng, shape, -2, 2)])


@st.composite
def _transpose(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw)
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return Case(lambda a: bind("transpose", a, permutation=perm), [_uniform(rng, shape, -2, 2)])


@st.composite
def _slice(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    start = tuple(draw(st.integers(0, n - 1)) for n in shape)
    limit = tuple(draw(st.integers(lo + 1, n)) for lo, n in zip(start, shape))
    strides = tuple(draw(st.integers(1, 3)) for _ in shape)
    return Case(lambda a: bind("slice", a, start=start, limit=limit, strides=strides),
                [_uniform(rng, shape, -2, 2)])


@st.composite
def _pad(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw, 1)
    low = tuple(draw(st.integers(0, 2)) for _ in shape)
    high = tuple(draw(st.integers(0, 2)) for _ in shape)
    value = draw(st.sampled_from([0.0, -1.5]))
    return Case(lambda a: bind("pad", a, low=low, high=high, value=value), [_uniform(rng, shape, -2, 2)])


@st.composite
def _concatenate(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw, 1)
    dimension = draw(st.integers(0, len(shape) - 1))
    parts = [shape[:dimension] + (draw(st.integers(1, 3)),) + shape[dimension + 1:]
             for _ in range(draw(st.integers(1, 3)))]
    return Case(lambda *xs: bind("concatenate", *xs, dimension=dimension),
                [_uniform(rng, s, -2, 2) for s in parts])


@st.composite
def _iota(draw, smooth: bool) -> Case:
    rng, shape = _rng(draw), _shape(draw, 1)
    dimension = draw(st.integers(0, len(shape) - 1))
    dtype = draw(st.sampled_from([dt.float64, dt.int32]))
    return _weighted(lambda: bind("iota", dtype=dtype, shape=shape, dimension=dimension), [], shape, rng)


# --- contraction and indexing ---------------------------------------------------------------

@st.composite
def _dot_general(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    n_batch, n_contract, n_lhs, n_rhs = (draw(st.integers(0, 2)) for _ in range(4))
    size = {k: draw(st.integers(1, 3)) for k in
            [("b", i) for i in range(n_batch)] + [("c", i) for i in range(n_contract)]
            + [("l", i) for i in range(n_lhs)] + [("r", i) for i in range(n_rhs)]}
    common = [("b", i) for i in range(n_batch)] + [("c", i) for i in range(n_contract)]
    lhs = draw(st.permutations(common + [("l", i) for i in range(n_lhs)]))
    rhs = draw(st.permutations(common + [("r", i) for i in range(n_rhs)]))
    def axes_of(side, kind, n):
        return tuple(side.index((kind, i)) for i in range(n))

    numbers = ((axes_of(lhs, "c", n_contract), axes_of(rhs, "c", n_contract)),
               (axes_of(lhs, "b", n_batch), axes_of(rhs, "b", n_batch)))
    args = [_uniform(rng, tuple(size[k] for k in side), -2, 2) for side in (lhs, rhs)]
    return Case(lambda a, b: bind("dot_general", a, b, dimension_numbers=numbers), args)


def _gather_setup(draw, rng):
    x_shape = _shape(draw, 1)
    axis = draw(st.integers(0, len(x_shape) - 1))
    batch_dims = draw(st.integers(0, axis))
    idx_shape = x_shape[:batch_dims] + _shape(draw, 0, 2)
    idx = rng.integers(-1, x_shape[axis] + 1, idx_shape).astype(np.int32)  # some out of range
    out_shape = x_shape[:axis] + idx_shape[batch_dims:] + x_shape[axis + 1:]
    return x_shape, axis, batch_dims, idx, out_shape


@st.composite
def _gather(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    x_shape, axis, batch_dims, idx, _ = _gather_setup(draw, rng)
    return Case(lambda x, i: bind("gather", x, i, axis=axis, batch_dims=batch_dims),
                [_uniform(rng, x_shape, -2, 2), idx])


@st.composite
def _scatter_add(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    x_shape, axis, batch_dims, idx, out_shape = _gather_setup(draw, rng)
    return Case(lambda x, i, u: bind("scatter_add", x, i, u, axis=axis, batch_dims=batch_dims),
                [_uniform(rng, x_shape, -2, 2), idx, _uniform(rng, out_shape, -2, 2)])


# --- control flow and calls -----------------------------------------------------------------

@st.composite
def _scan(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 0, 2)
    length = draw(st.integers(0, 3))
    reverse = draw(st.booleans())

    def fn(c0, w, xs):
        def step(carry, x):
            h, k = carry
            new = bind("tanh", bind("add", bind("mul", h, w), x))
            return (new, bind("add", k, np.int32(1))), bind("mul", new, h)
        (h, _), ys = lax.scan(step, (c0, np.int32(0)), xs, reverse=reverse)
        return bind("add", h, bind("reduce_sum", ys, axes=(0,)))

    return Case(fn, [_uniform(rng, shape, -1, 1), _uniform(rng, (), 0.5, 1.5),
                     _uniform(rng, (length,) + shape, -1, 1)])


@st.composite
def _while(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 0, 2)
    trips = draw(st.integers(0, 3))

    def fn(x, w):
        def body(carry):
            i, v = carry
            return bind("add", i, np.int32(1)), bind("mul", bind("sin", v), w)
        return lax.while_loop(lambda c: bind("lt", c[0], np.int32(trips)), body, (np.int32(0), x))[1]

    return Case(fn, [_uniform(rng, shape, -1, 1), _uniform(rng, shape, 0.5, 1.5)], reverse=False)


@st.composite
def _cond(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 0, 2)

    def fn(pred, x, y):
        return lax.cond(pred, lambda a, b: bind("mul", bind("sin", a), b), lambda a, b: bind("sub", a, b), x, y)

    return Case(fn, [np.asarray(draw(st.booleans())), _uniform(rng, shape, -2, 2), _uniform(rng, shape, -2, 2)])


@glue.custom_jvp
def _sin_times(x, y):
    return bind("mul", bind("sin", x), y)


@_sin_times.defjvp
def _sin_times_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return _sin_times(x, y), bind("add", bind("mul", bind("mul", bind("cos", x), y), tx), bind("mul", bind("sin", x), ty))


@st.composite
def _custom_jvp_call(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 0, 2)
    return Case(_sin_times, [_uniform(rng, shape, -2, 2), _uniform(rng, shape, -2, 2)])


@glue.custom_vjp
def _exp_times(x, y):
    return bind("mul", bind("exp", x), y)


def _exp_times_fwd(x, y):
    e = bind("exp", x)
    return bind("mul", e, y), (e, y)


def _exp_times_bwd(res, g):
    e, y = res
    return bind("mul", bind("mul", g, e), y), bind("mul", g, e)


_exp_times.defvjp(_exp_times_fwd, _exp_times_bwd)


@st.composite
def _custom_vjp_call(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 0, 2)
    return Case(_exp_times, [_uniform(rng, shape, -1, 1), _uniform(rng, shape, -2, 2)], forward=False)


@st.composite
def _checkpoint(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw, 1, 2)
    policy = draw(st.sampled_from([None, glue.checkpoint_policies.everything_saveable,
                                   glue.checkpoint_policies.dots_saveable]))

    def block(x, w):
        h = bind("sin", bind("dot_general", x, w, dimension_numbers=(((x.ndim - 1,), (0,)), ((), ()))))
        return bind("mul", h, h)

    n = shape[-1]
    return Case(lambda x, w: glue.checkpoint(block, policy=policy)(x, w),
                [_uniform(rng, shape, -1, 1), _uniform(rng, (n, n), -1, 1)])


@st.composite
def _optimization_barrier(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    shape = _shape(draw)

    def fn(x, y):
        a, b = lax.optimization_barrier((bind("sin", x), y))
        return bind("mul", a, b)

    return Case(fn, [_uniform(rng, shape, -2, 2), _uniform(rng, shape, -2, 2)])


@st.composite
def _debug_print(draw, smooth: bool) -> Case:
    rng = _rng(draw)

    def fn(x):
        glue.debug.print("x = {}", x)
        return bind("mul", x, x)

    return Case(fn, [_uniform(rng, _shape(draw), -2, 2)])


def _attention_operands(draw, rng):
    """q, k, v (B, T, N, H) with K kv heads dividing N, a bias and a mask (or None), params."""
    b, t, s, kv, group, h = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3)),
                             draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    n = kv * group
    args = [_uniform(rng, (b, t, n, h), -1, 1), _uniform(rng, (b, s, kv, h), -1, 1), _uniform(rng, (b, s, kv, h), -1, 1)]
    has_bias, has_mask = draw(st.booleans()), draw(st.booleans())
    if has_bias:
        args.append(_uniform(rng, (1, n, t, s), -1, 1))
    if has_mask:
        args.append(rng.random((b, 1, t, s)) > 0.3)
    params = dict(scale=draw(st.sampled_from([0.5, 1.0])), causal=draw(st.booleans()), layout="BTNH",
                  masked_value=-1e30, has_bias=has_bias, has_mask=has_mask)
    return args, params


@st.composite
def _attention(draw, smooth: bool) -> Case:
    args, params = _attention_operands(draw, _rng(draw))
    return Case(lambda *xs: bind("attention", *xs, **params)[0], args)


@st.composite
def _attention_bwd(draw, smooth: bool) -> Case:
    rng = _rng(draw)
    args, params = _attention_operands(draw, rng)
    d_out = _uniform(rng, args[0].shape, -1, 1)

    def fn(*xs):
        *operands, g = xs
        out, lse = bind("attention", *operands, **params)
        return bind("attention_bwd", *operands, out, lse, g, bind("mul", lse, 0.0), bias_grad=params["has_bias"],
                    **params)[0]

    return Case(fn, args + [d_out])


CASES: dict[str, Callable[..., st.SearchStrategy[Case]]] = {
    **{name: _unary(name) for name in list(_UNARY_DOMAINS) + ["abs", "sign", "floor", "ceil", "round"]},
    "not": _not,
    **{name: _binary(name) for name in ("add", "sub", "mul", "div", "rem", "pow", "max", "min")},
    **{name: _compare(name) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{name: _logical(name) for name in ("and", "or", "xor")},
    **{name: functools.partial(_shift, name=name)
       for name in ("shift_left", "shift_right_logical", "shift_right_arithmetic")},
    "population_count": _population_count,
    "bitcast_convert_type": _bitcast,
    "select": _select,
    "convert_element_type": _convert,
    **{name: _reduce(name) for name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")},
    **{name: _arg_reduce(name) for name in ("argmax", "argmin")},
    "broadcast_in_dim": _broadcast_in_dim, "reshape": _reshape, "transpose": _transpose,
    "slice": _slice, "pad": _pad, "concatenate": _concatenate, "iota": _iota,
    "dot_general": _dot_general, "gather": _gather, "scatter_add": _scatter_add,
    "scan": _scan, "while": _while, "cond": _cond, "custom_jvp_call": _custom_jvp_call,
    "custom_vjp_call": _custom_vjp_call, "checkpoint": _checkpoint, "optimization_barrier": _optimization_barrier,
    "debug_print": _debug_print, "attention": _attention, "attention_bwd": _attention_bwd,
}
