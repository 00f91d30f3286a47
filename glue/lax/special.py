"""Special functions lax has beyond the primitives: erf_inv.

erf_inv is Giles's single-precision approximation ("Approximating the erfinv function", GPU
Computing Gems, 2011: a polynomial in w = -log(1 - x^2), one for the centre and one for the
tails), refined by Newton steps on erf where the dtype has more precision to give; +-1 map to
+-inf and |x| > 1 to NaN. Its derivative is the exact one, sqrt(pi)/2 * exp(erf_inv(x)^2),
through a custom JVP rule, not the derivative of the approximation.
"""
from __future__ import annotations

import math
from typing import Any

from glue.frontend.tracing import type_of
from glue.frontend.transforms import custom_jvp
from glue.lax import ops

_CENTRE = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
           -0.00417768164, 0.246640727, 1.50140941)
_TAILS = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
          0.00943887047, 1.00167406, 2.83297682)


def _polynomial(coefficients: tuple[float, ...], w: Any) -> Any:
    p = ops.mul(ops.add(ops.mul(w, 0.0), 1.0), coefficients[0])
    for c in coefficients[1:]:
        p = ops.add(ops.mul(p, w), c)
    return p


def _erf_inv(x: Any) -> Any:
    x = ops._operand(x)
    dtype = type_of(x).dtype
    w = ops.neg(ops.log(ops.mul(ops.sub(1.0, x), ops.add(1.0, x))))
    centre = _polynomial(_CENTRE, ops.sub(w, 2.5))
    tails = _polynomial(_TAILS, ops.sub(ops.sqrt(w), 3.0))
    y = ops.mul(ops.select(ops.lt(w, 5.0), centre, tails), x)
    for _ in range(2 if dtype.bits > 32 else 1 if dtype.bits == 32 else 0):
        slope = ops.mul(ops.exp(ops.neg(ops.square(y))), 2.0 / math.sqrt(math.pi))
        step = ops.div(ops.sub(ops.erf(y), x), slope)
        y = ops.select(ops.ne(slope, 0.0), ops.sub(y, step), y)
    edge = ops.mul(ops.sign(x), math.inf)
    y = ops.select(ops.eq(ops.abs(x), 1.0), edge, y)
    return ops.select(ops.gt(ops.abs(x), 1.0), ops.mul(x, math.nan), y)


@custom_jvp
def erf_inv(x: Any) -> Any:
    """The inverse of erf on (-1, 1) (jax.lax.erf_inv)."""
    return _erf_inv(x)


@erf_inv.defjvp
def _erf_inv_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    y = _erf_inv(x)
    return y, ops.mul(t, ops.mul(ops.exp(ops.square(y)), math.sqrt(math.pi) / 2))


__all__ = ["erf_inv"]
