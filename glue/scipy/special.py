"""`glue.scipy.special` (as `jax.scipy.special`): logsumexp with weights and signs, the error
functions, and the logistic pair expit / logit, xlogy."""
from __future__ import annotations

from typing import Any

import glue.numpy as gnp
from glue.frontend.tracing import bind, type_of
from glue.frontend.transforms import stop_gradient
from glue.ir import dtypes as dt


def _floating(x: Any) -> Any:
    x = gnp.asarray(x)
    return x if type_of(x).dtype.is_float else gnp.astype(x, dt.DEFAULT_FLOAT)


def erf(x: Any) -> Any:
    return bind("erf", _floating(x))


def erfc(x: Any) -> Any:
    """1 - erf(x), accurate where it is tiny (erfc(10) = 2.1e-45 in float32 is a subnormal)."""
    return bind("erfc", _floating(x))


def expit(x: Any) -> Any:
    """The logistic function 1 / (1 + e^-x)."""
    return bind("logistic", _floating(x))


def logit(p: Any) -> Any:
    """log(p / (1 - p)), the inverse of expit."""
    p = _floating(p)
    return gnp.log(gnp.true_divide(p, gnp.subtract(1, p)))


def xlogy(x: Any, y: Any) -> Any:
    """x * log(y), and 0 where x is 0 (also where y is 0); its derivatives are finite there."""
    x, y = gnp.asarray(x), gnp.asarray(y)
    dtype = gnp.result_dtype(x, y, 1.0)
    x, y = gnp.astype(x, dtype), gnp.astype(y, dtype)
    nonzero = gnp.not_equal(x, 0)
    safe_x, safe_y = gnp.where(nonzero, x, 1), gnp.where(nonzero, y, 1)
    return gnp.where(nonzero, gnp.multiply(safe_x, gnp.log(safe_y)), gnp.zeros_like(safe_x))


def logsumexp(a: Any, axis: Any = None, b: Any = None, keepdims: bool = False,
              return_sign: bool = False, where: Any = None) -> Any:
    """log(sum(b * exp(a))) along `axis`, shifted by the maximum so nothing overflows; rows that
    are all -inf give -inf. With `return_sign`, (log|sum|, sign(sum)); without, a negative sum
    gives NaN. float16 / bfloat16 compute in float32 and round back."""
    a = _floating(a)
    out_dtype = type_of(a).dtype
    a = gnp.astype(a, dt.float32) if out_dtype.bits < 32 else a
    peak = gnp.max(a, axis, keepdims=True, where=where, initial=-gnp.inf)
    peak = stop_gradient(gnp.where(gnp.isfinite(peak), peak, 0))  # all -inf (or +inf) shifts by 0
    terms = gnp.exp(gnp.subtract(a, peak))
    if b is not None:
        terms = gnp.multiply(terms, b)
    total = gnp.sum(terms, axis, keepdims=keepdims, where=where)
    sign = gnp.sign(total)
    out = gnp.add(gnp.log(gnp.abs(total)), peak if keepdims else gnp.squeeze(peak, _reduced(a, axis)))
    if return_sign:
        return gnp.astype(out, out_dtype), gnp.astype(sign, out_dtype)
    if b is not None:
        out = gnp.where(gnp.less(sign, 0), gnp.nan, out)
    return gnp.astype(out, out_dtype)


def _reduced(a: Any, axis: Any) -> tuple[int, ...]:
    ndim = type_of(a).ndim
    if axis is None:
        return tuple(range(ndim))
    return tuple(gnp._axis("logsumexp", a, x) for x in (axis if isinstance(axis, (tuple, list)) else (axis,)))


__all__ = ["erf", "erfc", "expit", "logit", "logsumexp", "xlogy"]
