"""`import glue.numpy as gnp`: the NumPy-style surface, composed from IR primitives.

Everything here works on NumPy arrays, Python scalars, `glue.Array`s and Tracers alike:
inside a trace it records primitives, outside it evaluates them eagerly. Dtype promotion is
JAX's (Python scalars are weakly typed); default dtypes are int32 and float32, and functions
that need floats (exp, mean, true_divide, ...) turn integers into float32.

Where NumPy's answer depends on values rather than shapes (boolean masks, `where(cond)`),
glue raises a GlueError: every shape must be known while tracing. Out-of-bounds indices are
an error when the indices are concrete; traced indices are clamped, as `gather` does.
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Sequence

import numpy as np

from glue.errors import GlueError, GlueIndexError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.array import Array
from glue.frontend.tracing import Tracer, bind, current_trace, type_of
from glue.ir import dtypes as dt
from glue.ir.core import literal_problem
from glue.ir.dtypes import DType

float16, bfloat16, float32, float64 = (d.numpy.type for d in dt.FLOAT_DTYPES)
int32, int64, bool_ = dt.int32.numpy.type, dt.int64.numpy.type, dt.bool_.numpy.type
pi, e, inf, nan = np.pi, np.e, np.inf, np.nan

Shape = tuple[int, ...]


def _fail(fn: str, message: str, *arrays: Any, error: type[GlueError] = GlueTypeError) -> GlueError:
    """The error for a bad call of `fn`: names it, its operands' types and the user's line."""
    operands = ", ".join(str(type_of(a)) for a in arrays)
    return error(f"{fn}({operands}): {message} {describe_location(user_frame_location())}")


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _dtype_of(x: Any) -> DType:
    return type_of(x).dtype


def _shape(x: Any) -> Shape:
    return type_of(x).shape


def to_dtype(dtype: Any) -> DType:
    """The glue dtype for a NumPy dtype, a NumPy type, a dtype name or a glue DType, as a
    traced program has it (64-bit types narrowed to 32 bits unless x64 is enabled, as JAX)."""
    try:
        return dt.canonical(dt.from_numpy(dtype))
    except TypeError as err:  # NumPy's "not understood", or a NumPy dtype glue lacks (complex)
        raise GlueTypeError(f"{dtype!r} is not a glue dtype: {err} {describe_location(user_frame_location())}") \
            from None


def result_dtype(*xs: Any) -> DType:
    """The dtype elementwise operands promote to (weak Python scalars follow the arrays)."""
    return dt.result_type(*(x if _is_weak(x) else _dtype_of(x) for x in xs))


def astype(x: Any, dtype: Any) -> Any:
    """`x` converted to `dtype` (float -> int truncates toward zero and saturates)."""
    return _cast(x, to_dtype(dtype), "astype")


def _cast(x: Any, target: DType, fn: str, *operands: Any) -> Any:
    """`x` converted to `target` for `fn` (on `operands`, which an error names): a Python int
    that `target` cannot hold is an error rather than a wrapped value, as in JAX."""
    if _is_weak(x):
        _check_weak_int(fn, x, target, *operands)
        return Array(np.asarray(x, dtype=target.numpy))
    x = asarray(x)
    return x if _dtype_of(x) == target else bind("convert_element_type", x, new_dtype=target)


def _check_weak_int(fn: str, x: Any, target: DType, *operands: Any) -> None:
    if isinstance(x, int) and not isinstance(x, bool) and target != dt.bool_:
        problem = literal_problem(x, target)
        if problem:
            raise _fail(fn, f"the Python int {problem} (a Python int takes the dtype of the arrays it "
                            f"meets, else {dt.DEFAULT_INT}; make it an array of a wider dtype)",
                        *(o for o in operands if not _is_weak(o)))


def asarray(x: Any, dtype: Any = None) -> Any:
    """`x` as a glue value: Tracers and glue.Arrays stay as they are; NumPy data, Python
    scalars and lists become a glue.Array (without a copy) when evaluating eagerly."""
    if isinstance(x, (list, tuple)):
        if _holds_tracer(x):
            return stack([asarray(v) for v in x])
        x = _from_sequence(x)
        if dtype is None and x.dtype == np.int64 and x.size:
            # Python ints default to the default int, as alone: one that does not fit is an error
            default = dt.canonical(dt.int64)
            _check_weak_int("asarray", int(x.min()), default)
            _check_weak_int("asarray", int(x.max()), default)
    if _is_weak(x):
        _check_weak_int("asarray", x, dt.weak_scalar_dtype(x))
        x = np.asarray(x, dtype=dt.weak_scalar_dtype(x).numpy)
    if isinstance(x, (np.ndarray, np.generic)) and current_trace() is None:
        # (a trace captures NumPy data by identity, so it is left as is)
        x = Array(np.asarray(x, dtype=_dtype_of(x).numpy))
    return x if dtype is None else astype(x, dtype)


array = asarray


def _holds_tracer(x: list | tuple) -> bool:
    """Whether a (nested) list or tuple has a traced value anywhere in it."""
    return builtins.any(isinstance(v, Tracer) or isinstance(v, (list, tuple)) and _holds_tracer(v) for v in x)


def _from_sequence(x: list | tuple) -> np.ndarray:
    """A (nested) list of concrete values as a NumPy array: a ragged one, or one of values glue
    has no dtype for (strings, objects, complex numbers), is an error naming the line."""
    try:
        values = np.asarray(x)
        to_dtype(values.dtype)
    except (ValueError, TypeError, OverflowError) as err:
        raise _fail("asarray", f"cannot make an array of this {type(x).__name__} ({err})") from None
    return values


def _promote(xs: Sequence[Any], dtype: DType | None = None, fn: str = "promote") -> list[Any]:
    """Operands of `fn` converted to one dtype: `dtype`, or the one they promote to."""
    xs = [x if _is_weak(x) else asarray(x) for x in xs]
    dtype = dtype or result_dtype(*xs)
    return [_cast(x, dtype, fn, *xs) for x in xs]


# --- broadcasting ---------------------------------------------------------------------------

def _broadcast_shape(*shapes: Shape) -> Shape | None:
    """NumPy's broadcast of `shapes`, or None when they do not broadcast together."""
    if shapes and builtins.all(s == shapes[0] for s in shapes):  # the usual case, at once
        return shapes[0]
    rank = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    shapes = tuple(tuple(s) for s in shapes)
    out = _broadcast_shape(*shapes)
    if out is None:
        raise GlueTypeError(f"broadcast_shapes: shapes {', '.join(map(str, shapes))} cannot be broadcast "
                            f"together {describe_location(user_frame_location())}")
    return out


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    x = asarray(x)
    shape = _shape_arg("broadcast_to", shape)
    have = _shape(x)
    if have == shape:
        return x
    if len(have) > len(shape) or _broadcast_shape(have, shape) != shape:
        raise _fail("broadcast_to", f"cannot broadcast to {shape}", x)
    lead = len(shape) - len(have)
    return bind("broadcast_in_dim", x, shape=shape, dims=tuple(range(lead, len(shape))))


