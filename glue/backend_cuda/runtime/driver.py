"""The CUDA driver API as glue uses it: loaded once, initialised once, every result checked.

`cuda.bindings.driver` returns `(CUresult, *values)` from every call. `call(fn, *args)` checks
the result and returns the values; a failure becomes a `CudaError` (a `glue.BackendError`) that
names the driver call, the error code and, when given, the kernel. On a machine without the
NVIDIA driver the bindings import fine but the first call raises cuda.pathfinder's
`DynamicLibNotFoundError`; `load()` turns that into `CudaUnavailableError`.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from glue.errors import BackendError


class CudaError(BackendError):
    """A CUDA driver call returned an error code."""

    def __init__(self, call: str, code: int, kernel: str | None = None, detail: str = ""):
        self.call, self.code, self.kernel = call, int(code), kernel
        self.code_name = _code_name(code)
        where = f" (kernel {kernel!r})" if kernel else ""
        hint = _HINTS.get(self.code_name, "")
        message = f"cuda: {call} failed{where}: {self.code_name} ({self.code}): {_describe(code)}"
        super().__init__(message + "".join(f"; {s}" for s in (detail, hint) if s))


class CudaOutOfMemoryError(CudaError):
    """The device has no room for an allocation (after glue emptied its own cache)."""


class CudaLaunchError(CudaError):
    """A kernel could not be launched, or failed while running."""


class CudaCompileError(CudaError):
    """The driver's JIT rejected PTX, or a module could not be loaded."""


class CudaUsageError(BackendError):
    """The runtime was asked for something invalid before any driver call (wrong argument count
    or types for a kernel, a kernel name the module lacks)."""


class CudaUnavailableError(BackendError):
    """No usable CUDA driver or device on this machine."""


_HINTS = {
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel accessed memory out of bounds; the CUDA context is now "
                                  "unusable and the process must restart",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or too much shared memory for the "
                                          "block size",
    "CUDA_ERROR_INVALID_VALUE": "check the grid/block dimensions, shared memory size and arguments",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the PTX targets a newer architecture than this GPU",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the PTX ISA version is newer than this driver supports",
}

# Error codes that say which subclass to raise; any other code is a plain CudaError.
_CLASS_BY_NAME = {
    "CUDA_ERROR_OUT_OF_MEMORY": CudaOutOfMemoryError,
    **dict.fromkeys(("CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                     "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ILLEGAL_ADDRESS",
                     "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS"),
                    CudaLaunchError),
    **dict.fromkeys(("CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_IMAGE",
                     "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
                     "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "CUDA_ERROR_NOT_FOUND",
                     "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"), CudaCompileError),
}


def _bindings():
    from cuda.bindings import driver
    return driver


def _code_name(code: int) -> str:
    try:
        return _bindings().CUresult(int(code)).name
    except (ValueError, ImportError):
        return f"CUDA_ERROR_{int(code)}"


def _describe(code: int) -> str:
    """The driver's own sentence for an error code, once the driver is loaded."""
    if load.cache_info().currsize:
        try:
            err, text = _bindings().cuGetErrorString(_bindings().CUresult(int(code)))
            if not err and text:
                return text.decode()
        except Exception:  # an unknown code or a driver in a bad state: the name is enough
            pass
    return _code_name(code).removeprefix("CUDA_ERROR_").replace("_", " ").lower()


def error_for(call: str, code: int, kernel: str | None = None, detail: str = "") -> CudaError:
    """The `CudaError` subclass for a failed driver call."""
    return _CLASS_BY_NAME.get(_code_name(code), CudaError)(call, code, kernel, detail)


def check(result: tuple, call: str, kernel: str | None = None) -> Any:
    """The values of a driver call's `(CUresult, *values)` result; raises on an error code."""
    if result[0]:
        raise error_for(call, result[0], kernel)
    return result[1] if len(result) == 2 else result[1:] or None


def call(fn: Callable, *args: Any, kernel: str | None = None) -> Any:
    """Call a driver function and check its result: `call(driver.cuMemAlloc, n)`."""
    return check(fn(*args), fn.__name__, kernel)


@lru_cache(maxsize=None)
def load():
    """The initialised `cuda.bindings.driver` module, or `CudaUnavailableError`."""
    try:
        driver = _bindings()
        err, = driver.cuInit(0)
    except Exception as exc:  # ImportError, or pathfinder's DynamicLibNotFoundError (no driver)
        raise CudaUnavailableError(f"cuda: the NVIDIA driver cannot be loaded here ({exc})") from None
    if err:
        raise CudaUnavailableError(f"cuda: cuInit failed: {_code_name(err)}")
    return driver


def device_count() -> int:
    """How many CUDA devices the driver sees; 0 where there is no driver. Never raises."""
    try:
        return call(load().cuDeviceGetCount)
    except BackendError:
        return 0


def available() -> bool:
    """True when the driver initialises and at least one device exists; never raises."""
    return device_count() > 0


@lru_cache(maxsize=None)
def version() -> int:
    """The driver's CUDA version as an integer (e.g. 13000 for 13.0)."""
    driver = load()
    return call(driver.cuDriverGetVersion)


def device_arch(index: int) -> str:
    """The PTX target of device `index` (`sm_86` for compute capability 8.6), read from the
    driver without creating a context. Compute capability 9.0 (H100, H200) is `sm_90a`: its
    arch-specific features (wgmma, setmaxnreg) are what its fastest contractions run on."""
    driver = load()
    dev = call(driver.cuDeviceGet, index)
    attr = driver.CUdevice_attribute
    major = call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
