"""Elementwise helpers composed from `_core`: closeness tests and replacing non-finite values."""
from __future__ import annotations

from typing import Any

from glue.ir import dtypes as dt
from glue.numpy._core import (_broadcast_all, _dtype_of, _promote, abs, add, all, asarray, astype,
                              equal, isinf, isnan, less_equal, logical_and, logical_or, multiply,
                              subtract, where)
from glue.numpy._dtypes import finfo


def isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Any:
    """|a - b| <= atol + rtol |b| elementwise; infinities are close only to themselves, NaN to
    nothing (to NaN with equal_nan)."""
    a, b = _promote([a, b])
    if not _dtype_of(a).is_float:
        if _dtype_of(a) == dt.bool_:
            return equal(a, b)
        a, b = astype(a, dt.DEFAULT_FLOAT), astype(b, dt.DEFAULT_FLOAT)
    a, b = _broadcast_all("isclose", [a, b])
    near = less_equal(abs(subtract(a, b)), add(atol, multiply(rtol, abs(b))))
    infinite = logical_or(isinf(a), isinf(b))
    close = where(infinite, equal(a, b), near)
    return logical_or(close, logical_and(isnan(a), isnan(b))) if equal_nan else close


def allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Any:
    return all(isclose(a, b, rtol, atol, equal_nan))


def nan_to_num(x: Any, copy: bool = True, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Any:
    """NaN as `nan`, +inf as `posinf` and -inf as `neginf` (the dtype's largest and lowest
    finite values by default); integers and booleans are returned as they are."""
    x = asarray(x)
    d = _dtype_of(x)
    if not d.is_float:
        return x
    info = finfo(d)
    high = float(info.max) if posinf is None else posinf
    low = float(info.min) if neginf is None else neginf
    x = where(isnan(x), astype(nan, d), x)
    return where(isinf(x), where(x > 0, astype(high, d), astype(low, d)), x)


__all__ = ["isclose", "allclose", "nan_to_num"]