def _broadcast_all(fn: str, xs: Sequence[Any]) -> list[Any]:
    """Operands broadcast to one shape; rank-0 ones stay scalars (IR literals or 0-d values)."""
    shape = _broadcast_shape(*(_shape(x) for x in xs))
    if shape is None:
        raise _fail(fn, "operand shapes cannot be broadcast together", *xs)
    return [x if _shape(x) in (shape, ()) else broadcast_to(x, shape) for x in xs]


def _apply_elementwise(fn: str, primitive: str, xs: Sequence[Any], dtype: DType | None = None,
                       **params: Any) -> Any:
    operands = _broadcast_all(fn, _promote(xs, dtype, fn))
    try:
        return bind(primitive, *operands, **params)
    except GlueTypeError as err:
        if fn == primitive:
            raise
        raise GlueTypeError(f"{fn}: {err}") from None  # name what the user called (bitwise_and for `and`)


# --- elementwise ----------------------------------------------------------------------------

# NumPy's + and * on booleans are logical or / and.
_BOOL_PRIMITIVES = {"add": "or", "mul": "and"}


def _binary(name: str, primitive: str, float_only: bool = False, dtype: DType | None = None):
    def fn(x: Any, y: Any) -> Any:
        x, y = (v if _is_weak(v) else asarray(v) for v in (x, y))
        out_dtype = dtype or result_dtype(x, y)
        if float_only and not out_dtype.is_float:
            out_dtype = dt.DEFAULT_FLOAT
        prim = _BOOL_PRIMITIVES.get(primitive, primitive) if out_dtype == dt.bool_ else primitive
        return _apply_elementwise(name, prim, [x, y], out_dtype)
    fn.__name__ = name
    return fn


add = _binary("add", "add")
subtract = _binary("subtract", "sub")
multiply = _binary("multiply", "mul")
true_divide = divide = _binary("true_divide", "div", float_only=True)
fmod = _binary("fmod", "rem")
maximum = _binary("maximum", "max")
minimum = _binary("minimum", "min")
bitwise_and = _binary("bitwise_and", "and")
bitwise_or = _binary("bitwise_or", "or")
bitwise_xor = _binary("bitwise_xor", "xor")
logical_and = _binary("logical_and", "and", dtype=dt.bool_)
logical_or = _binary("logical_or", "or", dtype=dt.bool_)
logical_xor = _binary("logical_xor", "xor", dtype=dt.bool_)
equal = _binary("equal", "eq")
not_equal = _binary("not_equal", "ne")
less = _binary("less", "lt")
less_equal = _binary("less_equal", "le")
greater = _binary("greater", "gt")
greater_equal = _binary("greater_equal", "ge")


def _unary(name: str, primitive: str, float_only: bool = False):
    def fn(x: Any) -> Any:
        x = asarray(x)
        if float_only and not _dtype_of(x).is_float:
            x = astype(x, dt.DEFAULT_FLOAT)
        return bind(primitive, x)
    fn.__name__ = name
    return fn


negative = _unary("negative", "neg")
abs = absolute = _unary("abs", "abs")
sign = _unary("sign", "sign")
invert = bitwise_not = _unary("invert", "not")
exp = _unary("exp", "exp", True)
exp2 = _unary("exp2", "exp2", True)
log = _unary("log", "log", True)
log2 = _unary("log2", "log2", True)
log1p = _unary("log1p", "log1p", True)
expm1 = _unary("expm1", "expm1", True)
tanh = _unary("tanh", "tanh", True)
sqrt = _unary("sqrt", "sqrt", True)
sin = _unary("sin", "sin", True)
cos = _unary("cos", "cos", True)
floor = _unary("floor", "floor", True)
ceil = _unary("ceil", "ceil", True)


def round(x: Any, decimals: int = 0) -> Any:
    """Round half to even at `decimals` digits after the point; integers stay as they are."""
    x = asarray(x)
    if not _dtype_of(x).is_float:
        if decimals < 0:
            raise _fail("round", f"decimals={decimals} is not supported for integer arrays", x)
        return x
    if decimals == 0:
        return bind("round", x)
    factor = 10.0 ** decimals
    return true_divide(bind("round", multiply(x, factor)), factor)


around = round


def logical_not(x: Any) -> Any:
    return bind("not", astype(x, dt.bool_))


def square(x: Any) -> Any:
    return multiply(x, x)


def reciprocal(x: Any) -> Any:
    return true_divide(1, x)


def isnan(x: Any) -> Any:
    x = asarray(x)
    return not_equal(x, x) if _dtype_of(x).is_float else full(_shape(x), False)


def isinf(x: Any) -> Any:
    x = asarray(x)
    return equal(abs(x), inf) if _dtype_of(x).is_float else full(_shape(x), False)


def isfinite(x: Any) -> Any:
    x = asarray(x)
    return less(abs(x), inf) if _dtype_of(x).is_float else full(_shape(x), True)


def where(condition: Any, x: Any = None, y: Any = None) -> Any:
    """`x` where `condition` holds, else `y` (broadcast together)."""
    if x is None or y is None:
        raise _fail("where", "needs x and y: where(condition) alone has a data-dependent shape",
                    asarray(condition))
    cond = astype(condition, dt.bool_)
    return bind("select", *_broadcast_all("where", [cond, *_promote([x, y], fn="where")]))


