"""`glue.profile`: a Chrome trace (Perfetto / chrome://tracing JSON) of what glue did.

    with glue.profile("trace.json"):
        step(params, batch)

or `GLUE_TRACE=trace.json python train.py` for a whole run. The trace has a track per host
thread (compile stages, calls, waits, host copies) and, on a GPU, a track per stream (kernels
and copies, timed with CUDA events), so overlap between streams and gaps between launches can
be seen. While a profile is open the CUDA backend launches kernel by kernel with timing events
around each, instead of replaying graphs, so the trace shows every kernel.

Backends report through `span` (a host interval on the calling thread) and `device_span` (an
interval between two device timing events, resolved to host time when the profile closes).
When no profile is open both cost one global lookup.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from glue.settings import config

_active: "Profile | None" = None


class Profile:
    """The events of one profiling session; written as JSON by `close`."""

    HOST_PID, DEVICE_PID = 1, 2

    def __init__(self, path: str):
        self.path = path
        self.start_ns = time.perf_counter_ns()
        self.events: list[dict[str, Any]] = []
        self._threads: dict[int, str] = {}
        self._tracks: dict[str, int] = {}
        self._device: list[tuple[str, str, str, Any, Any, Any, dict]] = []
        self._anchors: dict[Any, tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def _us(self, ns: int) -> float:
        return (ns - self.start_ns) / 1000

    def add_host(self, cat: str, name: str, start_ns: int, end_ns: int, args: dict | None = None) -> None:
        thread = threading.current_thread()
        with self._lock:
            self._threads.setdefault(thread.ident, thread.name)
            self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.HOST_PID,
                                "tid": thread.ident, "ts": self._us(start_ns),
                                "dur": (end_ns - start_ns) / 1000, "args": args or {}})

    def add_device(self, clock: Any, anchor: Callable[[], tuple[Any, int]], track: str, cat: str,
                   name: str, start: Any, end: Any, args: dict | None = None) -> None:
        """An interval on device track `track` between timing events `start` and `end`. `clock`
        keys the device's time base; `anchor()` returns a timing event that has completed and
        the host time (perf_counter_ns) it completed at; it is called once per clock."""
        with self._lock:
            if clock not in self._anchors:
                self._anchors[clock] = anchor()
            self._device.append((clock, track, cat, name, start, end, args or {}))

    def close(self) -> None:
        """Resolve the device intervals (waiting for their events) and write the JSON file."""
        for clock, track, cat, name, start, end, args in self._device:
            event, host_ns = self._anchors[clock]
            end.synchronize()
            ts = self._us(host_ns) + event.elapsed_ms(start) * 1000
            tid = self._tracks.setdefault(track, len(self._tracks) + 1)
            self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.DEVICE_PID,
                                "tid": tid, "ts": ts, "dur": start.elapsed_ms(end) * 1000, "args": args})
        meta = [{"ph": "M", "name": "process_name", "pid": self.HOST_PID, "args": {"name": "host"}},
                {"ph": "M", "name": "process_name", "pid": self.DEVICE_PID, "args": {"name": "device"}}]
        meta += [{"ph": "M", "name": "thread_name", "pid": self.HOST_PID, "tid": t, "args": {"name": n}}
                 for t, n in self._threads.items()]
        meta += [{"ph": "M", "name": "thread_name", "pid": self.DEVICE_PID, "tid": t, "args": {"name": n}}
                 for n, t in self._tracks.items()]
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        with open(self.path, "w") as f:
            json.dump({"traceEvents": meta + sorted(self.events, key=lambda e: e["ts"]),
                       "displayTimeUnit": "ns"}, f)


def active() -> Profile | None:
    """The open profile, or None."""
    return _active


@contextmanager
def profile(path: str) -> Iterator[Profile]:
    """Record what glue does inside the block and write it to `path` as a Chrome trace."""
    global _active
    if _active is not None:
        raise RuntimeError(f"a glue profile is already open (writing {_active.path})")
    _active = prof = Profile(path)
    try:
        yield prof
    finally:
        _active = None
        prof.close()


@contextmanager
def suspended() -> Iterator[None]:
    """Record nothing inside (work glue does for itself, such as timing kernel variants, which
    would otherwise show up as the program's own copies and kernels)."""
    global _active
    prof, _active = _active, None
    try:
        yield
    finally:
        _active = prof


@contextmanager
def span(cat: str, name: str, **args: Any) -> Iterator[None]:
    """A host interval on the calling thread's track, when a profile is open."""
    prof = _active
    if prof is None:
        yield
        return
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        prof.add_host(cat, name, start, time.perf_counter_ns(), args)


def _trace_from_env() -> None:
    """GLUE_TRACE=path profiles the whole process and writes the trace at exit."""
    global _active
    path = config.trace
    if path and _active is None:
        _active = Profile(path)

        def finish() -> None:
            global _active
            prof, _active = _active, None
            if prof is not None:
                prof.close()

        atexit.register(finish)


_trace_from_env()
