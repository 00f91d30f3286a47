"""JAX's lax operations on exact types: elementwise math, reductions, shapes, casts and
contractions, each one primitive (or a few) of the IR.

As in JAX, operands are not promoted: both operands of a binary operation have one dtype (a
Python scalar takes the other operand's, being weakly typed) and one shape (a scalar operand
broadcasts). Contractions take JAX's `precision` ("default", "high", "highest", `Precision.*`,
or a pair) and `preferred_element_type`; `default_matmul_precision` sets what "default"
resolves to for the contractions traced inside it.
"""
from __future__ import annotations

import builtins
import contextlib
import enum
import numbers
from typing import Any, Iterator, Sequence

import numpy as np

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.tracing import Tracer, bind, type_of
from glue.frontend.transforms import stop_gradient
from glue.ir import dtypes as dt
from glue.settings import config


class Precision(enum.Enum):
    """JAX's matmul precisions (on a GPU: DEFAULT and HIGH allow TF32 for float32, HIGHEST keeps
    full float32)."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"

    def __str__(self) -> str:
        return self.value


def dot_general(lhs: Any, rhs: Any, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None) -> Any:
    """Contract `lhs` and `rhs` over `((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`:
    the output holds the batch dims, then lhs's free dims, then rhs's (as jax.lax.dot_general)."""
    (lc, rc), (lb, rb) = dimension_numbers
    numbers = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
    preferred = None if preferred_element_type is None else dt.from_numpy(preferred_element_type)
    return bind("dot_general", lhs, rhs, dimension_numbers=numbers, precision=precision,
                preferred_element_type=preferred)


@contextlib.contextmanager
def default_matmul_precision(precision: Any) -> Iterator[None]:
    """Contractions traced inside that name no precision use `precision` (as
    jax.default_matmul_precision; the setting is also `glue.config.default_matmul_precision`)."""
    with config.override(default_matmul_precision=str(getattr(precision, "value", precision))):
        yield


def _fail(fn: str, message: str) -> GlueTypeError:
    return GlueTypeError(f"lax.{fn}: {message} {describe_location(user_frame_location())}")


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _operand(x: Any) -> Any:
    """A value of glue's: Tracers and Arrays as they are, NumPy data as arrays of its dtype."""
    if isinstance(x, Tracer) or hasattr(x, "aval"):
        return x
    return np.asarray(x, dtype=dt.from_numpy(np.asarray(x).dtype).numpy)


def _pair(fn: str, x: Any, y: Any) -> tuple[Any, Any]:
    """Binary operands with one dtype: a Python scalar takes the other's."""
    if _is_weak(x) and not _is_weak(y):
        x = type_of(y).dtype.numpy.type(x)
    elif _is_weak(y) and not _is_weak(x):
        y = type_of(x).dtype.numpy.type(y)
    else:
        x, y = _operand(x), _operand(y)
    tx, ty = type_of(x), type_of(y)
    if tx.dtype != ty.dtype:
        raise _fail(fn, f"operands of different dtypes {tx} and {ty} (lax does not promote; convert one "
                        "with lax.convert_element_type)")
    return x, y


def _binary(name: str, fn: str):
    def op(x: Any, y: Any) -> Any:
        return bind(name, *_pair(fn, x, y))
    op.__name__ = fn
    op.__doc__ = f"Elementwise {fn} of two operands of one dtype (jax.lax.{fn})."
    return op


def _unary(name: str, fn: str):
    def op(x: Any) -> Any:
        return bind(name, _operand(x))
    op.__name__ = fn
    op.__doc__ = f"Elementwise {fn} (jax.lax.{fn})."
    return op