def clip(x: Any, min: Any = None, max: Any = None, *, a_min: Any = None, a_max: Any = None) -> Any:
    """`x` limited to [min, max] (either may be None); a_min / a_max are NumPy's older names."""
    low, high = (a_min if min is None else min), (a_max if max is None else max)
    out = x if low is None else maximum(x, low)
    return out if high is None else minimum(out, high)


def _integer_power(x: Any, n: int) -> Any:
    """`x ** n` for a small non-negative int as a chain of multiplies (like JAX's integer_pow)."""
    if n == 0:
        return full_like(x, 1)
    acc, base = None, x
    while n:
        if n & 1:
            acc = base if acc is None else multiply(acc, base)
        n >>= 1
        if n:
            base = multiply(base, base)
    return acc


def power(x: Any, y: Any) -> Any:
    x = x if _is_weak(x) else asarray(x)
    if isinstance(y, int) and not isinstance(y, bool) and -8 <= y <= 8 and not _is_weak(x):
        if y >= 0:
            return _integer_power(x, y)
        if _dtype_of(x).is_float:
            return reciprocal(_integer_power(x, -y))
    return _apply_elementwise("power", "pow", [x, y])


def _signed_rem(fn: str, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
    """(x, y, fmod(x, y), where that remainder's sign differs from the divisor's)."""
    x, y = _broadcast_all(fn, _promote([x, y], fn=fn))
    rem = bind("rem", x, y)
    fix = logical_and(not_equal(rem, 0), not_equal(less(rem, 0), less(y, 0)))
    return x, y, rem, fix


def remainder(x: Any, y: Any) -> Any:
    """NumPy's `x % y`: the result takes the divisor's sign."""
    _, y, rem, fix = _signed_rem("remainder", x, y)
    return where(fix, add(rem, y), rem)


mod = remainder


def floor_divide(x: Any, y: Any) -> Any:
    """NumPy's `x // y`: the quotient rounded toward negative infinity."""
    x, y, rem, fix = _signed_rem("floor_divide", x, y)
    if not _dtype_of(x).is_float:
        quotient = bind("div", x, y)
        return where(fix, subtract(quotient, 1), quotient)
    # As NumPy does: divide the exact multiple x - fmod(x, y), so that rounding in x / y
    # cannot push the quotient over an integer.
    quotient = true_divide(subtract(x, rem), y)
    quotient = where(fix, subtract(quotient, 1), quotient)
    floored = floor(quotient)
    return where(greater(subtract(quotient, floored), 0.5), add(floored, 1), floored)


def logaddexp(x: Any, y: Any) -> Any:
    """log(exp(x) + exp(y)) without overflow."""
    x, y = _broadcast_all("logaddexp", _promote([x, y], fn="logaddexp"))
    if not _dtype_of(x).is_float:
        x, y = astype(x, dt.DEFAULT_FLOAT), astype(y, dt.DEFAULT_FLOAT)
    delta = subtract(x, y)
    # x == y == +-inf makes delta NaN; the answer is then x + y.
    return where(isnan(delta), add(x, y), add(maximum(x, y), log1p(exp(negative(abs(delta))))))


# --- creation -------------------------------------------------------------------------------

def _shape_arg(fn: str, shape: Any, allow_unknown: bool = False) -> Shape:
    """A shape argument (an int or a sequence of ints) as a tuple; -1 only where allowed."""
    try:
        dims = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else \
            tuple(operator.index(n) for n in shape)
    except TypeError:
        raise _fail(fn, f"a shape must be an int or a sequence of ints, got {shape!r}") from None
    if builtins.any(n < (-1 if allow_unknown else 0) for n in dims):
        raise _fail(fn, f"negative dimensions are not allowed in shape {shape}")
    return dims


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Any:
    """An array of `shape` filled with `fill_value` (of its dtype unless `dtype` is given)."""
    shape = _shape_arg("full", shape)
    target = to_dtype(dtype) if dtype is not None else dt.weak_scalar_dtype(fill_value) if _is_weak(fill_value) else None
    value = asarray(fill_value) if target is None else _cast(fill_value, target, "full")
    if _shape(value):
        return broadcast_to(value, shape)
    return bind("broadcast_in_dim", value, shape=shape, dims=())


def zeros(shape: Any, dtype: Any = float32) -> Any:
    return full(shape, 0, dtype)


def ones(shape: Any, dtype: Any = float32) -> Any:
    return full(shape, 1, dtype)


def full_like(x: Any, fill_value: Any, dtype: Any = None) -> Any:
    x = asarray(x)
    return full(_shape(x), fill_value, _dtype_of(x) if dtype is None else dtype)


def zeros_like(x: Any, dtype: Any = None) -> Any:
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Any:
    return full_like(x, 1, dtype)


def _affine_iota(n: int, start: Any, step: Any, dtype: DType) -> Any:
    """[start, start + step, ..., start + (n-1) step] in `dtype`."""
    line = bind("iota", dtype=dtype, shape=(n,), dimension=0)
    line = line if step == 1 else multiply(line, _cast(step, dtype, "arange"))
    return line if start == 0 else add(line, _cast(start, dtype, "arange"))


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> Any:
    """NumPy's arange; int32 when every bound is an int, else float32, unless `dtype` says."""
    if stop is None:
        start, stop = 0, start
    bounds = []
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise _fail("arange", "needs concrete bounds: the length of the result must be known "
                                  "while tracing", v)
        bounds.append(v.item() if hasattr(v, "item") else v)
    start, stop, step = bounds
    if step == 0:
        raise _fail("arange", "step must not be zero")
    if dtype is None:
        dtype = dt.DEFAULT_INT if builtins.all(isinstance(v, int) for v in bounds) else dt.DEFAULT_FLOAT
    n = builtins.max(0, math.ceil((stop - start) / step))
    return _affine_iota(n, start, step, to_dtype(dtype))


def _offsets(m: int, n: int) -> Any:
    """cols - rows over an (m, n) grid: which diagonal each position is on."""
    rows = bind("iota", dtype=dt.int32, shape=(m, n), dimension=0)
    cols = bind("iota", dtype=dt.int32, shape=(m, n), dimension=1)
    return subtract(cols, rows)


def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = float32) -> Any:
    return astype(equal(_offsets(N, N if M is None else M), k), dtype)


