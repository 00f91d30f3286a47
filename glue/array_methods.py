"""Python operators and NumPy-style methods of Tracers and concrete `glue.Array`s, installed
on both classes when `glue.numpy` loads (as JAX's array_methods does), so the frontend never
imports the API built on top of it. Each forwards to `glue.numpy`, so traced and eager code
follow the same NumPy semantics.
"""
from __future__ import annotations

from typing import Any

import glue.numpy as gnp
from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.array import Array
from glue.frontend.tracing import Tracer
from glue.lax.updates import IndexUpdateHelper


def _binary(name: str, reflected: bool = False):
    fn = getattr(gnp, name)

    def method(self, other):
        return fn(other, self) if reflected else fn(self, other)
    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


def _reduction(name: str):
    fn = getattr(gnp, name)

    def method(self, axis=None, keepdims=False):
        return fn(self, axis=axis, keepdims=keepdims)
    method.__name__ = name
    return method


class ArrayMethods:
    """The methods `install` copies onto Array and Tracer; `aval` is all they read."""

    @property
    def T(self):
        return gnp.transpose(self)

    def __len__(self) -> int:
        if not self.aval.shape:
            raise GlueTypeError(f"len() of a 0-d array ({self.aval}) "
                                f"{describe_location(user_frame_location())}")
        return self.aval.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: Any):
        return gnp.getitem(self, index)

    @property
    def at(self) -> IndexUpdateHelper:
        """Functional updates: `x.at[index].set(v)` and friends (glue.lax.updates)."""
        return IndexUpdateHelper(self)

    def __neg__(self):
        return gnp.negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return gnp.abs(self)

    def __invert__(self):
        return gnp.invert(self)

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("subtract"), _binary("subtract", True)
    __mul__, __rmul__ = _binary("multiply"), _binary("multiply", True)
    __truediv__, __rtruediv__ = _binary("true_divide"), _binary("true_divide", True)
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _binary("floor_divide", True)
    __mod__, __rmod__ = _binary("remainder"), _binary("remainder", True)
    __pow__, __rpow__ = _binary("power"), _binary("power", True)
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__ = _binary("bitwise_and"), _binary("bitwise_and", True)
    __or__, __ror__ = _binary("bitwise_or"), _binary("bitwise_or", True)
    __xor__, __rxor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True)
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")

    def reshape(self, *shape):
        return gnp.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def transpose(self, *axes):
        return gnp.transpose(self, (axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes) or None)

    def astype(self, dtype):
        return gnp.astype(self, dtype)

    sum, mean, max, min = _reduction("sum"), _reduction("mean"), _reduction("max"), _reduction("min")
    prod, var, std = _reduction("prod"), _reduction("var"), _reduction("std")
    argmax, argmin = _reduction("argmax"), _reduction("argmin")

    def squeeze(self, axis=None):
        return gnp.squeeze(self, axis=axis)

    def swapaxes(self, a: int, b: int):
        return gnp.swapaxes(self, a, b)


# What a class body defines besides its members.
_CLASS_ATTRIBUTES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__",
                     "__static_attributes__"}


def install(*classes: type) -> None:
    """Give `classes` every operator and method of ArrayMethods."""
    for name, value in vars(ArrayMethods).items():
        if name not in _CLASS_ATTRIBUTES:
            for cls in classes:
                setattr(cls, name, value)


install(Array, Tracer)
