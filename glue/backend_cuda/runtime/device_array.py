"""`DeviceBuffer`: the device storage behind a `glue.Array` on a GPU.

A buffer has a shape, a glue dtype, a block from the caching allocator, the stream it belongs to
and a completion event, recorded after the last queued work that writes it. Everything about it
is asynchronous: uploading returns once the data is staged, kernels that write it call
`mark_written`, and only `to_host()` / `block_until_ready()` make the host wait.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from glue import profiler
from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.allocator import Block
from glue.backend_cuda.runtime.context import get_context
from glue.backend_cuda.runtime.stream import Event, Stream
from glue.backend_cuda.runtime.transfer import download, upload
from glue.ir import dtypes as dt

_glue_dtype = lru_cache(maxsize=None)(dt.from_numpy)  # the uncached lookup scans every dtype


class _Shared:
    """An allocation several buffers live in; it goes back when the last of them dies."""

    __slots__ = ("allocator", "block")

    def __init__(self, allocator: Any, block: Block):
        self.allocator, self.block = allocator, block

    def __del__(self) -> None:
        self.allocator.free(self.block)


class DeviceBuffer:
    """A C-contiguous array in device memory.

    `ptr` is the device address (kernels take the buffer itself for a pointer parameter), `stream`
    the stream its work is ordered on, `event` the point after its last queued write.
    """

    __slots__ = ("shape", "dtype", "nbytes", "ptr", "stream", "event", "_written_on", "_block",
                 "_allocator", "_shared")

    def __init__(self, shape: Sequence[int], dtype: Any, stream: Stream | None = None):
        """Uninitialised device memory for an array of `shape` and `dtype`."""
        stream = stream or get_context().stream
        self.shape = tuple(int(d) for d in shape)
        self.dtype = _glue_dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.stream = stream
        self._allocator = stream.ctx.allocator
        self._block: Block = self._allocator.allocate(self.nbytes, stream)
        self._shared: _Shared | None = None
        self.ptr = self._block.ptr
        self.event: Event | None = None
        self._written_on: Stream | None = None

    @classmethod
    def carve(cls, layout: Sequence[tuple[tuple[int, ...], dt.DType, int]], total: int,
              stream: Stream) -> list[DeviceBuffer]:
        """Buffers of the given (shape, glue dtype, byte offset) in one allocation of `total`
        bytes, which goes back to the allocator when the last of them dies: one allocator call
        for all the outputs of a program call, at addresses that repeat from call to call."""
        allocator = stream.ctx.allocator
        shared = _Shared(allocator, allocator.allocate(total, stream))
        out = []
        for shape, dtype, offset in layout:
            buf = cls.__new__(cls)
            buf.shape, buf.dtype, buf.stream = shape, dtype, stream
            buf.nbytes = math.prod(shape) * dtype.itemsize
            buf._allocator, buf._block, buf._shared = allocator, shared.block, shared
            buf.ptr = shared.block.ptr + offset
            buf.event = buf._written_on = None
            out.append(buf)
        return out

    @classmethod
    def from_numpy(cls, array: Any, stream: Stream | None = None) -> DeviceBuffer:
        """Upload a NumPy array (converted to its glue dtype); returns before the copy finishes,
        but `array` may be changed at once."""
        array = np.asarray(array)
        dtype = _glue_dtype(array.dtype)
        buf = cls(array.shape, dtype, stream or get_context().copy_stream)
        upload(buf.ptr, np.ascontiguousarray(array, dtype=dtype.numpy), buf.stream)
        buf.mark_written()
        return buf

    def __del__(self) -> None:
        try:
            if self._shared is None:
                self._allocator.free(self._block)
        except AttributeError:  # __init__ failed before allocating
            pass

    def mark_written(self, stream: Stream | None = None, event: Event | None = None) -> None:
        """Record that work just queued on `stream` (default: the buffer's) writes this buffer;
        `event`, when given, was recorded on that stream right after that work (one event can
        serve every output of a call)."""
        stream = stream or self.stream
        self.event = event or Event(stream.ctx).record(stream)
        self._written_on = stream

    def prepare_for(self, stream: Stream) -> None:
        """Before queuing work on `stream` that uses this buffer: order it after the buffer's last
        write, and keep the memory from reuse until that work is done."""
        if self._written_on is not None and self._written_on is not stream:
            stream.wait(self.event)
        if stream is not self.stream:
            self._allocator.record_use(self._block, stream)

    def is_ready(self) -> bool:
        """True when every queued write of this buffer has finished."""
        return self.event is None or self.event.query()

    def block_until_ready(self) -> DeviceBuffer:
        if self.event is not None:
            with profiler.span("wait", "block_until_ready"):
                self.event.synchronize()
        return self

    def to_host(self) -> np.ndarray:
        """A new NumPy array with the values, once every queued write has finished. The copy runs
        on the context's readback stream, so it waits for this buffer's writes only, not for work
        queued after them."""
        out = np.empty(self.shape, self.dtype.numpy)
        readback = self.stream.ctx.readback_stream
        if self._written_on is not None:
            readback.wait(self.event)
        with profiler.span("copy", f"download {self.dtype}{list(self.shape)}"):
            download(out, self.ptr, readback)
        return out

    def fill_bytes(self, value: int) -> DeviceBuffer:
        """Set every byte to `value` (queued on the buffer's stream): 0xFF poisons floats as NaN."""
        drv.check(drv.load().cuMemsetD8Async(self.ptr, value, self.nbytes, self.stream.handle),
                  "cuMemsetD8Async")
        self.mark_written()
        return self

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.dtype}{list(self.shape)} at 0x{self.ptr:x} on {self.stream})"
