"""NumPy implementations of every primitive: the definition of what each primitive computes.

Conventions the backends must match: integer `div` truncates toward zero and gives -1 (all ones,
for unsigned types) on a zero divisor, integer `rem` follows the dividend's sign and gives the
dividend on a zero divisor, integer arithmetic wraps, float->int conversion truncates and
saturates (NaN gives 0, negative values give 0 in unsigned types), int->int conversion wraps,
shifts by the operand's width or more (the amount read as unsigned) shift every bit out,
`bitcast_convert_type` reinterprets bits, `round` rounds half to even,
`gather` clamps indices into range, `scatter_add` drops out-of-range indices, and float16 /
bfloat16 sums, products and contractions accumulate in float32. float16 / bfloat16 math
functions compute in float32 and round once.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from glue.ir import RuleTable, every_primitive
from glue.ir import dtypes as dt

IMPLS = RuleTable("reference", every_primitive)
_impl = IMPLS.register


def _quiet(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapped


_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _logistic(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _math(fn: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """`fn` evaluated in at least float32 and rounded once to the operand's dtype."""
    def wrapped(x):
        wide = x.astype(np.float32) if x.dtype.itemsize < 4 else x
        return np.asarray(fn(wide), dtype=wide.dtype).astype(x.dtype)
    return wrapped


_UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "not": np.invert,
    **{name: _math(fn) for name, fn in {
        "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
        "expm1": np.expm1, "tanh": np.tanh, "logistic": _logistic, "sqrt": np.sqrt,
        "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "erf": _erf,
        "erfc": _erfc}.items()},
}
for _name, _fn in _UNARY.items():
    IMPLS[_name] = _quiet(_fn)


def _divisor(x, y):
    """y with the divisors that have a rule of their own replaced by 1: zero, and -1 for
    signed types (the minimum over -1 overflows), and where they were."""
    zero = y == 0
    minus_one = y == -1 if x.dtype.kind == "i" else np.zeros(np.shape(y), bool)
    return np.where(zero | minus_one, 1, y).astype(x.dtype), zero, minus_one


def _int_div(x, y):
    """Truncating division from NumPy's flooring one; x / -1 is -x, which wraps at the minimum
    (abs() would overflow there too)."""
    safe, zero, minus_one = _divisor(x, y)
    q = x // safe
    q = q + (((x - q * safe) != 0) & ((x < 0) != (safe < 0)))
    all_ones = np.invert(np.zeros((), x.dtype))
    return np.where(zero, all_ones, np.where(minus_one, np.negative(x), q)).astype(x.dtype)


def _int_rem(x, y):
    safe, zero, minus_one = _divisor(x, y)
    return np.where(zero, x, np.where(minus_one, 0, np.fmod(x, safe))).astype(x.dtype)


def _bit_views(x) -> tuple[np.dtype, np.dtype]:
    """The unsigned and signed integer dtypes of x's width."""
    return np.dtype(f"uint{x.dtype.itemsize * 8}"), np.dtype(f"int{x.dtype.itemsize * 8}")


def _shift(direction: str):
    """XLA's shifts on the two's-complement bits: an amount of the width or more (read as
    unsigned) gives 0, or the sign fill for the arithmetic right shift."""
    def shift(x, y):
        bits = x.dtype.itemsize * 8
        unsigned, signed = _bit_views(x)
        amount = np.asarray(y).view(unsigned)
        inside = amount < bits
        safe = np.where(inside, amount, 0).astype(unsigned)
        if direction == "arithmetic":
            moved = x.view(signed) >> np.where(inside, safe, bits - 1).astype(signed)
            return moved.view(x.dtype)
        pattern = x.view(unsigned)
        moved = pattern << safe if direction == "left" else pattern >> safe
        return np.where(inside, moved, 0).astype(unsigned).view(x.dtype)
    return shift


def _population_count(x):
    return np.bitwise_count(x.view(_bit_views(x)[0])).astype(x.dtype)


def _int_pow(x, y):
    pos = np.power(x, np.maximum(y, 0))
    if x.dtype.kind == "u":
        return pos
    neg = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0))
    return np.where(y >= 0, pos, neg).astype(x.dtype)


def _by_kind(float_fn, int_fn):
    return _quiet(lambda x, y: float_fn(x, y) if x.dtype.kind == "f" or x.dtype.kind == "V"
                  or x.dtype == dt.bfloat16.numpy else int_fn(x, y))


IMPLS.update({
    "add": _quiet(np.add), "sub": _quiet(np.subtract), "mul": _quiet(np.multiply),
    "div": _by_kind(np.true_divide, _int_div), "rem": _by_kind(np.fmod, _int_rem),
    "pow": _by_kind(np.power, _int_pow), "max": np.maximum, "min": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "shift_left": _shift("left"), "shift_right_logical": _shift("logical"),
    "shift_right_arithmetic": _shift("arithmetic"), "population_count": _population_count,
})


@_impl("select")
def _select(pred, on_true, on_false):
    return np.where(pred, on_true, on_false)


@_impl("convert_element_type")
def _convert(x, *, new_dtype):
    target = new_dtype.numpy
    if new_dtype.is_int and x.dtype.kind in "fV":
        info = np.iinfo(target)
        # the float just past info.max (which is itself no float for 64-bit types)
        past_max = 2.0 ** (info.bits - new_dtype.signed)
        t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
        inside = (t >= info.min) & (t < past_max)
        return np.where(inside, np.where(inside, t, 0).astype(target),
                        np.where(t < 0, info.min, info.max).astype(target))
    if new_dtype == dt.bool_:
        return x != 0
    with np.errstate(over="ignore"):  # a float too large for a narrower float becomes inf
        return x.astype(target)