def _triangle(fn: str, x: Any, k: int, below: bool) -> Any:
    x = asarray(x)
    if type_of(x).ndim < 2:
        raise _fail(fn, "needs an array of rank 2 or more", x)
    offsets = _offsets(*_shape(x)[-2:])
    keep = less_equal(offsets, k) if below else greater_equal(offsets, k)
    return where(keep, x, astype(0, _dtype_of(x)))


def tril(x: Any, k: int = 0) -> Any:
    """`x` with the elements above the k-th diagonal zeroed."""
    return _triangle("tril", x, k, below=True)


def triu(x: Any, k: int = 0) -> Any:
    """`x` with the elements below the k-th diagonal zeroed."""
    return _triangle("triu", x, k, below=False)


# --- shapes and axes ------------------------------------------------------------------------

def _axis(fn: str, x: Any, axis: Any, ndim: int | None = None) -> int:
    """`axis` normalised into [0, ndim) (ndim defaults to x's rank)."""
    ndim = type_of(x).ndim if ndim is None else ndim
    try:
        a = operator.index(axis)
    except TypeError:
        raise _fail(fn, f"axis must be an int, got {axis!r}", x) from None
    if not -ndim <= a < ndim:
        raise _fail(fn, f"axis {axis} is out of bounds for rank {ndim}", x)
    return a % ndim


