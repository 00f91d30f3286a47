"""`DeviceBuffer`: the device storage behind a `glue.Array` on a GPU.

A buffer has a shape, a glue dtype, a block from the caching allocator (or a share of a block a
program call's outputs live in), the stream it belongs to and a completion event, recorded after
the last queued work that writes it: at once (`mark_written`) or when first needed
(`mark_pending`, which program calls use, so a call records no event). Everything about it is
asynchronous: uploading returns once the data is staged, and only `to_host()` /
`block_until_ready()` make the host wait.
"""
from __future__ import annotations

import math
from functools import lru_cache
from sys import getrefcount
from typing import Any, Callable, Sequence

import numpy as np

from glue import profiler
from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.allocator import Block, CachingAllocator
from glue.backend_cuda.runtime.context import get_context
from glue.backend_cuda.runtime.stream import Event, Stream, device_span
from glue.backend_cuda.runtime.transfer import download, upload
from glue.ir import dtypes as dt

_glue_dtype = lru_cache(maxsize=None)(dt.from_numpy)  # the uncached lookup scans every dtype
# What `map(getrefcount, a_list)` reads for an object only that list holds (measured, since what
# the interpreter counts for a call's argument changes between Python versions).
_ONLY_IN_A_LIST = list(map(getrefcount, [object()]))[0]


class _Owned:
    """A block freed when the last buffer holding this dies. (The finaliser lives here, not on
    the buffer, so that buffers in an `OutputSets` set die without running Python code.)"""

    __slots__ = ("allocator", "block")

    def __init__(self, allocator: Any, block: Block):
        self.allocator, self.block = allocator, block

    def __del__(self) -> None:
        self.allocator.free(self.block)


class OutputSets:
    """The outputs of one program's latest calls: sets of buffers carved from blocks of one size.

    A set that nothing outside holds any more (its Arrays were dropped) becomes the next call's
    outputs again: the same buffer objects at the same addresses, so a loop's call neither
    allocates nor runs a finaliser, and it replays the graphs captured for those addresses.
    Reuse on the set's own stream is ordered after the work that read it there; a block that
    other streams used goes back to the allocator instead, which waits for them. A set still
    held when KEEP newer ones exist is let go: its buffers free their block when the last dies.
    """

    __slots__ = ("allocator", "layout", "nbytes", "stream", "sets", "unheld", "on_release")
    KEEP = 4

    def __init__(self, allocator: Any, layout: Sequence[tuple[tuple[int, ...], dt.DType, int, int]],
                 nbytes: int, stream: Stream, on_release: Callable[[], None] | None = None):
        """`on_release` is called whenever a set leaves (its block may be freed): whoever keeps
        sets of its own (the executor's lean calls) forgets them."""
        self.allocator, self.layout, self.nbytes, self.stream = allocator, layout, nbytes, stream
        self.sets: list[list[DeviceBuffer]] = []
        self.unheld = [_ONLY_IN_A_LIST] * len(layout)  # `map(getrefcount, a_set)` when only the set holds its buffers
        self.on_release = on_release

    def take(self) -> list[DeviceBuffer]:
        """Buffers for a call's outputs, marked pending on the stream (the call writes them next)."""
        sets, stream = self.sets, self.stream
        for i, outputs in enumerate(sets):
            if list(map(getrefcount, outputs)) == self.unheld:
                if outputs[0]._block.other_streams:  # the allocator orders its reuse after those streams
                    del sets[i]
                    self._let_go(outputs)
                    break
                DeviceBuffer.mark_all_pending(outputs, stream)
                return outputs
        outputs = DeviceBuffer.carve(self.layout, self.allocator.allocate(self.nbytes, stream), stream)
        sets.append(outputs)
        if len(sets) > self.KEEP:
            self._let_go(sets.pop(0))
        return outputs

    def _let_go(self, outputs: list[DeviceBuffer]) -> None:
        if self.on_release is not None:
            self.on_release()
        if list(map(getrefcount, outputs)) == self.unheld:
            self.allocator.free(outputs[0]._block)
        else:
            owner = _Owned(self.allocator, outputs[0]._block)
            for buf in outputs:
                buf._holder = owner

    def close(self) -> None:
        """Let every set go (the program is gone)."""
        while self.sets:
            self._let_go(self.sets.pop())