@_impl("bitcast_convert_type")
def _bitcast_convert(x, *, new_dtype):
    return x.view(new_dtype.numpy)


def _accumulator(x) -> Any:
    """float16/bfloat16 accumulate in float32, as every backend does."""
    return np.float32 if x.dtype.kind in "fV" and x.dtype.itemsize < 4 else x.dtype


@_impl("reduce_sum")
def _reduce_sum(x, *, axes):
    return np.sum(x, axis=axes, dtype=_accumulator(x)).astype(x.dtype)


@_impl("reduce_prod")
def _reduce_prod(x, *, axes):
    return np.prod(x, axis=axes, dtype=_accumulator(x)).astype(x.dtype)


def _identity(x, largest: bool):
    if x.dtype == np.bool_:
        return largest
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return info.max if largest else info.min
    return np.inf if largest else -np.inf


@_impl("reduce_max")
def _reduce_max(x, *, axes):
    return np.max(x, axis=axes, initial=_identity(x, False))


@_impl("reduce_min")
def _reduce_min(x, *, axes):
    return np.min(x, axis=axes, initial=_identity(x, True))


@_impl("argmax")
def _argmax(x, *, axis, index_dtype):
    return np.argmax(x, axis=axis).astype(index_dtype.numpy)


@_impl("argmin")
def _argmin(x, *, axis, index_dtype):
    return np.argmin(x, axis=axis).astype(index_dtype.numpy)


@_impl("broadcast_in_dim")
def _broadcast_in_dim(x, *, shape, dims):
    expanded = [1] * len(shape)
    for n, d in zip(x.shape, dims):
        expanded[d] = n
    return np.broadcast_to(x.reshape(expanded), shape)


@_impl("reshape")
def _reshape(x, *, shape):
    return np.reshape(x, shape)


@_impl("transpose")
def _transpose(x, *, permutation):
    return np.transpose(x, permutation)


@_impl("slice")
def _slice(x, *, start, limit, strides):
    return x[tuple(slice(a, b, s) for a, b, s in zip(start, limit, strides))]


@_impl("pad")
def _pad(x, *, low, high, value):
    return np.pad(x, list(zip(low, high)), constant_values=np.array(value).astype(x.dtype))


@_impl("concatenate")
def _concatenate(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


@_impl("iota")
def _iota(*, dtype, shape, dimension):
    line = np.arange(shape[dimension]).astype(dtype.numpy)
    return np.broadcast_to(line.reshape([-1 if i == dimension else 1 for i in range(len(shape))]), shape)


@_impl("dot_general")
def _dot_general(lhs, rhs, *, dimension_numbers, precision=None, preferred_element_type=None):
    """Exact at every precision: the reference defines the product; a backend's TF32 is a
    rounding of it that tests allow for (glue.reference.compare)."""
    (lc, rc), (lb, rb) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lsub = [next(letters) for _ in range(lhs.ndim)]
    rsub = [next(letters) for _ in range(rhs.ndim)]
    for a, b in zip(lc + lb, rc + rb):
        rsub[b] = lsub[a]
    out = [lsub[a] for a in lb] + [s for i, s in enumerate(lsub) if i not in lc + lb] + \
          [s for i, s in enumerate(rsub) if i not in rc + rb]
    acc = _accumulator(lhs)
    result = np.einsum(f"{''.join(lsub)},{''.join(rsub)}->{''.join(out)}",
                       lhs.astype(acc), rhs.astype(acc), optimize=True)
    return result.astype(preferred_element_type.numpy if preferred_element_type is not None else lhs.dtype)


def _gather_index(x_shape, idx, axis: int, batch_dims: int):
    """The NumPy advanced index that reads `gather[axis, batch_dims] x idx` out of x."""
    n_idx = idx.ndim - batch_dims
    out_shape = x_shape[:axis] + idx.shape[batch_dims:] + x_shape[axis + 1:]
    rank = len(out_shape)
    grids = list(np.ogrid[tuple(slice(n) for n in out_shape)]) if rank else []
    if rank == 1:  # ogrid returns a bare array, not a list, for one dimension
        grids = [np.arange(out_shape[0])]
    placed = idx.reshape(idx.shape[:batch_dims] + (1,) * (axis - batch_dims) + idx.shape[batch_dims:]
                         + (1,) * (rank - axis - n_idx))
    return tuple(grids[:axis]) + (placed,) + tuple(grids[axis + n_idx:]), out_shape


@_impl("gather")
def _gather(x, idx, *, axis, batch_dims):
    index, out_shape = _gather_index(x.shape, np.clip(idx, 0, x.shape[axis] - 1), axis, batch_dims)
    return x[index]


@_impl("scatter_add")
def _scatter_add(x, idx, updates, *, axis, batch_dims):
    out = np.array(x, copy=True)
    index, out_shape = _gather_index(x.shape, idx, axis, batch_dims)
    full = [np.broadcast_to(i, out_shape) for i in index]
    keep = (full[axis] >= 0) & (full[axis] < x.shape[axis])
    np.add.at(out, tuple(i[keep] for i in full), np.broadcast_to(updates, out_shape)[keep])
    return out
