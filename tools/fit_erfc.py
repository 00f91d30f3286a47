"""Fits the erfc polynomials of glue/codegen/mathlib.py (`erfc_q`, `erfc_zero`) and prints them.

For a = |x| >= 0.5 mathlib computes erfc(a) = e^(-a^2) (1 + q(t)) / (1 + 2a) with
t = (a - c) / (a + c). q is interpolated at Chebyshev nodes of t's range, from values of
erfcx(a) = e^(a^2) erfc(a) to 70 digits (a Taylor series of erf below 2.5, the continued
fraction of erfc above), by solving the Vandermonde system in the same precision; the
coefficients are then rounded to the format. erfc_zero is the first value of the format where
erfc rounds to zero.

    python tools/fit_erfc.py
"""
from __future__ import annotations

import math
from decimal import Decimal, getcontext

import numpy as np

getcontext().prec = 70
PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803")
SMALL = 0.5  # mathlib's _ERFC_POLY_MAX: below it erfc is 1 - erf
FORMATS = {"float32": (np.float32, 2.0, 8, -150), "float64": (np.float64, 3.0, 20, -1075)}


def erfcx(x: Decimal) -> Decimal:
    if x <= Decimal("2.5"):
        term = total = x
        n = 0
        while abs(term) > Decimal(10) ** -66:
            n += 1
            term = -term * x * x / n
            total += term / (2 * n + 1)
        return (x * x).exp() * (1 - 2 / PI.sqrt() * total)

    def fraction(depth: int) -> Decimal:
        f = x
        for k in range(depth, 0, -1):
            f = x + Decimal(k) / 2 / f
        return 1 / (PI.sqrt() * f)
    depth, value = 200, fraction(200)
    while True:
        deeper = fraction(2 * depth)
        if abs(deeper - value) < abs(deeper) * Decimal(10) ** -45:
            return deeper
        depth, value = 2 * depth, deeper


def erfc(x: float) -> Decimal:
    a = Decimal(x)
    return erfcx(a) * (-(a * a)).exp()


def q(t: Decimal, centre: float) -> Decimal:
    a = Decimal(centre) * (1 + t) / (1 - t)
    return (1 + 2 * a) * erfcx(a) - 1


def solve(matrix: list[list[Decimal]], rhs: list[Decimal]) -> list[Decimal]:
    """Gaussian elimination with partial pivoting, in Decimal."""
    n = len(rhs)
    rows = [row[:] + [b] for row, b in zip(matrix, rhs)]
    for i in range(n):
        pivot = max(range(i, n), key=lambda r: abs(rows[r][i]))
        rows[i], rows[pivot] = rows[pivot], rows[i]
        for r in range(i + 1, n):
            factor = rows[r][i] / rows[i][i]
            for c in range(i, n + 1):
                rows[r][c] -= factor * rows[i][c]
    out = [Decimal(0)] * n
    for i in reversed(range(n)):
        out[i] = (rows[i][n] - sum(rows[i][j] * out[j] for j in range(i + 1, n))) / rows[i][i]
    return out


def zero_point(dtype: type, smallest_exponent: int) -> float:
    """The first value of `dtype` from which erfc rounds to 0 (at most half the smallest
    subnormal)."""
    half = Decimal(2) ** smallest_exponent
    lo, hi = 5.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if erfc(mid) <= half else (mid, hi)
    point = dtype(hi)
    while erfc(float(np.nextafter(point, dtype(0)))) <= half:
        point = np.nextafter(point, dtype(0))
    while erfc(float(point)) > half:
        point = np.nextafter(point, dtype(100))
    return float(point)


def fit(name: str) -> None:
    dtype, centre, degree, smallest_exponent = FORMATS[name]
    zero = zero_point(dtype, smallest_exponent)
    lo, hi = (SMALL - centre) / (SMALL + centre), (zero - centre) / (zero + centre)
    n = degree + 1
    nodes = [Decimal((math.cos(math.pi * (k + 0.5) / n) + 1) / 2 * (hi - lo) + lo) for k in range(n)]
    coeffs = solve([[t ** j for j in range(n)] for t in nodes], [q(t, centre) for t in nodes])
    print(f"{name}: erfc_centre={centre}, erfc_zero={zero!r}")
    print(f"    erfc_q={tuple(float(dtype(float(c))) for c in coeffs)}")


if __name__ == "__main__":
    for fmt in FORMATS:
        fit(fmt)
