"""Element types of the IR and the promotion rules that combine them.

Promotion follows JAX's lattice: bool < int32 < int64 < {float16, bfloat16} < float32 < float64,
with float16 and bfloat16 joining to float32. Python scalars are *weakly typed*: they take the
dtype of the array they meet (a Python float meeting an integer array gives float32).
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """An element type; `name` is its short IR spelling (f32, bf16, i32, bool, ...)."""

    name: str
    kind: str  # "bool" | "int" | "float"
    bits: int
    numpy_name: str

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(ml_dtypes.bfloat16) if self.name == "bf16" else np.dtype(self.numpy_name)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


bool_ = DType("bool", "bool", 8, "bool")
int32 = DType("i32", "int", 32, "int32")
int64 = DType("i64", "int", 64, "int64")
float16 = DType("f16", "float", 16, "float16")
bfloat16 = DType("bf16", "float", 16, "bfloat16")
float32 = DType("f32", "float", 32, "float32")
float64 = DType("f64", "float", 64, "float64")

ALL_DTYPES: tuple[DType, ...] = (bool_, int32, int64, float16, bfloat16, float32, float64)
FLOAT_DTYPES: tuple[DType, ...] = (float16, bfloat16, float32, float64)
INT_DTYPES: tuple[DType, ...] = (int32, int64)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL_DTYPES}

_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in ALL_DTYPES}

DEFAULT_INT = int32
DEFAULT_FLOAT = float32

_RANK = {bool_: 0, int32: 1, int64: 2, float16: 3, bfloat16: 3, float32: 4, float64: 5}


def from_numpy(dt) -> DType:
    """The glue dtype of a NumPy dtype (or anything `np.dtype` accepts, or a DType)."""
    if isinstance(dt, DType):
        return dt
    known = _BY_NUMPY.get(dt) if isinstance(dt, np.dtype) else None
    if known is not None:  # the per-call path of jit: one dict lookup
        return known
    if isinstance(dt, str) and dt in BY_NAME:
        return BY_NAME[dt]
    npdt = np.dtype(dt)
    if npdt == np.dtype(ml_dtypes.bfloat16):
        return bfloat16
    for d in ALL_DTYPES:
        if d.name != "bf16" and np.dtype(d.numpy_name) == npdt:
            return d
    narrower = {"int8": int32, "int16": int32, "uint8": int32, "uint16": int32, "uint32": int64}
    if npdt.name in narrower:
        return narrower[npdt.name]
    from glue.errors import GlueTypeError

    raise GlueTypeError(f"glue does not support the NumPy dtype {npdt}")


def promote(a: DType, b: DType) -> DType:
    """The dtype two strongly typed operands are converted to."""
    if a == b:
        return a
    ra, rb = _RANK[a], _RANK[b]
    if ra == rb:  # f16 with bf16
        return float32
    return a if ra > rb else b


def weak_scalar_dtype(value) -> DType:
    """The dtype a Python scalar takes when it stands alone."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return DEFAULT_INT
    return DEFAULT_FLOAT


def promote_with_weak(strong: DType, scalar) -> DType:
    """The dtype of `strong` combined with a weakly typed Python scalar: the array's dtype
    unless the scalar is of a higher kind (a float meeting ints, an int meeting bools)."""
    weak = weak_scalar_dtype(scalar)
    return strong if _KIND_ORDER[weak.kind] <= _KIND_ORDER[strong.kind] else weak


_KIND_ORDER = {"bool": 0, "int": 1, "float": 2}
