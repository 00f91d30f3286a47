"""CUDA streams and events: the ordering glue's asynchronous work is built on.

Every device buffer belongs to a stream and knows the stream of its last write, with an event
recorded after that write (at once, or when first needed); a consumer on another stream waits on
that event on the device (`Stream.wait`), and the host waits on it only when it reads values. Events are plentiful (one per buffer), so their
driver handles are pooled per context: an `Event` returns its handle to the pool when the
Python object dies, so no live object ever shares a handle.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from glue import profiler
from glue.backend_cuda.runtime import driver as drv

if TYPE_CHECKING:
    from glue.backend_cuda.runtime.context import Context

_NOT_READY = "CUDA_ERROR_NOT_READY"


class Event:
    """A point in a stream's work. Without `timing`, events are cheaper to record and wait on."""

    __slots__ = ("handle", "ctx", "_pool")

    def __init__(self, ctx: Context, timing: bool = False):
        pool = _pools.setdefault((id(ctx), timing), [])
        if pool:
            handle = pool.pop()
        else:
            ctx.make_current()
            flags = drv.load().CUevent_flags
            handle = int(drv.call(drv.load().cuEventCreate,
                                  flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING))
        self.ctx, self.handle, self._pool = ctx, handle, pool

    def __del__(self) -> None:
        try:
            self._pool.append(self.handle)
        except AttributeError:  # __init__ failed before it had a handle
            pass

    def record(self, stream: Stream) -> Event:
        drv.call(drv.load().cuEventRecord, self.handle, stream.handle)
        return self

    def query(self) -> bool:
        """True when the work before the record has finished (or nothing was recorded)."""
        err, = drv.load().cuEventQuery(self.handle)
        if err and err.name != _NOT_READY:
            raise drv.error_for("cuEventQuery", err)
        return not err

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        drv.call(drv.load().cuEventSynchronize, self.handle)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to `end` (both created with `timing=True`)."""
        return drv.call(drv.load().cuEventElapsedTime, self.handle, end.handle)


# (id(context), timing) -> free event handles. Contexts live for the whole process.
_pools: dict[tuple[int, bool], list[int]] = {}


class Stream:
    """A non-blocking CUDA stream of one context (no implicit ordering with stream 0).
    Streams are not destroyed: glue keeps a few for the whole process."""

    __slots__ = ("handle", "ctx", "label")

    def __init__(self, ctx: Context, priority: int = 0, label: str = "stream"):
        driver = drv.load()
        ctx.make_current()
        self.ctx, self.label = ctx, label
        self.handle = int(drv.call(driver.cuStreamCreateWithPriority,
                                   driver.CUstream_flags.CU_STREAM_NON_BLOCKING, priority))

    def record(self, event: Event | None = None) -> Event:
        """Record an event (a new one unless given) after the work queued so far."""
        return (event or Event(self.ctx)).record(self)

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for `event`, on the device (the host goes on)."""
        drv.call(drv.load().cuStreamWaitEvent, self.handle, event.handle, 0)

    def synchronize(self) -> None:
        drv.call(drv.load().cuStreamSynchronize, self.handle)

    def query(self) -> bool:
        """True when all work queued on this stream has finished."""
        err, = drv.load().cuStreamQuery(self.handle)
        if err and err.name != _NOT_READY:
            raise drv.error_for("cuStreamQuery", err)
        return not err

    def __repr__(self) -> str:
        return f"Stream({self.label}, 0x{self.handle:x})"


def _anchor(ctx: Context) -> tuple[Event, int]:
    """A completed timing event and the host time it completed at: a profile's device time base."""
    event = Event(ctx, timing=True).record(ctx.stream)
    event.synchronize()
    return event, time.perf_counter_ns()


@contextmanager
def device_span(stream: Stream, cat: str, name: str, **args: Any) -> Iterator[None]:
    """While a `glue.profile` is open: the work queued on `stream` inside the block, timed with
    events, as an interval on that stream's track. Otherwise nothing."""
    prof = profiler.active()
    if prof is None:
        yield
        return
    start = Event(stream.ctx, timing=True).record(stream)
    yield
    end = Event(stream.ctx, timing=True).record(stream)
    prof.add_device(stream.ctx, lambda: _anchor(stream.ctx), stream.label, cat, name, start, end, args)
