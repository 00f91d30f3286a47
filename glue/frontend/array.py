"""`glue.Array`: a concrete result of a glue computation, interoperable with NumPy.

An Array holds a backend buffer: a host NumPy array, or a device buffer (anything with `shape`,
a glue `dtype`, `to_host()` and `block_until_ready()`, such as the cuda backend's
`DeviceBuffer`) that the first read copies to the host. Backends deal only in buffers; the
frontend wraps their results (`wrap_results`) and unwraps arguments (`buffer`). An Array
donated to a jitted call is deleted: its buffer now belongs to the call's outputs, and using
it again raises a GlueError that says where it was donated. Operators and NumPy-style methods
are installed by `glue.numpy` (glue/numpy/_methods.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.errors import GlueError, describe_location, user_frame_location
from glue.ir import TensorType
from glue.ir import dtypes as dt


class Array:
    """An array computed by glue. `np.asarray(a)` gives its values (waiting for them if needed)."""

    # (wrap_results and jit's lean call make Arrays without __init__, setting every slot)
    __slots__ = ("_value", "_device", "aval", "_donated_to")
    __array_priority__ = 100

    def __init__(self, value: Any, aval: TensorType | None = None):
        """`aval`, when the caller knows it, must be the value's type (a jitted call passes its
        program's output types, which makes the next call's signature check cheap)."""
        self._donated_to = None
        if isinstance(value, np.ndarray):
            if aval is None:  # a 64-bit host value narrows unless x64 is on, as jnp.asarray's
                dtype = dt.canonical(dt.from_numpy(value.dtype))
                value = value if dtype.numpy == value.dtype else value.astype(dtype.numpy)
                aval = TensorType(tuple(value.shape), dtype)
            self._value, self._device = value, None
            self.aval = aval
        else:
            self._value, self._device = None, value
            self.aval = aval or TensorType(tuple(value.shape), value.dtype)

    @property
    def device_buffer(self) -> Any:
        """The device buffer holding the values, or None for a host array."""
        self._check_alive()
        return self._device

    @property
    def buffer(self) -> Any:
        """What a backend gets for this Array: its device buffer, else its host array."""
        device = self._device
        if device is not None:
            return device
        if self._value is None:
            self._check_alive()
        return self._value

    def delete(self, donated_to: str) -> None:
        """Give up the buffer (it was donated to `donated_to`); later use raises."""
        self._value = self._device = None
        self._donated_to = donated_to

    @property
    def is_deleted(self) -> bool:
        return self._donated_to is not None

    def _check_alive(self) -> None:
        if self._donated_to is not None:
            raise GlueError(f"this glue.Array ({self.aval}) was donated to {self._donated_to} and deleted; "
                            "use the call's result instead, or do not donate it (donate_argnums) "
                            f"{describe_location(user_frame_location())}")

    def _host(self) -> np.ndarray:
        if self._value is None:
            self._check_alive()
            self._value = self._device.to_host()
        return self._value

    def block_until_ready(self) -> "Array":
        self._check_alive()
        if self._device is not None:
            self._device.block_until_ready()
        return self

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self._host() if dtype is None else self._host().astype(dtype, copy=False)
        return value.copy() if copy else value

    def __repr__(self) -> str:
        if self.is_deleted:
            return f"glue.Array(<deleted: donated to {self._donated_to}>, dtype={self.aval.dtype})"
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

    # aval-level facts; operators and methods come from glue.numpy
    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype.numpy

    @property
    def ndim(self) -> int:
        return self.aval.ndim

    @property
    def size(self) -> int:
        return self.aval.size


# An Array's device buffer (None: a host Array, or a deleted one), read without the property's
# checks; TypeError for anything but an Array. Mapped over a call's leaves, it reads their
# buffers a list at a time.
device_buffer_of = Array._device.__get__


def buffers_of(leaves: Sequence[Any]) -> list[Any]:
    """`[a.buffer if a is an Array else a for a in leaves]` for a jitted call's arguments. Where
    every leaf is a device Array (the usual call), their buffers are read a list at a time."""
    try:
        buffers = list(map(device_buffer_of, leaves))
    except TypeError:  # a leaf that is not an Array
        buffers = [None]
    if None not in buffers:
        return buffers
    return [(a._device if a._device is not None else a.buffer) if a.__class__ is Array else a for a in leaves]


def wrap_results(buffers: Sequence[Any], avals: Sequence[TensorType]) -> list[Array]:
    """`[Array(b, t) for b, t in zip(buffers, avals)]` for the buffers a backend returned, of
    those very types, without the checks: a jitted call builds one per output, every call."""
    out, new = [], Array.__new__
    for buffer, aval in zip(buffers, avals):
        array = new(Array)
        if buffer.__class__ is np.ndarray:
            array._value, array._device = buffer, None
        else:
            array._value, array._device = None, buffer
        array.aval = aval
        array._donated_to = None
        out.append(array)
    return out


def delete_all(arrays: Sequence[Array], donated_to: Sequence[str]) -> None:
    """`array.delete(to)` for each of `arrays` and what it was donated to, in one loop."""
    for array, to in zip(arrays, donated_to):
        array._value = array._device = None
        array._donated_to = to
