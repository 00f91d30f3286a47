"""Devices and the CUDA context glue runs in; `glue.devices()`.

glue uses each GPU's *primary* context (the one the CUDA runtime and other libraries share),
made current lazily in every host thread that touches the device. A `Context` bundles what
belongs to one device: its default stream, caching allocator, pinned staging pool and module
cache.

`devices()` lists every device glue can run on, default first: the CUDA GPUs (when a driver
and a GPU are present), then the host CPU. So `glue.devices()[0]` is where `glue.jit` runs by
default, and the list is never empty.
"""
from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass
from functools import cached_property

from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.allocator import CachingAllocator
from glue.backend_cuda.runtime.module import ModuleCache
from glue.backend_cuda.runtime.stream import Stream
from glue.backend_cuda.runtime.transfer import PinnedPool


@dataclass(frozen=True)
class Device:
    """One device: `platform` is "cuda" or "cpu"; `compute_capability` is None for the CPU."""

    platform: str
    id: int
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None = None

    @property
    def arch(self) -> str | None:
        """The PTX target of a GPU (`sm_90` for compute capability 9.0)."""
        cc = self.compute_capability
        return f"sm_{cc[0]}{cc[1]}" if cc else None

    def __str__(self) -> str:
        extra = f"{self.arch}, " if self.arch else ""
        return f"{self.platform}:{self.id} {self.name} ({extra}{self.memory_bytes / 2**30:.1f} GiB)"


def _cpu_device() -> Device:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        name)
    except OSError:
        pass
    return Device("cpu", 0, name, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _gpu_device(index: int) -> Device:
    driver = drv.load()
    dev = drv.call(driver.cuDeviceGet, index)
    attr = driver.CUdevice_attribute
    major = drv.call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = drv.call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    name = drv.call(driver.cuDeviceGetName, 256, dev).split(b"\0", 1)[0].decode()
    return Device("cuda", index, name, drv.call(driver.cuDeviceTotalMem, dev), (major, minor))


def devices() -> list[Device]:
    """Every device glue can run on, the default first: CUDA GPUs, then the host CPU."""
    return [_gpu_device(i) for i in range(drv.device_count())] + [_cpu_device()]


class Context:
    """One GPU's primary context and the runtime state glue keeps for it."""

    def __init__(self, index: int):
        driver = drv.load()
        self.device = _gpu_device(index)
        self._dev = drv.call(driver.cuDeviceGet, index)
        self.handle = drv.call(driver.cuDevicePrimaryCtxRetain, self._dev)
        self._current = threading.local()
        self._streams_lock = threading.Lock()
        # Held while a program queues its launches on the compute streams (or captures them as a
        # graph), and while an event is recorded on one of them: stream capture takes in
        # whatever any thread queues on a capturing stream, so nothing else may land there.
        # Reentrant: a program's launches wait for their inputs' events, which may be recorded
        # then.
        self.enqueue_lock = threading.RLock()
        self.capturing = False  # set, under enqueue_lock, while a graph is being captured
        self.make_current()
        self._compute: list[Stream] = [self.stream]

    def make_current(self, force: bool = False) -> None:
        """Make this context current in the calling host thread (cheap after the first time;
        `force` when other code may have switched contexts since)."""
        if getattr(self._current, "set", False) and not force:
            return
        drv.call(drv.load().cuCtxSetCurrent, self.handle)
        self._current.set = True

    def synchronize(self) -> None:
        """Wait for all work on every stream of this device."""
        self.make_current()
        drv.call(drv.load().cuCtxSynchronize)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as the driver reports them."""
        self.make_current()
        return drv.call(drv.load().cuMemGetInfo)

    @cached_property
    def stream(self) -> Stream:
        """The default stream: a non-blocking stream, so work never serialises with stream 0.
        Programs run here (their stream 0) and their results are ready in its order."""
        return Stream(self, label="compute 0")

    def compute_streams(self, n: int) -> list[Stream]:
        """The default stream and n - 1 more, shared by every program that runs branches in
        parallel (a program forks onto them from the default stream and joins back)."""
        with self._streams_lock:
            while len(self._compute) < n:
                self._compute.append(Stream(self, label=f"compute {len(self._compute)}"))
        return self._compute[:n]

    @cached_property
    def copy_stream(self) -> Stream:
        """Host-to-device uploads, so inputs in transit do not hold back unrelated kernels."""
        return Stream(self, label="copy h2d")

    @cached_property
    def readback_stream(self) -> Stream:
        """Device-to-host copies: a read waits for its array's writes only."""
        return Stream(self, label="copy d2h")

    @cached_property
    def allocator(self) -> CachingAllocator:
        return CachingAllocator(self)

    @cached_property
    def staging(self) -> PinnedPool:
        """Pinned host buffers for host<->device copies."""
        return PinnedPool(self)

    @cached_property
    def modules(self) -> ModuleCache:
        return ModuleCache(self)


_contexts: dict[int, Context] = {}
_contexts_lock = threading.Lock()


def get_context(index: int = 0) -> Context:
    """The context of GPU `index`, created on first use and made current in this thread."""
    ctx = _contexts.get(index)
    if ctx is None:
        with _contexts_lock:
            ctx = _contexts.get(index)
            if ctx is None:
                ctx = _contexts[index] = Context(index)
    ctx.make_current()
    return ctx
