"""How close a result must be to the reference to count as correct, per dtype."""
from __future__ import annotations

import numpy as np

from glue.ir import dtypes as dt

# (relative, absolute) tolerances against a float64 reference.
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-9, 1e-12), "f32": (1e-5, 1e-6), "f16": (2e-3, 1e-4), "bf16": (1e-2, 1e-3),
}


def mismatch(actual: np.ndarray, expected: np.ndarray, dtype: dt.DType,
             scale: float = 1.0) -> str | None:
    """None when `actual` matches `expected` within `dtype`'s tolerance; else what differs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    if not dtype.is_float:
        bad = actual != expected.astype(actual.dtype)
    else:
        rtol, atol = TOLERANCES[dtype.name]
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        # The error allowed grows with the magnitudes the computation went through, not only
        # with the output's own size (a sum of large terms may cancel to a small result).
        with np.errstate(invalid="ignore"):
            close = np.isclose(a, e, rtol=rtol * scale, atol=atol * scale * max(1.0, float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0))))
        bad = ~(close | (np.isnan(a) & np.isnan(e)))
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ; first at {where}: "
            f"got {actual[where]!r}, expected {expected[where]!r}")