def _axes(fn: str, x: Any, axis: Any, ndim: int | None = None) -> tuple[int, ...]:
    """An axis, a sequence of axes or None (all of them), normalised; no repeats."""
    ndim = type_of(x).ndim if ndim is None else ndim
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(_axis(fn, x, a, ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if len(set(axes)) != len(axes):
        raise _fail(fn, f"repeated axis in {axis}", x)
    return axes


def reshape(x: Any, shape: Any) -> Any:
    x = asarray(x)
    shape = _shape_arg("reshape", shape, allow_unknown=True)
    size = type_of(x).size
    if shape.count(-1) > 1:
        raise _fail("reshape", f"can only infer one dimension of {shape}", x)
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if known == 0 or size % known:
            raise _fail("reshape", f"cannot reshape {size} elements into {shape}", x)
        shape = tuple(size // known if n == -1 else n for n in shape)
    if math.prod(shape) != size:
        raise _fail("reshape", f"cannot reshape {size} elements into {shape}", x)
    return x if shape == _shape(x) else bind("reshape", x, shape=shape)


def ravel(x: Any) -> Any:
    return reshape(x, -1)


def transpose(x: Any, axes: Sequence[int] | None = None) -> Any:
    x = asarray(x)
    ndim = type_of(x).ndim
    perm = tuple(reversed(range(ndim))) if axes is None else _axes("transpose", x, tuple(axes))
    if len(perm) != ndim:
        raise _fail("transpose", f"axes {tuple(axes)} are not a permutation of {ndim} axes", x)
    return x if perm == tuple(range(ndim)) else bind("transpose", x, permutation=perm)


def swapaxes(x: Any, axis1: int, axis2: int) -> Any:
    x = asarray(x)
    perm = list(range(type_of(x).ndim))
    a, b = _axis("swapaxes", x, axis1), _axis("swapaxes", x, axis2)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def moveaxis(x: Any, source: Any, destination: Any) -> Any:
    x = asarray(x)
    src, dst = _axes("moveaxis", x, source), _axes("moveaxis", x, destination)
    if len(src) != len(dst):
        raise _fail("moveaxis", f"source {source} and destination {destination} differ in length", x)
    order = [a for a in range(type_of(x).ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def expand_dims(x: Any, axis: Any) -> Any:
    x = asarray(x)
    ndim = type_of(x).ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    new = _axes("expand_dims", x, axis, ndim)
    rest = iter(_shape(x))
    return reshape(x, tuple(1 if i in new else next(rest) for i in range(ndim)))


def squeeze(x: Any, axis: Any = None) -> Any:
    x = asarray(x)
    shape = _shape(x)
    axes = tuple(i for i, n in enumerate(shape) if n == 1) if axis is None else _axes("squeeze", x, axis)
    if builtins.any(shape[a] != 1 for a in axes):
        raise _fail("squeeze", f"cannot squeeze axes {axis} whose size is not 1", x)
    return reshape(x, tuple(n for i, n in enumerate(shape) if i not in axes))


def concatenate(arrays: Sequence[Any], axis: int | None = 0) -> Any:
    xs = _promote(list(arrays), fn="concatenate")
    if not xs:
        raise _fail("concatenate", "needs at least one array")
    if axis is None:
        xs, axis = [ravel(x) for x in xs], 0
    if builtins.any(type_of(x).ndim == 0 for x in xs):
        raise _fail("concatenate", "cannot concatenate zero-dimensional arrays", *xs)
    axis = _axis("concatenate", xs[0], axis)
    first = _shape(xs[0])
    for x in xs:
        shape = _shape(x)
        if len(shape) != len(first) or shape[:axis] + shape[axis + 1:] != first[:axis] + first[axis + 1:]:
            raise _fail("concatenate", f"shapes must match except along axis {axis}", *xs)
    return xs[0] if len(xs) == 1 else bind("concatenate", *xs, dimension=axis)


def stack(arrays: Sequence[Any], axis: int = 0) -> Any:
    xs = [asarray(x) for x in arrays]
    if not xs:
        raise _fail("stack", "needs at least one array")
    if len({_shape(x) for x in xs}) > 1:
        raise _fail("stack", "all arrays must have the same shape", *xs)
    axis = _axis("stack", xs[0], axis, type_of(xs[0]).ndim + 1)
    return concatenate([expand_dims(x, axis) for x in xs], axis)


def _slice_axis(x: Any, axis: int, start: int, stop: int) -> Any:
    shape = _shape(x)
    return bind("slice", x, start=tuple(start if i == axis else 0 for i in range(len(shape))),
                limit=tuple(stop if i == axis else n for i, n in enumerate(shape)),
                strides=(1,) * len(shape))


def split(x: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """Pieces of `x` along `axis`: n equal sections, or cut at the given indices."""
    x = asarray(x)
    axis = _axis("split", x, axis)
    n = _shape(x)[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or n % sections:
            raise _fail("split", f"{sections} sections do not divide axis {axis} of size {n} equally", x)
        cuts = [n // sections * i for i in range(1, sections)]
    else:
        cuts = [int(i) for i in indices_or_sections]
    bounds = [0] + cuts + [n]
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        r = range(n)[lo:hi]
        pieces.append(_slice_axis(x, axis, r.start, builtins.max(r.start, r.stop)))
    return pieces


def flip(x: Any, axis: Any = None) -> Any:
    x = asarray(x)
    axes = _axes("flip", x, axis)
    return getitem(x, tuple(slice(None, None, -1) if i in axes else slice(None)
                            for i in range(type_of(x).ndim)))


# --- reductions -----------------------------------------------------------------------------

def _reduce(fn: str, primitive: str, x: Any, axis: Any, keepdims: bool) -> Any:
    axes = _axes(fn, x, axis)
    out = bind(primitive, x, axes=axes)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else n for i, n in enumerate(_shape(x))))
    return out


def _count(x: Any, axes: tuple[int, ...]) -> int:
    return math.prod(_shape(x)[a] for a in axes)


def _summable(x: Any, dtype: Any) -> Any:
    """x in the dtype a sum or product runs in: `dtype`, or int32 for booleans."""
    x = asarray(x)
    if dtype is not None:
        return astype(x, dtype)
    return astype(x, dt.DEFAULT_INT) if _dtype_of(x) == dt.bool_ else x


def _masked(fn: str, x: Any, mask: Any, fill: Any) -> Any:
    """`x` with `fill` wherever the `where=` mask (broadcast to x's shape) is False."""
    if mask is None:
        return x
    mask = astype(mask, dt.bool_)
    if _broadcast_shape(_shape(mask), _shape(x)) != _shape(x):
        raise _fail(fn, f"the where= mask {type_of(mask)} does not broadcast to the array", x)
    return bind("select", broadcast_to(mask, _shape(x)), x, full_like(x, fill))


def _count_where(x: Any, axes: tuple[int, ...], mask: Any, keepdims: bool) -> Any:
    """How many elements each reduction over `axes` takes in: static without a mask."""
    if mask is None:
        return _count(x, axes)
    return sum(astype(broadcast_to(mask, _shape(x)), dt.DEFAULT_INT), axes, keepdims=keepdims)


def sum(x: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False,
        initial: Any = None, where: Any = None) -> Any:
    x = _masked("sum", _summable(x, dtype), where, 0)
    out = _reduce("sum", "reduce_sum", x, axis, keepdims)
    return out if initial is None else add(out, astype(initial, _dtype_of(out)))


def prod(x: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False,
         initial: Any = None, where: Any = None) -> Any:
    x = _masked("prod", _summable(x, dtype), where, 1)
    out = _reduce("prod", "reduce_prod", x, axis, keepdims)
    return out if initial is None else multiply(out, astype(initial, _dtype_of(out)))


def _extremum(fn: str, primitive: str, combine: Any):
    def reduction(x: Any, axis: Any = None, *, keepdims: bool = False, initial: Any = None,
                  where: Any = None) -> Any:
        x = asarray(x)
        if where is not None and initial is None:
            raise _fail(fn, "has no identity, so a where= mask needs initial= too", x)
        axes = _axes(fn, x, axis)
        if initial is not None:
            initial = astype(initial, _dtype_of(x))
        if _count(x, axes) == 0:
            if initial is None:
                raise _fail(fn, "a reduction over zero elements has no identity", x)
            kept = tuple(1 if i in axes else n for i, n in enumerate(_shape(x))) if keepdims else \
                tuple(n for i, n in enumerate(_shape(x)) if i not in axes)
            return full(kept, initial)
        out = _reduce(fn, primitive, _masked(fn, x, where, initial), axes, keepdims)
        return out if initial is None else combine(out, initial)
    reduction.__name__ = fn
    return reduction


max = amax = _extremum("max", "reduce_max", maximum)
min = amin = _extremum("min", "reduce_min", minimum)


def any(x: Any, axis: Any = None, *, keepdims: bool = False, where: Any = None) -> Any:
    return _reduce("any", "reduce_max", _masked("any", astype(x, dt.bool_), where, False), axis, keepdims)


def all(x: Any, axis: Any = None, *, keepdims: bool = False, where: Any = None) -> Any:
    return _reduce("all", "reduce_min", _masked("all", astype(x, dt.bool_), where, True), axis, keepdims)


def _mean_dtypes(x: Any, dtype: Any) -> tuple[DType, DType]:
    """(result dtype, dtype to compute in) of a mean: integers give float32, and float16 /
    bfloat16 are averaged in float32."""
    out = to_dtype(dtype) if dtype is not None else (_dtype_of(x) if _dtype_of(x).is_float else dt.DEFAULT_FLOAT)
    return out, (dt.float32 if out.is_float and out.bits < 32 else out)


def mean(x: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False,
         where: Any = None) -> Any:
    """The average over `axis`; with a `where=` mask, of the elements it selects (NaN where it
    selects none, as 0 / 0)."""
    x = asarray(x)
    axes = _axes("mean", x, axis)
    out, compute = _mean_dtypes(x, dtype)
    total = sum(astype(x, compute), axes, keepdims=keepdims, where=where)
    return astype(true_divide(total, _count_where(x, axes, where, keepdims)), out)


def var(x: Any, axis: Any = None, dtype: Any = None, *, ddof: int = 0, keepdims: bool = False,
        where: Any = None) -> Any:
    x = asarray(x)
    axes = _axes("var", x, axis)
    out, compute = _mean_dtypes(x, dtype)
    x = astype(x, compute)
    centered = subtract(x, mean(x, axes, keepdims=True, where=where))
    total = sum(multiply(centered, centered), axes, keepdims=keepdims, where=where)
    count = _count_where(x, axes, where, keepdims)
    dof = builtins.max(count - ddof, 0) if isinstance(count, int) else maximum(subtract(count, ddof), 0)
    return astype(true_divide(total, dof), out)


def std(x: Any, axis: Any = None, dtype: Any = None, *, ddof: int = 0, keepdims: bool = False,
        where: Any = None) -> Any:
    x = asarray(x)
    axes = _axes("std", x, axis)
    out, compute = _mean_dtypes(x, dtype)
    return astype(sqrt(var(x, axes, compute, ddof=ddof, keepdims=keepdims, where=where)), out)


def _arg_extremum(fn: str):
    def reduction(x: Any, axis: int | None = None, *, keepdims: bool = False) -> Any:
        x = asarray(x)
        shape = _shape(x)
        flat = axis is None
        if flat:
            x, axis = ravel(x), 0
        axis = _axis(fn, x, axis)
        if _shape(x)[axis] == 0:
            raise _fail(fn, "attempt to get the index of an extremum of an empty sequence", x)
        out = bind(fn, x, axis=axis, index_dtype=dt.DEFAULT_INT)
        if keepdims:
            out = reshape(out, (1,) * len(shape)) if flat else expand_dims(out, axis)
        return out
    reduction.__name__ = fn
    return reduction


argmax = _arg_extremum("argmax")
argmin = _arg_extremum("argmin")


# --- contractions ---------------------------------------------------------------------------

def _contract(a: Any, b: Any, a_axis: int, b_axis: int, **precision: Any) -> Any:
    """Sum over a's `a_axis` against b's `b_axis`, no batch dims: a's free dims then b's."""
    return bind("dot_general", a, b, dimension_numbers=(((a_axis,), (b_axis,)), ((), ())), **precision)


def _precision(precision: Any, preferred_element_type: Any) -> dict[str, Any]:
    """The contraction params for JAX's `precision=` and `preferred_element_type=` arguments."""
    preferred = None if preferred_element_type is None else dt.from_numpy(preferred_element_type)
    return {"precision": precision, "preferred_element_type": preferred}


def matmul(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Any:
    """`a @ b` with NumPy's rules: 1-D operands are vectors, leading dims broadcast as batches.
    `precision` ("default" | "high" | "highest" or `glue.Precision.*`; default
    `glue.config.default_matmul_precision`) and `preferred_element_type` as in JAX."""
    params = _precision(precision, preferred_element_type)
    a, b = _promote([a, b], fn="matmul")
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        raise _fail("matmul", "operands must not be scalars (use multiply)", a, b)
    kb = sb[-2] if len(sb) > 1 else sb[0]
    if sa[-1] != kb:
        raise _fail("matmul", f"contraction dimensions differ ({sa[-1]} vs {kb})", a, b)
    if len(sb) <= 2:
        return _contract(a, b, len(sa) - 1, 0, **params)
    if len(sa) == 1:
        return _contract(a, b, 0, len(sb) - 2, **params)
    batch = _broadcast_shape(sa[:-2], sb[:-2])
    if batch is None:
        raise _fail("matmul", "batch dimensions cannot be broadcast together", a, b)
    a, b = broadcast_to(a, batch + sa[-2:]), broadcast_to(b, batch + sb[-2:])
    nb = len(batch)
    return bind("dot_general", a, b, dimension_numbers=(((nb + 1,), (nb,)),
                                                        (tuple(range(nb)), tuple(range(nb)))), **params)


def dot(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Any:
    """NumPy's dot: a's last axis against b's second-to-last (or only) axis; scalars multiply."""
    params = _precision(precision, preferred_element_type)
    a, b = _promote([a, b], fn="dot")
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        return multiply(a, b)
    b_axis = len(sb) - 2 if len(sb) > 1 else 0
    if sa[-1] != sb[b_axis]:
        raise _fail("dot", f"contraction dimensions differ ({sa[-1]} vs {sb[b_axis]})", a, b)
    return _contract(a, b, len(sa) - 1, b_axis, **params)


Label = str | int  # a letter of the subscripts, or -k for the k-th ellipsis dim from the right


def _are_letters(text: str) -> bool:
    return text == "" or text.isalpha()


def _einsum_labels(subscripts: str, ops: Sequence[Any]) -> tuple[list[list[Label]], list[Label]]:
    """Each operand's labels and the output's, from subscripts like 'bij,bjk->bik'."""
    def bad(message: str) -> GlueError:
        return _fail("einsum", f"subscripts {subscripts!r}: {message}", *ops)

    lhs, arrow, rhs = subscripts.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise bad(f"name {len(terms)} operands but {len(ops)} were given")
    labels: list[list[Label]] = []
    for term, op in zip(terms, ops):
        head, dots, tail = term.partition("...")
        if not _are_letters(head + tail):
            raise bad(f"{term!r} is not letters with at most one '...'")
        extra = type_of(op).ndim - len(head) - len(tail)
        if extra < 0 or (extra and not dots):
            raise bad(f"{term!r} does not fit an operand of rank {type_of(op).ndim}")
        labels.append(list(head) + list(range(-extra, 0)) + list(tail))
    extra = builtins.max((builtins.sum(isinstance(l, int) for l in ls) for ls in labels), default=0)
    ellipsis: list[Label] = list(range(-extra, 0))
    letters = [l for ls in labels for l in ls if isinstance(l, str)]
    if arrow:
        head, dots, tail = rhs.partition("...")
        if ellipsis and not dots:
            raise bad("the output needs '...' for the operands' ellipsis dimensions")
        output: list[Label] = list(head) + ellipsis + list(tail)
        unknown = [l for l in output if isinstance(l, str) and l not in letters]
        if unknown or len(set(output)) != len(output) or not _are_letters(head + tail):
            raise bad("the output must name distinct labels of the operands")
    else:
        output = ellipsis + sorted(l for l in set(letters) if letters.count(l) == 1)
    return labels, output


def einsum(subscripts: str, *operands: Any, precision: Any = None, preferred_element_type: Any = None) -> Any:
    """Einstein summation over explicit or implicit subscripts, as pairwise dot_generals
    (`precision` and `preferred_element_type` as for matmul).

    Repeated labels within one operand (diagonals) are not supported.
    """
    params = _precision(precision, preferred_element_type)
    ops = _promote(operands, fn="einsum")
    labels, output = _einsum_labels(subscripts, ops)
    sizes: dict[Label, int] = {}
    for ls, op in zip(labels, ops):
        if len(set(ls)) != len(ls):
            raise _fail("einsum", f"a label repeats within one operand of {subscripts!r} "
                                  "(diagonals are not supported)", *ops)
        for label, n in zip(ls, _shape(op)):
            old = sizes.setdefault(label, n)
            if old != n and not (isinstance(label, int) and 1 in (old, n)):
                raise _fail("einsum", f"label {label!r} of {subscripts!r} has sizes {old} and {n}", *ops)
            sizes[label] = builtins.max(old, n)
    terms = []
    for i, (op, ls) in enumerate(zip(ops, labels)):
        op = broadcast_to(op, tuple(sizes[l] for l in ls))  # ellipsis dims of size 1 stretch
        elsewhere = set(output).union(*(other for j, other in enumerate(labels) if j != i))
        alone = tuple(d for d, l in enumerate(ls) if l not in elsewhere)
        if alone:
            op, ls = bind("reduce_sum", op, axes=alone), [l for l in ls if l in elsewhere]
        terms.append((op, ls))
    while len(terms) > 1:
        (a, la), (b, lb), rest = terms[0], terms[1], terms[2:]
        needed = set(output).union(*(ls for _, ls in rest))
        shared = [l for l in la if l in lb]
        batch = [l for l in shared if l in needed]
        summed = [l for l in shared if l not in needed]
        out = bind("dot_general", a, b, dimension_numbers=(
            (tuple(la.index(l) for l in summed), tuple(lb.index(l) for l in summed)),
            (tuple(la.index(l) for l in batch), tuple(lb.index(l) for l in batch))), **params)
        terms = [(out, batch + [l for l in la if l not in lb] + [l for l in lb if l not in la])] + rest
    result, ls = terms[0]
    return transpose(result, [ls.index(l) for l in output])


# --- indexing -------------------------------------------------------------------------------

def _integer_indices(fn: str, x: Any, indices: Any) -> Any:
    """`indices` as an integer array (a glue value or NumPy data); masks and floats are errors."""
    if not hasattr(indices, "aval"):
        indices = np.asarray(indices)
        if indices.dtype.kind not in "biu":
            raise _fail(fn, f"only integers, slices, None, ... and integer arrays are valid "
                            f"indices, not {indices.dtype}", x, error=GlueIndexError)
    kind = _dtype_of(indices).kind
    if kind == "bool":
        raise _fail(fn, "boolean mask indexing gives a data-dependent shape; "
                        "use gnp.where(mask, x, 0) (or a static index) instead", x, error=GlueIndexError)
    if kind != "int":
        raise _fail(fn, f"index arrays must be integers, not {_dtype_of(indices)}", x, indices,
                    error=GlueIndexError)
    return indices


def _index_item(x: Any, item: Any) -> Any:
    """One entry of an index: None, Ellipsis, a slice, a Python int, or an integer array."""
    if item is None or item is Ellipsis or isinstance(item, slice):
        return item
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        return int(item)
    return _integer_indices("getitem", x, item)


def _normalized_indices(fn: str, x: Any, idx: Any, n: int, axis: int) -> Any:
    """Indices into an axis of size n with negatives counted from the end; concrete ones are
    checked against the bounds."""
    if isinstance(idx, Tracer):
        return where(less(idx, 0), add(idx, n), idx)
    values = np.asarray(idx)
    if values.size and (values.min() < -n or values.max() >= n):
        bad = values[(values < -n) | (values >= n)].flat[0]
        raise _fail(fn, f"index {bad} is out of bounds for axis {axis} with size {n}", x,
                    error=GlueIndexError)
    return np.where(values < 0, values + n, values).astype(np.int32)


def _basic_index(x: Any, items: list[Any]) -> Any:
    """Apply the ints and slices of `items` (one per axis); ints keep their axis, of size 1."""
    shape = _shape(x)
    bounds, reversed_axes = [], []
    for axis, (n, item) in enumerate(zip(shape, items)):
        lo, hi, step = 0, n, 1
        if isinstance(item, int):
            lo = int(_normalized_indices("getitem", x, item, n, axis))
            hi = lo + 1
        elif isinstance(item, slice):
            r = range(n)[item]
            if len(r) == 0:
                hi = 0
            elif r.step > 0 or len(r) == 1:
                lo, hi, step = r[0], r[-1] + 1, builtins.max(r.step, 1)
            else:
                reversed_axes.append((axis, r))
        bounds.append((lo, hi, step))
    if bounds != [(0, n, 1) for n in shape]:
        start, limit, strides = zip(*bounds)
        x = bind("slice", x, start=start, limit=limit, strides=strides)
    for axis, r in reversed_axes:  # a negative step reads through descending indices
        x = bind("gather", x, _affine_iota(len(r), r.start, r.step, dt.int32), axis=axis, batch_dims=0)
    return x


def _advanced_index(x: Any, items: list[Any]) -> Any:
    """Integer-array indexing (one array or int per axis in `axes`, slices elsewhere)."""
    shape = _shape(x)
    axes = [a for a, item in enumerate(items) if not isinstance(item, slice)]
    idxs = [_normalized_indices("getitem", x, items[a], shape[a], a) for a in axes]
    if _broadcast_shape(*(_shape(i) for i in idxs)) is None:
        raise _fail("getitem", "index arrays cannot be broadcast together", x, *idxs, error=GlueIndexError)
    if len(axes) == 1:
        return bind("gather", x, idxs[0], axis=axes[0], batch_dims=0)
    if axes != list(range(axes[0], axes[0] + len(axes))):
        # NumPy puts the indexed dims first when slices separate the index arrays.
        x = transpose(x, axes + [a for a in range(len(shape)) if a not in axes])
        shape, axes = _shape(x), list(range(len(axes)))
    first, sizes = axes[0], [shape[a] for a in axes]
    merged = reshape(x, shape[:first] + (math.prod(sizes),) + shape[first + len(axes):])
    # One gather over the merged axes; traced indices are clamped per axis first, so a bad
    # index cannot wander into a neighbouring row.
    idxs = [clip(i, 0, n - 1) if isinstance(i, Tracer) else i for i, n in zip(idxs, sizes)]
    flat = idxs[0]
    for idx, n in zip(idxs[1:], sizes[1:]):
        flat = add(multiply(flat, n), idx)
    return bind("gather", merged, flat, axis=first, batch_dims=0)


def getitem(x: Any, index: Any) -> Any:
    """`x[index]` with NumPy semantics: ints, slices (any step), None, Ellipsis and integer
    arrays. Boolean masks raise GlueIndexError (their result shape depends on the data)."""
    x = asarray(x)
    items = [_index_item(x, i) for i in (index if isinstance(index, tuple) else (index,))]
    ellipses = [k for k, i in enumerate(items) if i is Ellipsis]
    if len(ellipses) > 1:
        raise _fail("getitem", "an index can only have a single ellipsis ('...')", x, error=GlueIndexError)
    ndim = type_of(x).ndim
    used = builtins.sum(1 for i in items if i is not None and i is not Ellipsis)
    if used > ndim:
        raise _fail("getitem", f"too many indices ({used}) for an array of rank {ndim}", x,
                    error=GlueIndexError)
    at = ellipses[0] if ellipses else len(items)
    items = items[:at] + [slice(None)] * (ndim - used) + items[at + 1:]
    if builtins.any(i is None for i in items):  # new axes become size-1 axes taken whole
        dims = iter(_shape(x))
        x = reshape(x, tuple(1 if i is None else next(dims) for i in items))
        items = [slice(None) if i is None else i for i in items]
    if builtins.all(isinstance(i, (int, slice)) for i in items):
        x = _basic_index(x, items)
        return reshape(x, tuple(n for n, i in zip(_shape(x), items) if not isinstance(i, int)))
    # With index arrays present NumPy treats ints as 0-d index arrays.
    items = [np.int32(i) if isinstance(i, int) else i for i in items]
    x = _basic_index(x, [i if isinstance(i, slice) else slice(None) for i in items])
    return _advanced_index(x, items)


def _fill_value(x: Any, fill_value: Any) -> Any:
    """What an out-of-range index reads in mode="fill": `fill_value`, else JAX's default (NaN
    for floats, the most negative value for signed integers, the largest for unsigned ones,
    True for booleans)."""
    d = _dtype_of(x)
    if fill_value is not None:
        return astype(fill_value, d)
    if d.is_float:
        return astype(nan, d)
    if d == dt.bool_:
        return astype(True, d)
    info = np.iinfo(d.numpy)
    return astype(int(info.min if info.min < 0 else info.max), d)


def _gather_mode(fn: str, x: Any, idx: Any, n: int, axis: int, mode: str | None
                 ) -> tuple[Any, Any]:
    """(indices wrapped once from the end, and where they are in range: None when all are or
    mode is "clip", whose indices the gather clamps)."""
    if mode not in (None, "fill", "clip"):
        raise _fail(fn, f'mode must be "fill" (the default) or "clip", not {mode!r}', x)
    if not isinstance(idx, Tracer):
        values = np.asarray(idx, dtype=np.int64)
        values = np.where(values < 0, values + n, values)
        inside = (values >= 0) & (values < n)
        idx = np.clip(values, 0, builtins.max(n - 1, 0)).astype(np.int32)
        return idx, (None if mode == "clip" or inside.all() else inside)
    idx = where(less(idx, 0), add(idx, n), idx)
    return idx, (None if mode == "clip" else logical_and(greater_equal(idx, 0), less(idx, n)))


def take(x: Any, indices: Any, axis: int | None = None, mode: str | None = None,
         fill_value: Any = None) -> Any:
    """Elements of `x` at `indices` along `axis` (flattened when None). Negative indices count
    from the end; others out of range read `fill_value` (mode="fill", JAX's default: NaN for
    floats) or are clamped (mode="clip")."""
    x = asarray(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis("take", x, axis)
    indices = _integer_indices("take", x, indices)
    idx, inside = _gather_mode("take", x, indices, _shape(x)[axis], axis, mode)
    out = bind("gather", x, idx, axis=axis, batch_dims=0)
    if inside is None:
        return out
    at = tuple(range(axis, axis + type_of(inside).ndim))
    mask = bind("broadcast_in_dim", inside, shape=_shape(out), dims=at)
    return bind("select", mask, out, full_like(out, _fill_value(x, fill_value)))


def take_along_axis(x: Any, indices: Any, axis: int, mode: str | None = None,
                    fill_value: Any = None) -> Any:
    """out[..., i, ...] = x[..., indices[..., i, ...], ...] along `axis`; other axes broadcast.
    Out-of-range indices behave as in `take`."""
    x = asarray(x)
    indices = _integer_indices("take_along_axis", x, indices)
    if type_of(indices).ndim != type_of(x).ndim:
        raise _fail("take_along_axis", "indices and x must have the same rank", x, indices)
    axis = _axis("take_along_axis", x, axis)
    n = _shape(x)[axis]
    idx, inside = _gather_mode("take_along_axis", x, indices, n, axis, mode)
    drop = lambda s: s[:axis] + s[axis + 1:]  # noqa: E731
    batch = _broadcast_shape(drop(_shape(x)), drop(_shape(idx)))
    if batch is None:
        raise _fail("take_along_axis", "indices and x do not broadcast outside the axis", x, indices)
    put = lambda s, k: s[:axis] + (k,) + s[axis:]  # noqa: E731
    out_shape = put(batch, _shape(idx)[axis])
    x = moveaxis(broadcast_to(x, put(batch, n)), axis, -1)
    idx = moveaxis(broadcast_to(idx, out_shape), axis, -1)
    last = len(batch)
    out = moveaxis(bind("gather", x, idx, axis=last, batch_dims=last), -1, axis)
    if inside is None:
        return out
    return bind("select", broadcast_to(inside, out_shape), out, full_like(out, _fill_value(x, fill_value)))