class DeviceBuffer:
    """A C-contiguous array in device memory.

    `ptr` is the device address (kernels take the buffer itself for a pointer parameter), `stream`
    the stream its work is ordered on, `event` the point after its last queued write (None
    until recorded: see `ready_event`).
    """

    __slots__ = ("shape", "dtype", "nbytes", "ptr", "stream", "event", "written_on", "waited_on",
                 "_block", "_holder")

    def __init__(self, shape: Sequence[int], dtype: Any, stream: Stream | None = None):
        """Uninitialised device memory for an array of `shape` and `dtype`."""
        stream = stream or get_context().stream
        self.shape = tuple(int(d) for d in shape)
        self.dtype = _glue_dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.stream = stream
        allocator = stream.ctx.allocator
        self._block: Block = allocator.allocate(self.nbytes, stream)
        self._holder: _Owned | None = _Owned(allocator, self._block)
        self.ptr = self._block.ptr
        self.event: Event | None = None
        self.written_on: Stream | None = None
        # A stream ordered after the last write and known to the block: one `prepare_for`
        # prepared, or the buffer's own stream when the write was queued there.
        self.waited_on: Stream | None = None

    @classmethod
    def carve(cls, layout: Sequence[tuple[tuple[int, ...], dt.DType, int, int]], block: Block,
              stream: Stream) -> list[DeviceBuffer]:
        """Buffers of the given (shape, glue dtype, bytes, byte offset) in `block`, which their
        owner (an `OutputSets`) frees; marked pending on `stream`, which writes them next."""
        base, new = block.ptr, cls.__new__
        out = []
        for shape, dtype, nbytes, offset in layout:
            buf = new(cls)
            buf.shape = shape
            buf.dtype = dtype
            buf.nbytes = nbytes
            buf.ptr = base + offset
            buf._block = block
            buf._holder = None
            buf.stream = buf.written_on = buf.waited_on = stream
            buf.event = None
            out.append(buf)
        return out

    @classmethod
    def pieces(cls, layout: Sequence[tuple[tuple[int, ...], dt.DType, int, int]], nbytes: int,
               stream: Stream) -> list[DeviceBuffer]:
        """Buffers of the given (shape, glue dtype, bytes, byte offset) in a new block of `nbytes`
        of their own, which the last of them to die frees (`carve`'s, owned)."""
        allocator = stream.ctx.allocator
        block = allocator.allocate(nbytes, stream)
        out, owner = cls.carve(layout, block, stream), _Owned(allocator, block)
        for buf in out:
            buf._holder = owner
        return out

    @classmethod
    def from_numpy(cls, array: Any, stream: Stream | None = None) -> DeviceBuffer:
        """Upload a NumPy array (converted to its glue dtype); returns before the copy finishes,
        but `array` may be changed at once."""
        array = np.asarray(array)
        dtype = _glue_dtype(array.dtype)
        buf = cls(array.shape, dtype, stream or get_context().copy_stream)
        with device_span(buf.stream, "copy", f"upload {dtype}{list(buf.shape)}", bytes=buf.nbytes):
            upload(buf.ptr, np.ascontiguousarray(array, dtype=dtype.numpy), buf.stream)
        buf.mark_written()
        return buf

    def mark_written(self, stream: Stream | None = None) -> None:
        """Record that work just queued on `stream` (default: the buffer's) writes this buffer."""
        stream = stream or self.stream
        self.event = Event(stream.ctx).record(stream)
        self.written_on, self.waited_on = stream, (stream if stream is self.stream else None)

    def mark_pending(self, stream: Stream) -> None:
        """Like `mark_written`, but the event is recorded only when something first waits for
        this buffer (see `ready_event`): a program call then costs no driver call for it."""
        self.event, self.written_on, self.waited_on = None, stream, (stream if stream is self.stream else None)

    @staticmethod
    def mark_all_pending(buffers: Sequence["DeviceBuffer"], stream: Stream) -> None:
        """`mark_pending(stream)` for buffers of `stream`'s own (an output set handed out again,
        a lean call's donated arguments), in one loop (a slot's setter mapped over the list runs
        no bytecode, but takes four times as long per buffer: CPython 3.11)."""
        for buf in buffers:
            buf.event = None
            buf.written_on = buf.waited_on = stream

    @staticmethod
    def mark_rewritten(buffers: Sequence["DeviceBuffer"], stream: Stream) -> None:
        """`mark_pending(stream)` for buffers that work just queued on `stream` overwrote (a
        call's donated arguments), leaving `stream` prepared for them: later work there is
        ordered after the write already, so a loop that donates them again costs nothing."""
        for buf in buffers:
            if buf.waited_on is not stream and buf.stream is not stream:
                CachingAllocator.record_use(buf._block, stream)
            buf.event = None
            buf.written_on = buf.waited_on = stream

    def ready_event(self) -> Event | None:
        """An event after this buffer's last write (None if it was never written). A pending
        write's event is recorded now, so it also covers work queued on that stream since the
        write: waiting on it may wait longer than needed (as a stream synchronisation would),
        never less."""
        if self.event is None and self.written_on is not None:
            ctx = self.stream.ctx
            with ctx.enqueue_lock:  # not into a graph another thread is capturing
                self.event = Event(ctx).record(self.written_on)
        return self.event

    def prepare_for(self, stream: Stream) -> None:
        """Before queuing work on `stream` that uses this buffer: order it after the buffer's last
        write, and keep the memory from reuse until that work is done. Once done for a stream,
        this holds until the next write (a loop's unchanging inputs cost nothing)."""
        if stream is self.waited_on:
            return
        if self.written_on is not None and self.written_on is not stream:
            stream.wait(self.ready_event())
        if stream is not self.stream:
            CachingAllocator.record_use(self._block, stream)
        self.waited_on = stream

    def is_ready(self) -> bool:
        """True when every queued write of this buffer has finished."""
        event = self.ready_event()
        return event is None or event.query()

    def block_until_ready(self) -> DeviceBuffer:
        event = self.ready_event()
        if event is not None:
            with profiler.span("wait", "block_until_ready"):
                event.synchronize()
        return self

    def to_host(self) -> np.ndarray:
        """A new NumPy array with the values, once every queued write has finished. The copy runs
        on the context's readback stream, after this buffer's `ready_event`: other streams' work
        does not hold it back."""
        out = np.empty(self.shape, self.dtype.numpy)
        readback = self.stream.ctx.readback_stream
        if self.written_on is not None:
            readback.wait(self.ready_event())
        name = f"download {self.dtype}{list(self.shape)}"
        with profiler.span("copy", name), device_span(readback, "copy", name, bytes=self.nbytes):
            download(out, self.ptr, readback)
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """`np.asarray(buffer)`: its values on the host (a download, after its writes)."""
        out = self.to_host()
        return out if dtype is None else out.astype(dtype, copy=False)

    def fill_bytes(self, value: int) -> DeviceBuffer:
        """Set every byte to `value` (queued on the buffer's stream): 0xFF poisons floats as NaN."""
        drv.check(drv.load().cuMemsetD8Async(self.ptr, value, self.nbytes, self.stream.handle),
                  "cuMemsetD8Async")
        self.mark_written()
        return self

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.dtype}{list(self.shape)} at 0x{self.ptr:x} on {self.stream})"
