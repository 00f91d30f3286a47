"""The CUDA runtime glue runs kernels on: driver access and errors, contexts and devices, modules
and launches, the caching allocator, streams and events, pinned transfers and `DeviceBuffer`.

Importing this package does not load the driver; the first call that needs it does.
"""
from glue.backend_cuda.runtime.allocator import AllocatorStats, CachingAllocator
from glue.backend_cuda.runtime.context import Context, Device, devices, get_context
from glue.backend_cuda.runtime.device_array import DeviceBuffer
from glue.backend_cuda.runtime.driver import (CudaCompileError, CudaError, CudaLaunchError,
                                              CudaOutOfMemoryError, CudaUnavailableError,
                                              CudaUsageError)
from glue.backend_cuda.runtime.module import ArgPack, Kernel, Module, ModuleCache
from glue.backend_cuda.runtime.stream import Event, Stream

__all__ = ["AllocatorStats", "ArgPack", "CachingAllocator", "Context", "CudaCompileError", "CudaError",
           "CudaLaunchError", "CudaOutOfMemoryError", "CudaUnavailableError", "CudaUsageError",
           "Device", "DeviceBuffer", "Event", "Kernel", "Module", "ModuleCache", "Stream", "devices",
           "get_context"]
