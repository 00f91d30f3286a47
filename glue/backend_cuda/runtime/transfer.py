"""Host<->device copies, queued on a stream, through pinned (page-locked) staging buffers.

A large copy from pageable NumPy memory cannot run asynchronously: the driver stages it itself
and the host waits. glue instead copies the data into a pinned buffer it keeps (a host memcpy),
then queues the DMA on the stream and returns. Large arrays go in chunks so that staging memory
stays bounded and, on the way back, the host copies chunk k out while chunk k+1 is in flight.
A staging buffer is reused only once the event recorded after its last copy has completed.

Uploads of at most `DIRECT_MAX` bytes skip glue's staging: the driver copies that little pageable
memory into its own staging buffer before the call returns, in one driver call instead of several
(on the H200: 6.5 us against 10.8 for 64 bytes, 12.6 against 14.2 for 64 KiB). Downloads always
stage: there the direct copy was no faster (benchmarks/cuda_launch.py measures both).
"""
from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

import numpy as np

from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.stream import Event, Stream

if TYPE_CHECKING:
    from glue.backend_cuda.runtime.context import Context

CHUNK = 8 << 20
DIRECT_MAX = 64 << 10
_MIN_BUFFER = 64 << 10


class PinnedBuffer:
    """Page-locked host memory with a NumPy byte view; `event` guards its last queued copy."""

    __slots__ = ("ptr", "size", "bytes", "event")

    def __init__(self, ptr: int, size: int):
        self.ptr, self.size = ptr, size
        self.bytes = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
        self.event: Event | None = None

    def done(self) -> bool:
        return self.event is None or self.event.query()


class PinnedPool:
    """Pinned staging buffers of one context, in power-of-two sizes, about `limit` bytes in all.

    `acquire` hands a buffer out, `release` takes it back; a released buffer may still be the
    source or target of a queued copy, and is handed out again only when its event has completed.
    """

    def __init__(self, ctx: Context, limit: int = 256 << 20):
        self.ctx, self.limit, self.pinned_bytes = ctx, limit, 0
        self._idle: dict[int, list[PinnedBuffer]] = {}
        self._lock = threading.Lock()  # host threads upload and download at the same time

    def acquire(self, nbytes: int) -> PinnedBuffer:
        size = max(_MIN_BUFFER, 1 << (nbytes - 1).bit_length())
        with self._lock:
            buffers = self._idle.setdefault(size, [])
            for i, buf in enumerate(buffers):
                if buf.done():
                    return buffers.pop(i)
            oldest = buffers.pop(0) if buffers and self.pinned_bytes + size > self.limit else None
        if oldest is not None:  # at the limit: wait for the oldest copy rather than pin more
            oldest.event.synchronize()
            return oldest
        self.ctx.make_current()
        buf = PinnedBuffer(int(drv.call(drv.load().cuMemHostAlloc, size, 0)), size)
        with self._lock:
            self.pinned_bytes += size
        return buf

    def release(self, buf: PinnedBuffer) -> None:
        with self._lock:
            self._idle[buf.size].append(buf)


def _byte_view(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def upload(dst: int, src: np.ndarray, stream: Stream) -> None:
    """Queue a copy of `src` (C-contiguous) to device address `dst`; `src` may change afterwards."""
    data, pool = _byte_view(src), stream.ctx.staging
    copy = drv.load().cuMemcpyHtoDAsync
    if data.size <= DIRECT_MAX:
        if data.size:
            drv.check(copy(dst, data.ctypes.data, data.size, stream.handle), "cuMemcpyHtoDAsync")
        return
    for start in range(0, data.size, CHUNK):
        part = data[start:start + CHUNK]
        buf = pool.acquire(part.size)
        buf.bytes[:part.size] = part
        drv.check(copy(dst + start, buf.ptr, part.size, stream.handle), "cuMemcpyHtoDAsync")
        buf.event = stream.record(buf.event)
        pool.release(buf)


def upload_repeating(dst: int, pattern: np.ndarray, nbytes: int, stream: Stream) -> None:
    """Fill `nbytes` at device address `dst` with `pattern`'s bytes over and over: one upload,
    then device copies of what is there, each doubling it."""
    data = _byte_view(pattern)[:nbytes]
    upload(dst, data, stream)
    copy, done = drv.load().cuMemcpyDtoDAsync, data.size
    while done < nbytes:
        size = min(done, nbytes - done)
        drv.check(copy(dst + done, dst, size, stream.handle), "cuMemcpyDtoDAsync")
        done += size


def download(dst: np.ndarray, src: int, stream: Stream) -> None:
    """Copy device bytes at `src` into `dst` (C-contiguous) after the work queued on `stream`."""
    data, pool = _byte_view(dst), stream.ctx.staging
    copy = drv.load().cuMemcpyDtoHAsync

    def enqueue(start: int) -> tuple[int, PinnedBuffer]:
        size = min(CHUNK, data.size - start)
        buf = pool.acquire(size)
        drv.check(copy(buf.ptr, src + start, size, stream.handle), "cuMemcpyDtoHAsync")
        buf.event = stream.record(buf.event)
        return size, buf

    starts = range(0, data.size, CHUNK)
    queued = [enqueue(0)] if starts else []
    for k, start in enumerate(starts):
        if k + 1 < len(starts):  # the next chunk's DMA overlaps this chunk's host copy
            queued.append(enqueue(starts[k + 1]))
        size, buf = queued.pop(0)
        buf.event.synchronize()
        data[start:start + size] = buf.bytes[:size]
        pool.release(buf)
