"""How close a result must be to the reference to count as correct, per dtype; and which dtype's
tolerance applies to each output of a program."""
from __future__ import annotations

from typing import Any

import numpy as np

from glue.ir import Graph, Var
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


def least_precise(*dtypes: dt.DType | None) -> dt.DType | None:
    """The float dtype among `dtypes` whose rounding is coarsest (its tolerance the widest)."""
    floats = [d for d in dtypes if d is not None and d.is_float]
    return max(floats, key=lambda d: TOLERANCES[d.name][0], default=None)


# Primitives whose float32 products a TF32 backend may round (at a precision but "highest").
TF32_PRIMITIVES = frozenset({"dot_general", "attention", "attention_bwd"})


def tolerance_dtypes(graph: Graph, tf32: bool = False) -> list[dt.DType]:
    """The dtype whose tolerance applies to each output: for a float output, the least precise
    float dtype among the values it is computed from (rounding there bounds its accuracy);
    integer and bool outputs compare exactly. With `tf32` (a backend that runs float32
    contractions of precision "default" or "high" on TF32 tensor cores), such a contraction
    counts as bfloat16: TF32 keeps float16's 10 mantissa bits, but it rounds the *operands*, so
    each product is off by up to 2^-10 of itself and a sum of them may cancel to a result far
    smaller than its terms (where float16 inputs multiply exactly)."""
    dtypes: dict[int, set[dt.DType]] = {v.id: {v.type.dtype} for v in graph.constvars + graph.invars}

    def of(atom: Any) -> set[dt.DType]:
        return dtypes[atom.id] if isinstance(atom, Var) else {atom.type.dtype}

    for eqn in graph.eqns:
        found = {v.type.dtype for v in eqn.outvars}.union(*map(of, eqn.inputs))
        if tf32 and eqn.primitive in TF32_PRIMITIVES and eqn.param_dict.get("precision") != "highest" \
                and eqn.inputs[0].type.dtype == dt.float32:
            found.add(dt.bfloat16)
        for v in eqn.outvars:
            dtypes[v.id] = found
    return [least_precise(*of(a)) if a.type.dtype.is_float else a.type.dtype for a in graph.outvars]
