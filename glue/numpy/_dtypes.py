"""Dtypes as `jax.numpy` names them: a scalar type per glue dtype (`gnp.float32`, `gnp.bfloat16`,
`gnp.int32`, ...), NumPy's abstract types for `issubdtype`, `finfo` / `iinfo`, `result_type`.

The names come from `glue.ir.dtypes.ALL_DTYPES`, so a dtype added there appears here with its
NumPy name. Dtype arguments may be anything `to_dtype` reads (NumPy dtypes and types, names,
glue DTypes) or an array, whose dtype is meant.
"""
from __future__ import annotations

import abc
from typing import Any

import ml_dtypes
import numpy as np

from glue.frontend.array import Array
from glue.frontend.tracing import Tracer
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.numpy._core import _fail, _is_weak, result_dtype, to_dtype

SCALAR_TYPES: dict[str, type] = {d.numpy_name: d.numpy.type for d in dt.ALL_DTYPES}
globals().update(SCALAR_TYPES)  # gnp.float32, gnp.int32, gnp.bool, ... (one per glue dtype)
bool_ = dt.bool_.numpy.type

dtype = np.dtype
generic, number, inexact, floating = np.generic, np.number, np.inexact, np.floating
integer, signedinteger, unsignedinteger = np.integer, np.signedinteger, np.unsignedinteger
newaxis = None


class ndarray(abc.ABC):
    """The type of glue arrays, concrete (`glue.Array`) or traced: `isinstance(x, gnp.ndarray)`
    holds for both, as `isinstance(x, jnp.ndarray)` does in JAX, and not for NumPy arrays."""


ndarray.register(Array)
ndarray.register(Tracer)

# What each abstract NumPy type covers, by glue dtype kind (bfloat16 is not a NumPy floating
# type, but it is a glue float).
_ABSTRACT_KINDS = {
    np.generic: ("bool", "int", "uint", "float"), np.number: ("int", "uint", "float"),
    np.inexact: ("float",), np.floating: ("float",), np.integer: ("int", "uint"),
    np.signedinteger: ("int",), np.unsignedinteger: ("uint",), np.bool_: ("bool",),
}


def _kind(d: DType) -> str:
    return "uint" if d.kind == "int" and d.numpy.kind == "u" else d.kind


def _as_dtype(fn: str, x: Any, canonical: bool = True) -> DType:
    """The glue dtype `x` names, or the dtype of the array `x`: as traced programs have it, or
    (`canonical=False`) at its own width, as NumPy's and JAX's finfo/iinfo report it."""
    if hasattr(x, "aval"):
        return x.aval.dtype
    try:
        if not canonical:
            return dt.from_numpy(x.dtype if isinstance(x, np.ndarray) else x)
        return to_dtype(x.dtype if isinstance(x, np.ndarray) else x)
    except (TypeError, ValueError):
        raise _fail(fn, f"{x!r} is not a dtype glue supports") from None


def issubdtype(arg1: Any, arg2: Any) -> bool:
    """Whether dtype `arg1` is `arg2` or below it: `issubdtype(x.dtype, gnp.floating)`."""
    first = _as_dtype("issubdtype", arg1)
    if arg2 in _ABSTRACT_KINDS:
        return _kind(first) in _ABSTRACT_KINDS[arg2]
    return first == _as_dtype("issubdtype", arg2)


def finfo(dtype: Any) -> Any:
    """Machine limits of a float dtype (NumPy's finfo; bfloat16's from ml_dtypes)."""
    d = _as_dtype("finfo", dtype, canonical=False)
    if not d.is_float:
        raise _fail("finfo", f"needs a floating-point dtype, not {d}")
    return ml_dtypes.finfo(d.numpy)


def iinfo(dtype: Any) -> Any:
    """Machine limits of an integer dtype."""
    d = _as_dtype("iinfo", dtype, canonical=False)
    if not d.is_int:
        raise _fail("iinfo", f"needs an integer dtype, not {d}")
    return ml_dtypes.iinfo(d.numpy)


def result_type(*args: Any) -> np.dtype:
    """The dtype `args` (arrays, scalars, dtypes) promote to, by JAX's rules: Python scalars are
    weakly typed, everything else strongly."""
    if not args:
        raise _fail("result_type", "needs at least one argument")
    values = [a if _is_weak(a) or hasattr(a, "aval") or isinstance(a, (np.ndarray, np.generic))
              else np.zeros((), _as_dtype("result_type", a).numpy) for a in args]
    return result_dtype(*values).numpy


__all__ = [*SCALAR_TYPES, "bool_", "dtype", "generic", "number", "inexact", "floating", "integer",
           "signedinteger", "unsignedinteger", "newaxis", "ndarray", "issubdtype", "finfo",
           "iinfo", "result_type"]
