"""The Python operators and array methods of glue arrays (concrete and traced), as JAX has them.

`install(Array, Tracer)` puts them on both classes (glue.numpy does, when it loads).

Operators take arrays and scalars only, as in JAX: any other operand makes the operator return
NotImplemented, so Python decides (`x == None` is False, `x != None` True, `x < None` a
TypeError), and a list, tuple, dict or set beside `==`, `!=` or `+`, or a string, bytes, complex
number or None beside an arithmetic operator, is a GlueTypeError (a TypeError) rather than being
read as an array.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.array import Array
from glue.frontend.tracing import Tracer
from glue.numpy import _arrays, _core, _scans, _sorting

_CONTAINERS = (dict, list, set, tuple)
# Operands no numeric operator takes from any library: an arithmetic operator meeting one is a
# GlueTypeError naming the line (a TypeError, as Python's own would be).
_NOT_NUMBERS = (str, bytes, complex, type(None))


def _is_operand(value: Any) -> bool:
    """Values an operator accepts: arrays (glue, traced, NumPy) and scalars."""
    return isinstance(value, (int, float, np.generic, np.ndarray, Array, Tracer))


def _operator(stem: str, fn: Callable[[Any, Any], Any], symbol: str, reflected: bool = False,
              rejects: tuple[type, ...] = ()) -> Callable[[Any, Any], Any]:
    def method(self: Any, other: Any) -> Any:
        if not _is_operand(other):
            if type(other) in rejects:
                names = (type(other).__name__, type(self).__name__) if reflected else \
                    (type(self).__name__, type(other).__name__)
                shown = repr(other) if len(repr(other)) <= 40 else repr(other)[:37] + "..."
                raise GlueTypeError(f"unsupported operand types for {symbol}: {names[0]!r} and "
                                    f"{names[1]!r} ({shown}) {describe_location(user_frame_location())}")
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    method.__name__ = f"__{'r' if reflected else ''}{stem}__"
    return method


_BINARY = {  # dunder stem: (glue.numpy function, symbol)
    "add": (_core.add, "+"), "sub": (_core.subtract, "-"), "mul": (_core.multiply, "*"),
    "truediv": (_core.true_divide, "/"), "floordiv": (_core.floor_divide, "//"),
    "mod": (_core.remainder, "%"), "pow": (_core.power, "**"), "matmul": (_core.matmul, "@"),
    "and": (_core.bitwise_and, "&"), "or": (_core.bitwise_or, "|"), "xor": (_core.bitwise_xor, "^"),
}
_COMPARISONS = {"lt": _core.less, "le": _core.less_equal, "gt": _core.greater,
                "ge": _core.greater_equal, "eq": _core.equal, "ne": _core.not_equal}
_SYMBOLS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _forward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`x.name(...)` as `fn(x, ...)`."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)
    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


def _format(self: Any, spec: str) -> str:
    """f-strings of a concrete array format its values (a 0-d array as its scalar); a traced
    array has none to format."""
    values = np.asarray(self)
    return format(values[()] if values.ndim == 0 else values, spec)


class _ShapeMethods:
    """Indexing, unary operators and shape methods (the members `install` copies)."""

    @property
    def T(self) -> Any:
        return _core.transpose(self)

    def __len__(self) -> int:
        if not self.aval.shape:
            raise GlueTypeError(f"len() of a 0-d array ({self.aval}) {describe_location(user_frame_location())}")
        return self.aval.shape[0]

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: Any) -> Any:
        return _core.getitem(self, index)

    @property
    def at(self) -> Any:
        """Functional updates: `x.at[index].set(v)` and friends (glue.lax.updates)."""
        from glue.lax.updates import IndexUpdateHelper  # glue.lax builds on glue.numpy: imported at use

        return IndexUpdateHelper(self)

    def __neg__(self) -> Any:
        return _core.negative(self)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return _core.abs(self)

    def __invert__(self) -> Any:
        return _core.invert(self)

    def reshape(self, *shape: Any, **kwargs: Any) -> Any:
        return _core.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape,
                             **kwargs)

    def transpose(self, *axes: Any) -> Any:
        chosen = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return _core.transpose(self, chosen or None)

    def astype(self, dtype: Any) -> Any:
        return _core.astype(self, dtype)

    def squeeze(self, axis: Any = None) -> Any:
        return _core.squeeze(self, axis=axis)

    def swapaxes(self, a: int, b: int) -> Any:
        return _core.swapaxes(self, a, b)


# What a class body defines besides its members.
_CLASS_ATTRIBUTES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__",
                     "__static_attributes__"}


def _copy(self: Any) -> Any:
    """A concrete array's values in a new buffer; a traced one as it is (arrays are immutable)."""
    return self if isinstance(self, Tracer) else _core.asarray(np.array(self))


_METHODS = {
    "ravel": _core.ravel, "flatten": _core.ravel, "clip": _core.clip, "dot": _core.dot,
    "sum": _core.sum, "prod": _core.prod, "mean": _core.mean, "var": _core.var, "std": _core.std,
    "max": _core.max, "min": _core.min, "any": _core.any, "all": _core.all,
    "argmax": _core.argmax, "argmin": _core.argmin, "round": _core.round,
    "cumsum": _scans.cumsum, "cumprod": _scans.cumprod, "repeat": _arrays.repeat,
    "sort": _sorting.sort, "argsort": _sorting.argsort,
}


def install(*classes: type) -> None:
    """Put the operators and methods on each of `classes`."""
    for cls in classes:
        for name, member in vars(_ShapeMethods).items():
            if name not in _CLASS_ATTRIBUTES:
                setattr(cls, name, member)
        for stem, (fn, symbol) in _BINARY.items():
            rejects = _NOT_NUMBERS + ((tuple, list) if stem == "add" else ())
            setattr(cls, f"__{stem}__", _operator(stem, fn, symbol, rejects=rejects))
            setattr(cls, f"__r{stem}__", _operator(stem, fn, symbol, reflected=True, rejects=rejects))
        for stem, fn in _COMPARISONS.items():
            rejects = _CONTAINERS if stem in ("eq", "ne") else ()
            setattr(cls, f"__{stem}__", _operator(stem, fn, _SYMBOLS[stem], rejects=rejects))
        for name, fn in _METHODS.items():
            setattr(cls, name, _forward(fn))
        cls.copy = _copy
        cls.__format__ = _format
