"""DLPack exchange: `from_dlpack(x)` makes a glue.Array of any DLPack producer (NumPy, torch,
jax, cupy, ...), and `install()` gives glue Arrays `__dlpack__` / `__dlpack_device__`, so
`np.from_dlpack(a)`, `torch.from_dlpack(a)`, ... take glue arrays.

Host memory is shared, never copied, both ways. A glue Array in device memory exports its
`device_buffer` (its `ptr`, `shape`, `dtype`) as a CUDA tensor once its writes are done. A
producer's CUDA tensor is imported through host memory (the producer is asked for a CPU copy):
glue's device buffers are allocated by its own runtime, which does not yet adopt foreign memory.

Capsules are the unversioned kind (`"dltensor"`, DLPack 0.x ABI), which every consumer accepts.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import ml_dtypes
import numpy as np

from glue.errors import GlueError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.array import Array
from glue.ir import TensorType
from glue.ir import dtypes as dt

CPU, CUDA, CUDA_HOST = 1, 2, 3  # DLDeviceType codes glue meets
_HOST_DEVICES = (CPU, CUDA_HOST)  # memory the host can read
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6  # DLDataTypeCode


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _ManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedTensor))
_ManagedTensor._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                           ("deleter", _Deleter)]

_NAME, _USED_NAME = b"dltensor", b"used_dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor gets the dying capsule as a bare pointer: turning it into a Python object would
# revive it mid-deallocation. These two take the capsule that way.
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _fail(message: str) -> GlueError:
    return GlueTypeError(f"dlpack: {message} {describe_location(user_frame_location())}")


# --- dtypes ---------------------------------------------------------------------------------

def _dl_dtype(d: dt.DType) -> tuple[int, int]:
    if d == dt.bool_:
        return _BOOL, 8
    if d == dt.bfloat16:
        return _BFLOAT, 16
    if d.is_float:
        return _FLOAT, d.bits
    return (_UINT if d.numpy.kind == "u" else _INT), d.bits


def _numpy_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes != 1:
        raise _fail(f"vector dtypes ({lanes} lanes) are not supported")
    if (code, bits) == (_BOOL, 8):
        return np.dtype(np.bool_)
    if (code, bits) == (_BFLOAT, 16):
        return np.dtype(ml_dtypes.bfloat16)
    kinds = {_INT: "i", _UINT: "u", _FLOAT: "f"}
    if code not in kinds:
        raise _fail(f"the DLPack dtype code {code} is not supported")
    return np.dtype(f"{kinds[code]}{bits // 8}")


# --- export ---------------------------------------------------------------------------------

# What keeps each exported tensor's memory and metadata alive, by the address of its
# DLManagedTensor, until its consumer (or the unconsumed capsule) calls the deleter.
_EXPORTED: dict[int, tuple[Any, ...]] = {}


@_Deleter
def _delete(managed: Any) -> None:
    _EXPORTED.pop(ctypes.addressof(managed.contents), None)


@_CapsuleDestructor
def _destroy_capsule(capsule: int) -> None:
    if _is_valid_raw(capsule, _NAME):  # never consumed: the tensor is still ours
        _EXPORTED.pop(_get_pointer_raw(capsule, _NAME), None)


def _capsule(owner: Any, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...] | None,
             dtype: dt.DType, device: tuple[int, int]) -> Any:
    """A "dltensor" capsule for memory at `ptr` that `owner` keeps alive; strides in elements
    (None: C-contiguous)."""
    shape_array = (ctypes.c_int64 * len(shape))(*shape)
    stride_array = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
    managed = _ManagedTensor()
    code, bits = _dl_dtype(dtype)
    managed.dl_tensor = _Tensor(ptr, _Device(*device), len(shape), _DataType(code, bits, 1),
                                ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64)),
                                None if stride_array is None else
                                ctypes.cast(stride_array, ctypes.POINTER(ctypes.c_int64)), 0)
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (owner, managed, shape_array, stride_array)
    return _api.PyCapsule_New(address, _NAME, ctypes.cast(_destroy_capsule, ctypes.c_void_p))


def _device_of(array: Array) -> tuple[int, int]:
    buffer = array.device_buffer
    if buffer is None:
        return CPU, 0
    from glue.backend_cuda.runtime import driver as drv

    attribute = drv.load().CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return CUDA, int(drv.call(drv.load().cuPointerGetAttribute, attribute, buffer.ptr))


def _dlpack(self: Array, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
            copy: bool | None = None) -> Any:
    """A DLPack capsule of this array's values: its host memory (zero-copy), or its device
    buffer once the buffer's writes are done (so any consumer stream may read it)."""
    device = _device_of(self)
    if dl_device is not None and tuple(dl_device) != device:
        if tuple(dl_device)[0] != CPU or copy is False:
            raise BufferError(f"dlpack: cannot export an array on device {device} to {dl_device}")
        return _host_capsule(np.array(self) if copy else np.asarray(self))
    if device[0] == CPU:
        values = np.asarray(self)
        return _host_capsule(values.copy() if copy else values)
    if copy:
        raise BufferError("dlpack: copy=True of a device array is not supported; export it as is")
    buffer = self.device_buffer
    buffer.block_until_ready()
    return _capsule(self, buffer.ptr, tuple(buffer.shape), None, buffer.dtype, device)


