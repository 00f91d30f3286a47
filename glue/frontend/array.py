"""`glue.Array`: a concrete result of a glue computation, interoperable with NumPy."""
from __future__ import annotations

from typing import Any

import numpy as np

from glue.frontend.operators import ArrayOperators
from glue.ir import TensorType
from glue.ir import dtypes as dt


class Array(ArrayOperators):
    """An array computed by glue. `np.asarray(a)` gives its values (waiting for them if needed)."""

    __slots__ = ("_value", "aval")
    __array_priority__ = 100

    def __init__(self, value: np.ndarray):
        self._value = value
        self.aval = TensorType(tuple(value.shape), dt.from_numpy(value.dtype))

    def block_until_ready(self) -> "Array":
        return self

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self._value if dtype is None else self._value.astype(dtype)
        return value.copy() if copy else value

    def __repr__(self) -> str:
        return f"glue.Array({np.array2string(self._value, separator=', ')}, dtype={self.aval.dtype})"

    def item(self) -> Any:
        return self._value.item()

    def tolist(self) -> Any:
        return self._value.tolist()

    def __bool__(self) -> bool:
        return bool(self._value)

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)

    def __index__(self) -> int:
        return self._value.__index__()

    def __hash__(self) -> int:
        return id(self)
