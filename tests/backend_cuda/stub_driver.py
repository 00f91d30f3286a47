"""A stand-in for the CUDA driver, so that the cuda backend's call path runs without a GPU.

`StubDriver` answers every driver call glue's runtime makes the way `cuda.bindings.driver` does
(`(CUresult, *values)`), on a pretend H200 (compute capability 9.0): allocations get fresh
addresses, launches, copies and graph replays are counted in `calls` and do nothing (values are
never computed: a test of what the host does, not of results) but run a test's `hooks`, and a
stream capture turns the work queued meanwhile into a graph. Enums and structs come from the real bindings, which import
without a driver. `installed()` puts it in place of the driver for the duration of a `with`
block, with glue's per-process driver state (the loaded driver, contexts, event pools) fresh on
the way in and restored on the way out, and the disk cache in a directory of its own: the
stub's cubins and contraction races are not a GPU's.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import tempfile
from collections import Counter
from typing import Any, Callable, Iterator

from cuda.bindings import driver as _real

from glue.backend_cuda import detected_arch
from glue.backend_cuda.runtime import context, driver, stream
from glue.settings import config

_OK = 0


class StubDriver:
    """The driver API of a pretend GPU: counts calls, computes nothing."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.hooks: dict[str, Callable[[], None]] = {}  # driver call -> run when it is queued
        self._handles = itertools.count(0x1000)
        self._addresses = itertools.count(1 << 32, 1 << 24)  # 16 MiB apart: no block overlaps another
        self._host: dict[int, Any] = {}  # pinned host memory and cubins, kept alive by address
        self._linking: dict[int, bytes] = {}  # each link state's input
        self._capturing: dict[int, int] = {}  # stream -> nodes captured so far
        self._graphs: dict[int, int] = {}  # graph -> nodes

    def __getattr__(self, name: str) -> Any:
        found = getattr(_real, name)
        if name.startswith("cu") and not isinstance(found, type):  # a driver call the stub does not know
            raise AttributeError(f"StubDriver has no {name}")
        return found  # CUresult, the flags and attribute enums, CUlaunchConfig, cuuint64_t, ...

    def _handle(self) -> int:
        return next(self._handles)

    def _queue(self, name: str, stream: Any) -> tuple:
        """Work queued on `stream`: a graph node while it is being captured."""
        self.calls[name] += 1
        if int(stream) in self._capturing:
            self._capturing[int(stream)] += 1
        hook = self.hooks.get(name)
        if hook is not None:
            hook()
        return (_OK,)

    # --- the device and its context
    def cuInit(self, flags): return (_OK,)
    def cuDriverGetVersion(self): return (_OK, 1)  # (no driver's: a part of cubins' cache keys)
    def cuDeviceGetCount(self): return (_OK, 1)
    def cuDeviceGet(self, index): return (_OK, index)
    def cuDeviceGetName(self, size, dev): return (_OK, b"Stub H200\0")
    def cuDeviceTotalMem(self, dev): return (_OK, 141 << 30)
    def cuDevicePrimaryCtxRetain(self, dev): return (_OK, self._handle())
    def cuCtxSetCurrent(self, ctx): return (_OK,)
    def cuCtxSynchronize(self): return (_OK,)
    def cuMemGetInfo(self): return (_OK, 140 << 30, 141 << 30)

    def cuDeviceGetAttribute(self, attr, dev):
        a = _real.CUdevice_attribute
        return (_OK, {a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                      a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0}.get(attr, 1))

    def cuGetErrorString(self, code): return (_OK, b"stub error")

    # --- streams and events
    def cuStreamCreateWithPriority(self, flags, priority): return (_OK, self._handle())
    def cuStreamSynchronize(self, stream): return (_OK,)
    def cuStreamQuery(self, stream): return (_OK,)
    def cuStreamWaitEvent(self, stream, event, flags): return self._queue("cuStreamWaitEvent", stream)
    def cuEventCreate(self, flags): return (_OK, self._handle())
    def cuEventRecord(self, event, stream): return self._queue("cuEventRecord", stream)
    def cuEventQuery(self, event): return (_OK,)
    def cuEventSynchronize(self, event): return (_OK,)
    def cuEventElapsedTime(self, start, end): return (_OK, 0.001)

    # --- memory
    def cuMemAlloc(self, size): return (_OK, next(self._addresses))
    def cuMemFree(self, ptr): return (_OK,)

    def cuMemHostAlloc(self, size, flags):
        memory = ctypes.create_string_buffer(size)
        self._host[ctypes.addressof(memory)] = memory
        return (_OK, ctypes.addressof(memory))

    def cuMemcpyHtoDAsync(self, dst, src, n, stream): return self._queue("cuMemcpyHtoDAsync", stream)
    def cuMemcpyDtoHAsync(self, dst, src, n, stream): return self._queue("cuMemcpyDtoHAsync", stream)
    def cuMemcpyDtoDAsync(self, dst, src, n, stream): return self._queue("cuMemcpyDtoDAsync", stream)
    def cuMemsetD8Async(self, ptr, value, n, stream): return self._queue("cuMemsetD8Async", stream)

    # --- modules and launches
    def cuLinkCreate(self, n, options, values): return (_OK, self._handle())
    def cuLinkDestroy(self, state): return (_OK,)

    def cuLinkAddData(self, state, kind, data, size, name, n, options, values):
        self._linking[state] = bytes(data[:size])
        return (_OK,)

    def cuLinkComplete(self, state):
        """The "executable": b"linked " and the input, kept alive by address."""
        image = b"linked " + self._linking.pop(state)
        code = ctypes.create_string_buffer(image, len(image))
        self._host[ctypes.addressof(code)] = code
        return (_OK, ctypes.addressof(code), len(image))

    def cuModuleLoadData(self, image): return (_OK, self._handle())
    def cuModuleLoadDataEx(self, image, n, options, values): return (_OK, self._handle())
    def cuModuleGetFunction(self, module, name): return (_OK, self._handle())
    def cuFuncSetAttribute(self, function, attr, value): return (_OK,)
    def cuFuncGetAttribute(self, attr, function): return (_OK, 0)
    def cuTensorMapEncodeTiled(self, *description): return (_OK, _real.CUtensorMap())  # (zeros: no TMA here)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self._queue("cuLaunchKernel", stream)

    def cuLaunchKernelEx(self, config, f, params, extra):
        return self._queue("cuLaunchKernelEx", config.hStream)

    # --- graphs
    def cuStreamBeginCapture(self, stream, mode):
        self._capturing[int(stream)] = 0
        return (_OK,)

    def cuStreamEndCapture(self, stream):
        graph = self._handle()
        self._graphs[graph] = self._capturing.pop(int(stream))
        return (_OK, graph)

    def cuGraphGetNodes(self, graph, n): return (_OK, [], self._graphs[int(graph)])
    def cuGraphInstantiate(self, graph, flags): return (_OK, self._handle())
    def cuGraphDestroy(self, graph): return (_OK,)
    def cuGraphExecDestroy(self, exec_): return (_OK,)
    def cuGraphLaunch(self, exec_, stream): return self._queue("cuGraphLaunch", stream)


def _forget_the_driver() -> None:
    """Drop what glue remembers of the driver it loaded: the module, its version and the
    detected arch (a lowering before the stub, with no GPU, remembered none: sm_90, not sm_90a)."""
    driver.load.cache_clear()
    driver.version.cache_clear()
    detected_arch.cache_clear()


@contextlib.contextmanager
def installed() -> Iterator[StubDriver]:
    """The stub in place of the CUDA driver inside the block (glue's driver state fresh)."""
    stub = StubDriver()
    saved = driver._bindings, dict(context._contexts), dict(stream._pools)
    driver._bindings = lambda: stub
    _forget_the_driver()
    context._contexts.clear()
    stream._pools.clear()
    try:
        with tempfile.TemporaryDirectory() as cache, config.override(cache_dir=cache):
            yield stub
    finally:
        driver._bindings, contexts, pools = saved
        _forget_the_driver()
        context._contexts.clear()
        context._contexts.update(contexts)
        stream._pools.clear()
        stream._pools.update(pools)


__all__ = ["StubDriver", "installed"]
