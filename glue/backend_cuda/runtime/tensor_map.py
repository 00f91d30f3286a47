"""TMA descriptors: `cuTensorMapEncodeTiled` for a tile view of device memory, as the 128 bytes
a kernel takes by value.

Encoding is host work (no GPU call), a few microseconds through cuda.bindings; the executor
encodes a launch's maps when it fills the launch's parameters, which a graph replay skips, and
keeps the last few encodings by address for the calls that launch directly.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict

from glue.backend_cuda.runtime import driver as drv

MAP_BYTES = 128
_KEPT = 256
_encoded: "OrderedDict[tuple, bytes]" = OrderedDict()


def _data_type(name: str):
    types = drv.load().CUtensorMapDataType
    return {"bf16": types.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "f16": types.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            "f32": types.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, "tf32": types.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32}[name]


def encode(dtype: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...], address: int) -> bytes:
    """The descriptor of a tensor of `dims` elements (innermost first; `strides` in bytes for
    dims 1 on) at device `address`, loaded `box` elements at a time into shared memory with
    the 128-byte swizzle (the one codegen/hopper.py's kernels read); elements past the
    tensor's edge load as zeros."""
    key = (dtype, dims, strides, box, address)
    found = _encoded.get(key)
    if found is not None:
        return found
    d = drv.load()
    tensor_map = drv.check(d.cuTensorMapEncodeTiled(
        _data_type(dtype), len(dims), address, [d.cuuint64_t(n) for n in dims], [d.cuuint64_t(s) for s in strides],
        [d.cuuint32_t(n) for n in box], [d.cuuint32_t(1)] * len(dims),
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({dtype}, dims {dims}, strides {strides}, box {box}, address {address:#x})")
    encoded = ctypes.string_at(tensor_map.getPtr(), MAP_BYTES)
    _encoded[key] = encoded
    if len(_encoded) > _KEPT:
        _encoded.popitem(last=False)
    return encoded


__all__ = ["MAP_BYTES", "encode"]