add, sub, mul, div = _binary("add", "add"), _binary("sub", "sub"), _binary("mul", "mul"), _binary("div", "div")
rem, pow, max, min = _binary("rem", "rem"), _binary("pow", "pow"), _binary("max", "max"), _binary("min", "min")  # noqa: A001
eq, ne, lt, le, gt, ge = (_binary(n, n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
bitwise_and, bitwise_or, bitwise_xor = _binary("and", "bitwise_and"), _binary("or", "bitwise_or"), _binary("xor", "bitwise_xor")
neg, abs, sign = _unary("neg", "neg"), _unary("abs", "abs"), _unary("sign", "sign")  # noqa: A001
exp, exp2, log, log1p, expm1 = (_unary(n, n) for n in ("exp", "exp2", "log", "log1p", "expm1"))
tanh, logistic, sqrt, rsqrt = (_unary(n, n) for n in ("tanh", "logistic", "sqrt", "rsqrt"))
sin, cos, erf, floor, ceil, round = (_unary(n, n) for n in ("sin", "cos", "erf", "floor", "ceil", "round"))  # noqa: A001
bitwise_not = _unary("not", "bitwise_not")


def square(x: Any) -> Any:
    """x * x."""
    x = _operand(x)
    return bind("mul", x, x)


def integer_pow(x: Any, y: int) -> Any:
    """x ** y for a Python int y, by repeated squaring (jax.lax.integer_pow)."""
    if not isinstance(y, numbers.Integral) or isinstance(y, bool):
        raise _fail("integer_pow", f"the exponent must be a Python int, not {y!r}")
    x = _operand(x)
    result, base, n = None, x, builtins.abs(int(y))
    while n:
        if n & 1:
            result = base if result is None else bind("mul", result, base)
        n >>= 1
        if n:
            base = bind("mul", base, base)
    one = type_of(x).dtype.numpy.type(1)
    if result is None:
        return bind("broadcast_in_dim", one, shape=type_of(x).shape, dims=())
    return bind("div", one, result) if y < 0 else result


def erfc(x: Any) -> Any:
    """1 - erf(x) (jax.lax.erfc; computed as the difference, so it loses relative accuracy in the
    far right tail until glue has an erfc primitive)."""
    x = _operand(x)
    return bind("sub", type_of(x).dtype.numpy.type(1), bind("erf", x))


def clamp(lo: Any, x: Any, hi: Any) -> Any:
    """min(max(x, lo), hi) (jax.lax.clamp; note the argument order)."""
    x, lo = _pair("clamp", x, lo)
    x, hi = _pair("clamp", x, hi)
    return bind("min", bind("max", x, lo), hi)


def select(pred: Any, on_true: Any, on_false: Any) -> Any:
    """on_true where pred else on_false, elementwise (jax.lax.select): pred is bool, the others
    one dtype; all one shape (or scalars)."""
    on_true, on_false = _pair("select", on_true, on_false)
    return bind("select", _operand(pred), on_true, on_false)


def convert_element_type(operand: Any, new_dtype: Any) -> Any:
    """`operand` as `new_dtype` (float -> int truncates and saturates)."""
    target = dt.from_numpy(new_dtype)
    operand = _operand(operand)
    return operand if type_of(operand).dtype == target else bind("convert_element_type", operand, new_dtype=target)


def _axes(fn: str, x: Any, axes: Sequence[int]) -> tuple[int, ...]:
    ndim = type_of(x).ndim
    out = []
    for a in axes:
        if not isinstance(a, numbers.Integral) or not -ndim <= a < ndim:
            raise _fail(fn, f"axis {a!r} is out of range for {type_of(x)}")
        out.append(int(a) % ndim)
    return tuple(sorted(set(out)))


def _reduction(name: str, fn: str):
    def op(operand: Any, axes: Sequence[int]) -> Any:
        operand = _operand(operand)
        return bind(name, operand, axes=_axes(fn, operand, axes))
    op.__name__ = fn
    op.__doc__ = f"The {fn[7:]} of `operand` over `axes` (jax.lax.{fn})."
    return op


reduce_sum, reduce_prod = _reduction("reduce_sum", "reduce_sum"), _reduction("reduce_prod", "reduce_prod")
reduce_max, reduce_min = _reduction("reduce_max", "reduce_max"), _reduction("reduce_min", "reduce_min")


def argmax(operand: Any, axis: int, index_dtype: Any) -> Any:
    """Index of the largest element along `axis` (the first on ties)."""
    operand = _operand(operand)
    (axis,) = _axes("argmax", operand, (axis,))
    return bind("argmax", operand, axis=axis, index_dtype=dt.from_numpy(index_dtype))


def argmin(operand: Any, axis: int, index_dtype: Any) -> Any:
    """Index of the smallest element along `axis` (the first on ties)."""
    operand = _operand(operand)
    (axis,) = _axes("argmin", operand, (axis,))
    return bind("argmin", operand, axis=axis, index_dtype=dt.from_numpy(index_dtype))


def broadcast_in_dim(operand: Any, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> Any:
    """`operand` in an array of `shape`, its axis i along axis broadcast_dimensions[i]."""
    return bind("broadcast_in_dim", _operand(operand), shape=tuple(int(n) for n in shape),
                dims=tuple(int(d) for d in broadcast_dimensions))


def broadcast(operand: Any, sizes: Sequence[int]) -> Any:
    """`operand` with leading axes of `sizes` added (jax.lax.broadcast)."""
    operand = _operand(operand)
    shape = type_of(operand).shape
    sizes = tuple(int(n) for n in sizes)
    return broadcast_in_dim(operand, sizes + shape, range(len(sizes), len(sizes) + len(shape)))


def expand_dims(operand: Any, dimensions: Sequence[int]) -> Any:
    """`operand` with size-1 axes inserted at `dimensions` (of the result)."""
    operand = _operand(operand)
    shape = list(type_of(operand).shape)
    rank = len(shape) + len(dimensions)
    for d in sorted(int(d) % rank for d in dimensions):
        shape.insert(d, 1)
    return bind("reshape", operand, shape=tuple(shape))


def reshape(operand: Any, new_sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> Any:
    """`operand` (its axes first permuted by `dimensions`) in row-major order as `new_sizes`."""
    operand = _operand(operand)
    if dimensions is not None:
        operand = transpose(operand, dimensions)
    return bind("reshape", operand, shape=tuple(int(n) for n in new_sizes))


def transpose(operand: Any, permutation: Sequence[int]) -> Any:
    """`operand` with its axes permuted: axis i of the result is axis permutation[i]."""
    return bind("transpose", _operand(operand), permutation=tuple(int(p) for p in permutation))


def slice(operand: Any, start_indices: Sequence[int], limit_indices: Sequence[int],  # noqa: A001
          strides: Sequence[int] | None = None) -> Any:
    """operand[start:limit:stride] on every axis, with static bounds (jax.lax.slice)."""
    operand = _operand(operand)
    ndim = type_of(operand).ndim
    return bind("slice", operand, start=tuple(int(i) for i in start_indices),
                limit=tuple(int(i) for i in limit_indices),
                strides=tuple(int(s) for s in strides) if strides is not None else (1,) * ndim)


def slice_in_dim(operand: Any, start_index: int, limit_index: int, stride: int = 1, axis: int = 0) -> Any:
    """operand[start:limit:stride] along `axis`."""
    operand = _operand(operand)
    shape = type_of(operand).shape
    axis = int(axis) % len(shape)
    start = [0] * len(shape)
    limit = list(shape)
    strides = [1] * len(shape)
    start[axis], limit[axis], strides[axis] = int(start_index), int(limit_index), int(stride)
    return slice(operand, start, limit, strides)


def concatenate(operands: Sequence[Any], dimension: int) -> Any:
    """The operands joined along `dimension` (jax.lax.concatenate)."""
    operands = [_operand(x) for x in operands]
    if not operands:
        raise _fail("concatenate", "needs at least one operand")
    ndim = type_of(operands[0]).ndim
    if len(operands) == 1:
        return operands[0]
    return bind("concatenate", *operands, dimension=int(dimension) % builtins.max(ndim, 1))


def pad(operand: Any, padding_value: Any, padding_config: Sequence[tuple[int, int, int]]) -> Any:
    """`operand` with (low, high, interior) padding per axis (jax.lax.pad): interior puts that
    many values between neighbours, negative low or high padding crops."""
    operand = _operand(operand)
    t = type_of(operand)
    config = [tuple(int(v) for v in c) for c in padding_config]
    if len(config) != t.ndim or any(len(c) != 3 or c[2] < 0 for c in config):
        raise _fail("pad", f"padding_config needs one (low, high, interior >= 0) per axis of {t}, got {padding_config}")
    traced_value = isinstance(padding_value, Tracer)
    value = 0 if traced_value else np.asarray(padding_value).item()
    x = operand
    if any(c[2] for c in config):  # interior padding: each element followed by `interior` fills
        x = _interior(x, [c[2] for c in config], value)
    low = [c[0] for c in config]
    high = [c[1] for c in config]
    shape = type_of(x).shape
    # negative padding crops first, then the rest pads
    start = [-lo if lo < 0 else 0 for lo in low]
    limit = [n + hi if hi < 0 else n for n, hi in zip(shape, high)]
    if start != [0] * len(shape) or limit != list(shape):
        x = bind("slice", x, start=tuple(start), limit=tuple(limit), strides=(1,) * len(shape))
    lo, hi = tuple(builtins.max(v, 0) for v in low), tuple(builtins.max(v, 0) for v in high)
    if any(lo) or any(hi):
        x = bind("pad", x, low=lo, high=hi, value=_scalar(value, t.dtype))
    if traced_value:  # a traced padding value: pad a mask alongside and select
        ones = bind("broadcast_in_dim", True, shape=t.shape, dims=())
        mask = pad(ones, False, config)
        fill = bind("broadcast_in_dim", convert_element_type(padding_value, t.dtype), shape=type_of(x).shape, dims=())
        x = bind("select", mask, x, fill)
    return x


def _scalar(value: Any, dtype: dt.DType) -> Any:
    kind = {"bool": bool, "int": int, "float": float}[dtype.kind]
    return kind(value)


def _interior(x: Any, interior: Sequence[int], value: Any) -> Any:
    """`x` with `interior[a]` fills between neighbours along each axis a."""
    t = type_of(x)
    split = []
    gaps = []
    for n, k in zip(t.shape, interior):
        split += [n, 1] if k else [n]
        gaps += [0, k] if k else [0]
    y = bind("reshape", x, shape=tuple(split))
    y = bind("pad", y, low=(0,) * len(split), high=tuple(gaps), value=_scalar(value, t.dtype))
    spread = tuple(n * (k + 1) for n, k in zip(t.shape, interior))
    y = bind("reshape", y, shape=spread)
    limit = tuple(builtins.max(n * (k + 1) - k, 0) for n, k in zip(t.shape, interior))
    return bind("slice", y, start=(0,) * t.ndim, limit=limit, strides=(1,) * t.ndim)


def iota(dtype: Any, size: int) -> Any:
    """[0, 1, ..., size - 1] of `dtype` (jax.lax.iota)."""
    return bind("iota", dtype=dt.from_numpy(dtype), shape=(int(size),), dimension=0)


def broadcasted_iota(dtype: Any, shape: Sequence[int], dimension: int) -> Any:
    """An array of `shape` counting along `dimension`."""
    return bind("iota", dtype=dt.from_numpy(dtype), shape=tuple(int(n) for n in shape), dimension=int(dimension))


def optimization_barrier(operand: Any) -> Any:
    """`operand` (a pytree), which the compiler must compute before anything it feeds and may
    not merge with an equal computation (jax.lax.optimization_barrier)."""
    from glue.frontend.pytree import tree_flatten, tree_unflatten

    leaves, tree = tree_flatten(operand)
    if not leaves:
        return operand
    return tree_unflatten(tree, bind("optimization_barrier", *[_operand(x) for x in leaves]))


__all__ = ["Precision", "abs", "add", "argmax", "argmin", "bitwise_and", "bitwise_not", "bitwise_or",
           "bitwise_xor", "broadcast", "broadcast_in_dim", "broadcasted_iota", "ceil", "clamp", "concatenate",
           "convert_element_type", "cos", "default_matmul_precision", "div", "dot_general", "eq", "erf", "erfc",
           "exp", "exp2", "expand_dims", "expm1", "floor", "ge", "gt", "integer_pow", "iota", "le", "log", "log1p",
           "logistic", "lt", "max", "min", "mul", "ne", "neg", "optimization_barrier", "pad", "pow", "reduce_max",
           "reduce_min", "reduce_prod", "reduce_sum", "rem", "reshape", "round", "rsqrt", "select", "sign", "sin",
           "slice", "slice_in_dim", "sqrt", "square", "stop_gradient", "sub", "tanh", "transpose"]
