"""`import glue.numpy as gnp`: the NumPy-style surface, composed from IR primitives.

Everything here works on NumPy arrays, Python scalars, `glue.Array`s and Tracers alike:
inside a trace it records primitives, outside it evaluates them eagerly. Dtype promotion is
JAX's (Python scalars are weakly typed); default dtypes are int32 and float32.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.tracing import Tracer, bind, type_of
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType

float16, bfloat16, float32, float64 = (d.numpy for d in dt.FLOAT_DTYPES)
int32, int64, bool_ = dt.int32.numpy, dt.int64.numpy, dt.bool_.numpy
pi, e, inf, nan = np.pi, np.e, np.inf, np.nan


def _fail(fn: str, message: str, *arrays: Any) -> GlueTypeError:
    shapes = ", ".join(str(type_of(a)) for a in arrays)
    return GlueTypeError(f"{fn}({shapes}): {message} {describe_location(user_frame_location())}")


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _dtype_of(x: Any) -> DType:
    return type_of(x).dtype


def to_dtype(dtype: Any) -> DType:
    """The glue dtype for a NumPy dtype, a NumPy type, a dtype name or a glue DType."""
    return dt.from_numpy(dtype)


def result_dtype(*xs: Any) -> DType:
    """The dtype elementwise operands promote to (weak Python scalars follow the arrays)."""
    strong = [_dtype_of(x) for x in xs if not _is_weak(x)]
    if not strong:
        return max((dt.weak_scalar_dtype(x) for x in xs), key=lambda d: ("bool", "int", "float").index(d.kind))
    out = strong[0]
    for d in strong[1:]:
        out = dt.promote(out, d)
    for x in xs:
        if _is_weak(x):
            out = dt.promote_with_weak(out, x)
    return out


def astype(x: Any, dtype: Any) -> Any:
    target = to_dtype(dtype)
    if _is_weak(x):
        return target.numpy.type(x)
    return x if _dtype_of(x) == target else bind("convert_element_type", x, new_dtype=target)


def asarray(x: Any, dtype: Any = None) -> Any:
    """`x` as an array value glue can use (NumPy arrays and scalars are left to be captured)."""
    if isinstance(x, (list, tuple)):
        if any(isinstance(v, Tracer) for v in x):
            return stack([asarray(v) for v in x])
        x = np.asarray(x)
        if dtype is None and x.dtype == np.float64:
            x = x.astype(np.float32)
        if dtype is None and x.dtype == np.int64:
            x = x.astype(np.int32)
    if _is_weak(x):
        x = dt.weak_scalar_dtype(x).numpy.type(x)
    return x if dtype is None else astype(x, dtype)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise GlueTypeError(f"shapes {', '.join(map(str, shapes))} cannot be broadcast together "
                                f"{describe_location(user_frame_location())}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    shape = tuple(int(n) for n in shape)
    have = type_of(x).shape
    if have == shape:
        return x
    if len(have) > len(shape) or broadcast_shapes(have, shape) != shape:
        raise _fail("broadcast_to", f"cannot broadcast to {shape}", x)
    lead = len(shape) - len(have)
    keep = [i for i, n in enumerate(have) if n == shape[lead + i]]
    if len(keep) != len(have):  # size-1 axes that stretch are dropped before broadcasting
        x = bind("reshape", x, shape=tuple(have[i] for i in keep))
    return bind("broadcast_in_dim", x, shape=shape, dims=tuple(lead + i for i in keep))


def _elementwise_operands(fn: str, xs: Sequence[Any], dtype: DType | None = None) -> list[Any]:
    """Promote to one dtype and broadcast to one shape; scalars stay scalars (IR literals)."""
    dtype = dtype or result_dtype(*xs)
    xs = [astype(x, dtype) for x in xs]
    shapes = [type_of(x).shape for x in xs]
    try:
        shape = broadcast_shapes(*shapes)
    except GlueTypeError:
        raise _fail(fn, "operand shapes cannot be broadcast together", *xs) from None
    return [x if type_of(x).shape == shape or type_of(x).ndim == 0 else broadcast_to(x, shape)
            for x in xs]


def _apply_elementwise(fn: str, primitive: str, xs: Sequence[Any], dtype: DType | None = None,
                       **params: Any) -> Any:
    return bind(primitive, *_elementwise_operands(fn, xs, dtype), **params)


def _binary(name: str, primitive: str, float_only: bool = False):
    def fn(x: Any, y: Any) -> Any:
        dtype = result_dtype(x, y)
        if float_only and not dtype.is_float:
            dtype = dt.DEFAULT_FLOAT
        return _apply_elementwise(name, primitive, [x, y], dtype)
    fn.__name__ = name
    return fn


add = _binary("add", "add")
subtract = _binary("subtract", "sub")
multiply = _binary("multiply", "mul")
true_divide = divide = _binary("true_divide", "div", float_only=True)
maximum = _binary("maximum", "max")
minimum = _binary("minimum", "min")
bitwise_and = logical_and_ = _binary("bitwise_and", "and")
bitwise_or = _binary("bitwise_or", "or")
bitwise_xor = _binary("bitwise_xor", "xor")
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
round = _unary("round", "round", True)
