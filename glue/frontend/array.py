"""`glue.Array`: a concrete result of a glue computation, interoperable with NumPy."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.frontend.operators import ArrayOperators
from glue.ir import TensorType
from glue.ir import dtypes as dt


class Array(ArrayOperators):
    """An array computed by glue. `np.asarray(a)` gives its values (waiting for them if needed).

    The values live in a NumPy array, or in a device buffer (anything with `shape`, a glue
    `dtype`, `to_host()` and `block_until_ready()`, such as the cuda backend's `DeviceBuffer`)
    that the first read copies to the host.
    """

    __slots__ = ("_value", "_device", "aval")
    __array_priority__ = 100

    def __init__(self, value: Any, aval: TensorType | None = None):
        """`aval`, when the caller knows it, must be the value's type (backends pass their
        programs' output types, which makes the next call's signature check cheap)."""
        if isinstance(value, np.ndarray):
            self._value, self._device = value, None
            self.aval = aval or TensorType(tuple(value.shape), dt.from_numpy(value.dtype))
        else:
            self._value, self._device = None, value
            self.aval = aval or TensorType(tuple(value.shape), value.dtype)

    @classmethod
    def of_buffers(cls, buffers: Sequence[Any], picks: Sequence[tuple[int, TensorType]]) -> list["Array"]:
        """`[Array(buffers[i], aval) for i, aval in picks]` for device buffers of those types,
        without the checks: a backend's call path builds one per output, on every call."""
        out, new = [], cls.__new__
        for i, aval in picks:
            array = new(cls)
            array._value = None
            array._device = buffers[i]
            array.aval = aval
            out.append(array)
        return out

    @property
    def device_buffer(self) -> Any:
        """The device buffer holding the values, or None for a host array."""
        return self._device

    def _host(self) -> np.ndarray:
        if self._value is None:
            self._value = self._device.to_host()
        return self._value

    def block_until_ready(self) -> "Array":
        if self._device is not None:
            self._device.block_until_ready()
        return self

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self._host() if dtype is None else self._host().astype(dtype, copy=False)
        return value.copy() if copy else value

    def __repr__(self) -> str:
        return f"glue.Array({np.array2string(self._host(), separator=', ')}, dtype={self.aval.dtype})"

    def item(self) -> Any:
        return self._host().item()

    def tolist(self) -> Any:
        return self._host().tolist()

    def __bool__(self) -> bool:
        return bool(self._host())

    def __int__(self) -> int:
        return int(self._host())

    def __float__(self) -> float:
        return float(self._host())

    def __index__(self) -> int:
        return self._host().__index__()

    def __hash__(self) -> int:
        return id(self)