def _host_capsule(values: np.ndarray) -> Any:
    itemsize = values.dtype.itemsize
    if any(s % itemsize for s in values.strides):
        values = np.ascontiguousarray(values)
    strides = tuple(s // itemsize for s in values.strides)
    return _capsule(values, values.ctypes.data, values.shape, strides, dt.from_numpy(values.dtype),
                    (CPU, 0))


def _dlpack_device(self: Array) -> tuple[int, int]:
    return _device_of(self)


def install(cls: type = Array) -> None:
    """Give `cls` (glue.Array) the DLPack producer methods."""
    cls.__dlpack__ = _dlpack
    cls.__dlpack_device__ = _dlpack_device


# --- import ---------------------------------------------------------------------------------

class _Imported:
    """Host memory a producer exported, seen by NumPy through `__array_interface__`; the
    producer's deleter runs when the last array over it is gone."""

    def __init__(self, managed: Any, typestr: str, shape: tuple[int, ...], strides: tuple[int, ...],
                 address: int):
        self._managed = managed
        self.__array_interface__ = {"data": (address, False), "typestr": typestr, "shape": shape,
                                    "strides": strides, "version": 3}

    def __del__(self) -> None:
        deleter = self._managed.contents.deleter
        if deleter:
            deleter(self._managed)


def _consume(capsule: Any) -> np.ndarray:
    """The host array a "dltensor" capsule describes, sharing its memory."""
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise _fail("expected an unconsumed 'dltensor' capsule")
    managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, _NAME), ctypes.POINTER(_ManagedTensor))
    tensor = managed.contents.dl_tensor
    if tensor.device.device_type not in _HOST_DEVICES:
        raise _fail(f"the capsule holds memory of device type {tensor.device.device_type}, "
                    "not host memory")
    dtype = _numpy_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    itemsize = max(1, tensor.dtype.bits // 8)
    if tensor.strides:
        strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim))
    else:  # C-contiguous
        strides = tuple(math.prod(shape[i + 1:]) * itemsize for i in range(len(shape)))
    _api.PyCapsule_SetName(capsule, _USED_NAME)  # ours now: the producer's capsule must not free it
    # NumPy has no bfloat16 typestr: the bits are read as unsigned integers and viewed.
    raw = np.dtype(f"u{itemsize}") if dtype == np.dtype(ml_dtypes.bfloat16) else dtype
    address = (tensor.data or 0) + tensor.byte_offset
    view = np.asarray(_Imported(managed, raw.str, shape, strides, address))
    return view.view(dtype) if raw != dtype else view


def from_dlpack(x: Any, *, copy: bool | None = None) -> Array:
    """A glue.Array of the DLPack producer `x` (anything with `__dlpack__`), sharing its host
    memory; a CUDA producer is asked for a copy in host memory."""
    if isinstance(x, Array):
        return x
    if type(x) is np.ndarray and copy is not True:  # also bfloat16, which NumPy cannot export
        return _glue_array(x)
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise _fail(f"{type(x).__name__} is not a DLPack producer (it has no __dlpack__)")
    device_type, _ = x.__dlpack_device__()
    if device_type in _HOST_DEVICES:
        capsule = x.__dlpack__() if copy is None else x.__dlpack__(copy=copy)
    else:
        try:
            capsule = x.__dlpack__(dl_device=(CPU, 0), copy=True)
        except (TypeError, BufferError) as err:
            raise _fail(f"{type(x).__name__} lives on device type {device_type} and could not give "
                        f"a copy in host memory ({err}); move it to the host first") from None
    return _glue_array(_consume(capsule))


def _glue_array(values: np.ndarray) -> Array:
    """`values` as a glue.Array: shared, unless glue keeps its dtype at another width."""
    dtype = dt.from_numpy(values.dtype)
    values = values if dtype.numpy == values.dtype else values.astype(dtype.numpy)
    return Array(values, TensorType(tuple(values.shape), dtype))  # as given: no x64 narrowing


install()

__all__ = ["from_dlpack", "install"]
