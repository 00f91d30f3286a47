"""Glue's math library: elementwise transcendental functions emitted as branch-free LLVM IR.

The code generator lowers elementwise math through `emit_unary` and `emit_pow`, which call
the function's routine for the operand's type: an internal `alwaysinline` function of the
module, defined on its first use, which LLVM's inliner expands at every call before any loop
is vectorised. A long fused chain thus costs the Python IR builder one call instruction per
use, not the routine's dozens of instructions (a 10,000-op tanh chain spent most of its code
build re-emitting the same polynomials). The operand is a `float` or `double`, or a vector of
them; the result has the operand's type. Nothing here calls libm or libdevice: the code uses
float and integer arithmetic, bitcasts, `select` and the intrinsics llvm.fma, llvm.fabs,
llvm.trunc, llvm.sqrt, llvm.copysign, llvm.minnum and llvm.maxnum, which x86-64 and NVPTX both
lower to instructions. With no branches and no lookup tables, LLVM's loop vectoriser turns a
loop around these functions into packed code.

Requirements on the caller's target: llvm.fma must be a hardware instruction (any NVPTX
target; x86-64 with the `fma` feature, i.e. x86-64-v3 and later, so create the target machine
with the host's CPU name and features) or LLVM lowers it to a libm call. The emitted code
relies on every operation rounding once: no fast-math flags or "unsafe-fp-math" attributes on
the enclosing function, and no flushing of subnormals (LLVM's default on both targets).

Accuracy, as the largest error seen in ulps of the exact result. float32: every input, checked
exhaustively against NumPy's float64 functions; every float32 result is within one ulp of the
correctly rounded one (tanh: two). float64: about 10^6 inputs per function (dense sweeps of the
range plus random encodings) against long-double or mpmath references; relative error
<= 3.3e-16.

    function   float32   float64   range
    exp        0.76      0.75      all inputs
    exp2       0.79      0.77      all inputs
    expm1      1.15      1.23      all inputs
    log        0.50      0.50      all inputs
    log2       0.50      0.50      all inputs
    log1p      0.77      0.76      all inputs
    tanh       2.42      0.79      all inputs
    logistic   1.43      0.71      all inputs
    erf        1.21      1.00      all inputs
    erfc       1.21      1.15      all inputs (float32: every third encoding; float64: 3.5e4
                                   inputs against 70-digit values)
    sin, cos   1.15      1.12      |x| <= 1e5 (float32), |x| <= 1e9 (float64)
    sqrt       0.50      0.50      all inputs (llvm.sqrt, correctly rounded)
    rsqrt      1.49      1.49      all inputs
    pow        0.64      1.08      sampled: |y ln x| up to 80 (float32) or 700 (float64),
                                   negative bases with integer y, bases near 1 with large y

Both targets execute the same IEEE operations, so x86-64 and NVPTX give bitwise identical
results (checked on an H200). Beyond the stated range, sin and cos return values in [-1, 1]
that carry no information.

Special values follow C99 Annex F, as NumPy does: NaN propagates, exp(-inf) = 0, exp overflows
to inf, log(0) = -inf, log(x < 0) = NaN, erf(±inf) = ±1, erfc(-inf) = 2, erfc(inf) = 0,
sin(±inf) = NaN, odd functions keep
the sign of zero, and pow follows the C99 table (pow(x, ±0) = 1, pow(1, y) = 1,
pow(-1, ±inf) = 1, pow(±0, y < 0) = ±inf or +inf, negative bases need integer exponents, ...).

float32 tanh trades accuracy for speed (it dominates GELU on the CPU): about 20 vector
instructions with no branch to select, rounding three times without compensation; see
`_tanh_single`.

How it works: each function reduces its argument to a small interval with exact or
double-word arithmetic (Cody-Waite with an FMA), evaluates a minimax polynomial there and
rebuilds the result with exponent arithmetic; special cases are patched with `select`. float32
and float64 run the same code; a `_Format` supplies the layout, the constants (rounded from
high-precision values at import) and the polynomial coefficients.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Callable

from llvmlite import ir

# pi/2 to 70 digits: the reduction constants of sin and cos are rounded from it exactly.
_PI_2 = Fraction("1.570796326794896619231321691639751442098584699687552910487472296153908")

_INF = math.inf
_NAN = math.nan

# Where tanh switches from its odd polynomial to the expm1 formula: from here on tanh >= 1/2,
# which keeps e / (e + 2) well conditioned.
_TANH_POLY_MAX = 0.55
# (e^2r - 1 - 2r) / (2 r^2) in r, |r| <= ln2/4: float32 tanh's polynomial, a relative minimax
# fit (0.04 ulp once rounded to float32).
_TANH_SINGLE_Q = (1.0, 0.6666666269302368, 0.333330899477005, 0.1333342343568802,
                  0.04461000859737396, 0.012701361440122128)
# Where erf switches from its odd polynomial to 1 - erfc.
_ERF_POLY_MAX = 1.0
# Below this erfc is 1 - erf from erf's polynomial: erf <= 0.52 there, so nothing cancels.
_ERFC_POLY_MAX = 0.5


def _round_to(value: Fraction, precision: int) -> float:
    """`value` rounded to nearest-even with `precision` significant bits (exponent unbounded)."""
    if value == 0:
        return 0.0
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    if abs(value) < Fraction(2) ** exponent:
        exponent -= 1
    ulp = Fraction(2) ** (exponent - precision + 1)
    return float(round(value / ulp) * ulp)


def _ln(value: Fraction) -> Fraction:
    """ln(value) for 1/2 <= value <= 2 to about 2^-130: the 2 atanh(s) series, in exact
    rational arithmetic."""
    s = (value - 1) / (value + 1)
    total, term, n = Fraction(0), s, 1
    while abs(term) > Fraction(1, 2**132):
        total += term / n
        term *= s * s
        n += 2
    return 2 * total


_LN2 = _ln(Fraction(2))


def _split(value: Fraction, parts: int, precision: int) -> tuple[float, ...]:
    """`value` as a sum of `parts` floats of `precision` bits, largest first."""
    out = []
    for _ in range(parts):
        out.append(_round_to(value, precision))
        value -= Fraction(out[-1])
    return tuple(out)


@dataclass(frozen=True)
class _Format:
    """An IEEE binary format: its layout and the polynomial coefficients fitted for it.

    The polynomials are Remez minimax fits, coefficients from the constant term up; each field
    names the function fitted and the interval. Fits are to the absolute error of the
    function fitted unless noted.
    """

    bits: int
    mantissa: int  # stored fraction bits
    struct_code: str
    # (e^r - 1 - r) / r^2 in r, |r| <= 0.35
    exp_q: tuple[float, ...]
    # (2 atanh(s) - 2 s) / s^3 in z = s^2 <= 0.0019
    log_q: tuple[float, ...]
    # (tanh(x) - x) / x^3 in z = x^2 <= _TANH_POLY_MAX^2 (float32 tanh needs none)
    tanh_q: tuple[float, ...]
    # erf(x) / x - 1 in z = x^2 <= _ERF_POLY_MAX^2
    erf_small: tuple[float, ...]
    # log(e^(x^2) erfc(x)) in u = x - 1 for x in [1, erf_one], weighted by erfc(x): the
    # error it makes in erf
    erf_large: tuple[float, ...]
    erf_one: float  # erf(x) rounds to 1 from here on
    # (1 + 2a) e^(a^2) erfc(a) - 1 in t = (a - erfc_centre) / (a + erfc_centre) for a in
    # [_ERFC_POLY_MAX, erfc_zero]: interpolated at Chebyshev nodes from 70-digit values (a
    # series, then a continued fraction), coefficients rounded to the format
    # (tools/fit_erfc.py prints them)
    erfc_q: tuple[float, ...]
    erfc_centre: float
    erfc_zero: float  # erfc(x) rounds to 0 from here on
    # (sin(r) - r) / r^3 in z = r^2 <= 0.64
    sin_q: tuple[float, ...]
    # (cos(r) - 1 + z/2) / z^2 in z = r^2 <= 0.64
    cos_q: tuple[float, ...]

    @property
    def precision(self) -> int:
        return self.mantissa + 1

    @property
    def bias(self) -> int:
        return (1 << (self.bits - self.mantissa - 2)) - 1

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    def bits_of(self, value: float) -> int:
        """The encoding of `value` (rounded to this format) as an unsigned integer."""
        return int.from_bytes(struct.pack("<" + self.struct_code, value), "little")

    @cached_property
    def ln2(self) -> tuple[float, float]:
        return _split(_LN2, 2, self.precision)

    @cached_property
    def log2e(self) -> tuple[float, float]:
        return _split(1 / _LN2, 2, self.precision)

    @cached_property
    def log_centres(self) -> tuple[tuple[float, float, float], ...]:
        """(c, ln(c) as hi and lo) for c ~ 2^(j/4), j = -1..2; c = 1 keeps log(1) exact."""
        centres = []
        for j in (-1, 0, 1, 2):
            c = _round_to(Fraction(2.0 ** (j / 4)), self.precision)
            centres.append((c, *_split(_ln(Fraction(c)), 2, self.precision)))
        return tuple(centres)

    @cached_property
    def pi_2(self) -> tuple[float, float, float]:
        return _split(_PI_2, 3, self.precision)

    @cached_property
    def two_over_pi(self) -> float:
        return _round_to(1 / _PI_2, self.precision)

    @property
    def shifter(self) -> float:
        # Adding it to |v| < 2^(p-2) rounds v to an integer held in the low mantissa bits.
        return 1.5 * 2.0 ** self.mantissa

    @property
    def exp_min(self) -> float:
        # e^x is below half the smallest subnormal here; 2^k still splits into normal halves.
        return -(self.bias + self.precision + 1) * math.log(2)

    @property
    def exp_max(self) -> float:
        # e^x overflows here, and the reduction's k stays at bias + 1.
        return (self.bias + 1.25) * math.log(2)

    @property
    def expm1_min(self) -> float:
        # e^x - 1 rounds to -1 from here down.
        return -(self.precision + 3) * math.log(2)

    @property
    def tanh_one(self) -> float:
        # tanh(x) rounds to 1 from here on.
        return (self.precision + 3) * math.log(2) / 2


_F32 = _Format(
    bits=32, mantissa=23, struct_code="f",
    exp_q=(0.5, 0.16666667, 0.041666456, 0.008333284, 0.0013934535, 0.00019908893),
    log_q=(0.6666667, 0.39999956, 0.28634882),
    tanh_q=(),
    erf_small=(0.12837917, -0.37612626, 0.112836, -0.026854444, 0.005189536, -0.0008020846,
               7.889134e-05),
    erf_large=(-0.8496055, -0.6389668, 0.15688166, -0.041500688, 0.009890892, -0.001826163,
               0.00018557394),
    erf_one=4.0,
    erfc_q=(0.27697837352752686, -0.09276360273361206, -0.16602976620197296,
            0.16404308378696442, -0.05422620475292206, -0.00795232504606247,
            0.008726430125534534, 0.0009575387230142951, -0.001359665533527732),
    erfc_centre=2.0,
    erfc_zero=10.054195404052734,
    sin_q=(-0.16666667, 0.008333332, -0.00019839997, 2.7238536e-06),
    cos_q=(0.041666664, -0.001388826, 2.453858e-05),
)

_F64 = _Format(
    bits=64, mantissa=52, struct_code="d",
    exp_q=(0.5000000000000001, 0.16666666666666674, 0.04166666666662067, 0.0083333333333213,
           0.0013888888918920982, 0.00019841269889337538, 2.4801518669458652e-05,
           2.7557239262796906e-06, 2.76213254432601e-07, 2.5111196381030355e-08),
    log_q=(0.6666666666666666, 0.3999999999998033, 0.28571428654218867, 0.22222100279174858,
           0.1825509712469402),
    tanh_q=(-0.3333333333333333, 0.13333333333332742, -0.05396825396746473,
            0.021869488494964066, -0.008863234425641126, 0.0035921107216412627,
            -0.001455664403684646, 0.0005889480065006473, -0.00023466830162824207,
            8.516530363056743e-05, -2.0637230969954685e-05),
    erf_small=(0.12837916709551256, -0.3761263890318355, 0.11283791670945252,
               -0.026866170643276035, 0.005223977607422264, -0.0008548325989651734,
               0.00012055295319469775, -1.4924744648903941e-05, 1.6447517554935387e-06,
               -1.6209175330749294e-07, 1.3722975089060772e-08, -7.801188822447732e-10),
    erf_large=(-0.8496055099332485, -0.6389675142347255, 0.15689274363783412,
               -0.04156109796708138, 0.010033824554235127, -0.001977897241491504,
               0.00023730019870003418, 2.634128907287244e-05, -2.72864173552133e-05,
               9.793573132377653e-06, -2.256263624264861e-06, 2.973446309579662e-07,
               7.821625939532848e-09, -1.383176093767406e-08, 3.198641739820188e-09,
               -3.626220724772972e-10, 1.7403492181585653e-11),
    erf_one=6.0,
    erfc_q=(0.2530080582697296, -0.13562110612458078, -0.04756229435343542,
            0.12964515870271198, -0.11927366341628368, 0.0683080273458098,
            -0.023770514894560082, 0.002529391783447931, 0.0018886900553867377,
            -0.0007798319433043914, -0.00010515757921020616, 0.0001250973075634416,
            4.939471979496412e-06, -2.0092416726901224e-05, -7.029703148141187e-07,
            3.4514887885560842e-06, 3.057548486732463e-07, -5.830561615486964e-07,
            -8.657895257924696e-08, 7.082103908871661e-08, 9.497690838508274e-09),
    erfc_centre=3.0,
    erfc_zero=27.226017111108366,
    sin_q=(-0.16666666666666663, 0.00833333333333047, -0.00019841269836046564,
           2.7557315739894046e-06, -2.5051057627566547e-08, 1.5912878767580318e-10),
    cos_q=(0.041666666666666664, -0.0013888888888887098, 2.4801587298320055e-05,
           -2.7557317044760464e-07, 2.0876099821456717e-09, -1.1379346638045143e-11),
)

_FORMATS: dict[type, _Format] = {ir.FloatType: _F32, ir.DoubleType: _F64}

Value = ir.Value
Operand = ir.Value | float | int  # Python numbers become constants of the operation's type


class _Ops:
    """Instruction builders for one float type (scalar or vector) and its same-width integers.

    They keep the algorithms below readable as arithmetic: Python numbers passed as operands
    become constants of the right type, and intrinsics are declared on first use.
    """

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        scalar = ty.element if isinstance(ty, ir.VectorType) else ty
        fmt = _FORMATS.get(type(scalar))
        if fmt is None:
            raise TypeError(f"mathlib takes float or double scalars or vectors, not {ty}")
        self.b = builder
        self.ty = ty
        self.fmt = fmt
        self.ity = ir.IntType(fmt.bits)
        self._suffix = f"f{fmt.bits}"
        if isinstance(ty, ir.VectorType):
            self.ity = ir.VectorType(self.ity, ty.count)
            self._suffix = f"v{ty.count}{self._suffix}"

    def _f(self, v: Operand) -> ir.Value:
        return v if isinstance(v, ir.Value) else ir.Constant(self.ty, float(v))

    def _i(self, v: Operand) -> ir.Value:
        return v if isinstance(v, ir.Value) else ir.Constant(self.ity, v)

    def _intrinsic(self, name: str, *args: Operand) -> ir.Value:
        full_name = f"llvm.{name}.{self._suffix}"
        module = self.b.module
        fn = module.globals.get(full_name)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * len(args)), full_name)
        return self.b.call(fn, [self._f(a) for a in args])

    # Float arithmetic. No fast-math flags anywhere: the error-free transformations below
    # depend on every operation rounding exactly once.
    def add(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.fadd(self._f(a), self._f(b))

    def sub(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.fsub(self._f(a), self._f(b))

    def mul(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.fmul(self._f(a), self._f(b))

    def div(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.fdiv(self._f(a), self._f(b))

    def neg(self, a: ir.Value) -> ir.Value:
        return self.b.fneg(a)

    def fma(self, a: Operand, b: Operand, c: Operand) -> ir.Value:
        return self._intrinsic("fma", a, b, c)

    def abs(self, a: ir.Value) -> ir.Value:
        return self._intrinsic("fabs", a)

    def copysign(self, magnitude: ir.Value, sign: ir.Value) -> ir.Value:
        return self._intrinsic("copysign", magnitude, sign)

    def trunc(self, a: ir.Value) -> ir.Value:
        return self._intrinsic("trunc", a)

    def sqrt(self, a: ir.Value) -> ir.Value:
        return self._intrinsic("sqrt", a)

    def clamp(self, a: ir.Value, lo: float, hi: float) -> ir.Value:
        """`a` limited to [lo, hi]; NaN becomes `lo` (callers patch NaN afterwards)."""
        return self._intrinsic("minnum", self._intrinsic("maxnum", a, lo), hi)

    def horner(self, v: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        acc = self._f(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, v, c)
        return acc

    def two_sum(self, a: Operand, b: Operand) -> tuple[ir.Value, ir.Value]:
        """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth)."""
        a, b = self._f(a), self._f(b)
        s = self.add(a, b)
        bb = self.sub(s, a)
        return s, self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))

    def fast_two_sum(self, a: Operand, b: Operand) -> tuple[ir.Value, ir.Value]:
        """two_sum for |a| >= |b| or a = 0 (Dekker), in three operations."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))

    # Comparisons are ordered (false when an operand is NaN) unless the name says otherwise.
    def cmp(self, op: str, a: Operand, b: Operand) -> ir.Value:
        return self.b.fcmp_ordered(op, self._f(a), self._f(b))

    def lt_or_nan(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.fcmp_unordered("<", self._f(a), self._f(b))

    def is_nan(self, a: Operand, b: Operand | None = None) -> ir.Value:
        """True where `a` (or `b`) is NaN."""
        return self.b.fcmp_unordered("uno", self._f(a), self._f(a if b is None else b))

    def select(self, cond: ir.Value, a: Operand, b: Operand) -> ir.Value:
        return self.b.select(cond, self._f(a), self._f(b))

    def and_(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.and_(a, b)

    def xor(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.xor(a, b)

    def not_(self, a: ir.Value) -> ir.Value:
        return self.b.not_(a)

    def or_(self, *conds: ir.Value) -> ir.Value:
        out = conds[0]
        for c in conds[1:]:
            out = self.b.or_(out, c)
        return out

    # Integer views of the same bits.
    def bits(self, a: ir.Value) -> ir.Value:
        return self.b.bitcast(a, self.ity)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.ty)

    def iadd(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.add(self._i(a), self._i(b))

    def isub(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.sub(self._i(a), self._i(b))

    def iand(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.and_(self._i(a), self._i(b))

    def ixor(self, a: Operand, b: Operand) -> ir.Value:
        return self.b.xor(self._i(a), self._i(b))

    def shl(self, a: Operand, n: int) -> ir.Value:
        return self.b.shl(self._i(a), self._i(n))

    def ashr(self, a: Operand, n: int) -> ir.Value:
        return self.b.ashr(self._i(a), self._i(n))

    def icmp(self, op: str, a: Operand, b: Operand) -> ir.Value:
        return self.b.icmp_signed(op, self._i(a), self._i(b))

    def iselect(self, cond: ir.Value, a: Operand, b: Operand) -> ir.Value:
        return self.b.select(cond, self._i(a), self._i(b))

    # Conversions through the shifter constant: packed float<->int64 conversions do not exist
    # on AVX2, and this also rounds without a separate instruction.
    def nearest_int(self, a: Operand, b: Operand) -> tuple[ir.Value, ir.Value]:
        """a*b rounded to the nearest integer (|a*b| < 2^(p-2)), as a float and as an integer."""
        shifter = self.fmt.shifter
        shifted = self.fma(a, b, shifter)
        as_int = self.isub(self.bits(shifted), self.fmt.bits_of(shifter))
        return self.sub(shifted, shifter), as_int

    def to_float(self, i: ir.Value) -> ir.Value:
        """The integer `i` (|i| < 2^(p-2)) as a float."""
        shifter = self.fmt.shifter
        return self.sub(self.from_bits(self.iadd(i, self.fmt.bits_of(shifter))), shifter)

    def pow2(self, i: ir.Value) -> ir.Value:
        """2^i for an integer i within the normal exponent range."""
        return self.from_bits(self.shl(self.iadd(i, self.fmt.bias), self.fmt.mantissa))



# ---- exp family -------------------------------------------------------------------------

def _exp_reduce(o: _Ops, x_hi: Value, x_lo: Value | None = None) -> tuple[Value, Value, Value]:
    """Cody-Waite: x = k ln2 + r, |r| <= ln2/2; returns (k as integer, r_hi, r_lo)."""
    k, k_int = o.nearest_int(x_hi, o.fmt.log2e[0])
    ln2_hi, ln2_lo = o.fmt.ln2
    # Exact: x_hi and k*ln2_hi are within ln2/2 of each other on a grid of ln2_hi's last place.
    r_hi = o.fma(k, -ln2_hi, x_hi)
    r_lo = o.mul(k, -ln2_lo) if x_lo is None else o.fma(k, -ln2_lo, x_lo)
    return k_int, r_hi, r_lo


def _exp2_reduce(o: _Ops, x: Value) -> tuple[Value, Value, Value]:
    """x = k + f, |f| <= 1/2, and f ln2 as r_hi + r_lo; returns (k as integer, r_hi, r_lo).

    The product is double-word so that exp2 of an integer is exact.
    """
    ln2_hi, ln2_lo = o.fmt.ln2
    k, k_int = o.nearest_int(x, 1.0)
    f = o.sub(x, k)  # exact
    r_hi = o.mul(f, ln2_hi)
    return k_int, r_hi, o.fma(f, ln2_lo, o.fma(f, ln2_hi, o.neg(r_hi)))


def _exp_tail(o: _Ops, r_hi: Value, r_lo: Value) -> Value:
    """t = r_lo + r^2 Q(r), so that e^(r_hi + r_lo) = 1 + r_hi + t."""
    r = o.add(r_hi, r_lo)
    return o.fma(o.mul(r, r), o.horner(r, o.fmt.exp_q), r_lo)


def _exp_mantissa(o: _Ops, r_hi: Value, r_lo: Value) -> tuple[Value, Value]:
    """(a, t) with e^(r_hi + r_lo) = a + t, a = fl(1 + r_hi) and t the small rest.

    Splitting 1 + r_hi exactly means fl(a + t) rounds only once.
    """
    a, err = o.fast_two_sum(1.0, r_hi)
    return a, o.add(err, _exp_tail(o, r_hi, r_lo))


def _scale(o: _Ops, v: Value, k_int: Value) -> Value:
    """v * 2^k for k up to bias + 1 either way: two normal factors, one final rounding."""
    half = o.ashr(k_int, 1)
    return o.mul(o.mul(v, o.pow2(half)), o.pow2(o.isub(k_int, half)))


def _exp_core(o: _Ops, x_hi: Value, x_lo: Value | None = None) -> Value:
    """e^(x_hi + x_lo) for x_hi in [exp_min, exp_max]."""
    k_int, r_hi, r_lo = _exp_reduce(o, x_hi, x_lo)
    return _scale(o, o.add(*_exp_mantissa(o, r_hi, r_lo)), k_int)


def _expm1_core(o: _Ops, x: Value) -> Value:
    """e^x - 1 for x in [expm1_min, exp_max]."""
    k_int, r_hi, r_lo = _exp_reduce(o, x)
    tail = _exp_tail(o, r_hi, r_lo)
    # 2^k (1 + r_hi + tail) - 1 = s * (t r_hi + (t - 1/s) + t tail) with t = 2^k / s. t - 1/s
    # is exact, so the only roundings are two fmas; s = 2 for k > 0 keeps t finite up to the
    # overflow threshold without touching results near zero.
    positive = o.icmp(">", k_int, 0)
    t = o.pow2(o.isub(k_int, o.iselect(positive, 1, 0)))
    u = o.fma(t, r_hi, o.sub(t, o.select(positive, 0.5, 1.0)))
    return o.mul(o.select(positive, 2.0, 1.0), o.fma(t, tail, u))


def _divide(o: _Ops, a_hi: Value, a_lo: Operand, d_hi: Value, d_lo: Value) -> Value:
    """(a_hi + a_lo) / (d_hi + d_lo) for double-word operands, refined once from the remainder.

    Rounding the operands and the quotient separately would cost up to two ulps.
    """
    inv = o.div(1.0, d_hi)
    q = o.mul(a_hi, inv)
    remainder = o.fma(o.neg(q), d_lo, o.add(o.fma(o.neg(q), d_hi, a_hi), a_lo))
    return o.fma(remainder, inv, q)


def _exp(o: _Ops, x: Value) -> Value:
    result = _exp_core(o, o.clamp(x, o.fmt.exp_min, o.fmt.exp_max))
    return o.select(o.is_nan(x), x, result)


def _exp2(o: _Ops, x: Value) -> Value:
    xc = o.clamp(x, o.fmt.exp_min / math.log(2), o.fmt.exp_max / math.log(2))
    k_int, r_hi, r_lo = _exp2_reduce(o, xc)
    result = _scale(o, o.add(*_exp_mantissa(o, r_hi, r_lo)), k_int)
    return o.select(o.is_nan(x), x, result)


def _expm1(o: _Ops, x: Value) -> Value:
    result = _expm1_core(o, o.clamp(x, o.fmt.expm1_min, o.fmt.exp_max))
    return o.select(o.or_(o.is_nan(x), o.cmp("==", x, 0.0)), x, result)


def _tanh(o: _Ops, x: Value) -> Value:
    if o.fmt.bits == 32:
        return _tanh_single(o, x)
    ax = o.abs(x)
    z = o.mul(x, x)
    small = o.fma(o.mul(ax, z), o.horner(z, o.fmt.tanh_q), ax)
    # tanh|x| = e / (e + 2) with e = expm1(2|x|)
    e = _expm1_core(o, o.mul(o.clamp(ax, 0.0, o.fmt.tanh_one), 2.0))
    large = _divide(o, e, 0.0, *o.fast_two_sum(e, 2.0))  # e >= 2 here
    result = o.copysign(o.select(o.cmp("<", ax, _TANH_POLY_MAX), small, large), x)
    return o.select(o.is_nan(x), x, result)


def _tanh_single(o: _Ops, x: Value) -> Value:
    """float32 tanh as y / (1 + y) with y = (e^2|x| - 1) / 2, within 2 ulp of the rounded result.

    The reduction |x| = k ln2/2 + r, |r| <= ln2/4, takes one fma: with c = ln2/2 rounded to
    float32 (0.03 of its last place off, k <= 27) and k >= 1 only from |x| > 0.17, |x| and
    k c lie on the grid of 2^-26 and r < 1/4 fits, so r is exact. y = 2^k h + (2^k - 1)/2
    with h = (e^2r - 1)/2 rounds once, 1 + y and the quotient once each; nothing compensates
    those three roundings, which keeps this at about 20 instructions. The worst cases
    (2.42 ulp) have tanh|x| just below a power of two and y just above it while 1 + y is
    just above 1, where all three roundings reach their largest relative size.
    """
    ax = o.abs(x)
    # From tanh_one on the quotient rounds to 1; the clamp keeps k in range (and NaN).
    a = o.select(o.cmp("<", o.fmt.tanh_one, ax), o.fmt.tanh_one, ax)
    half_ln2 = o.fmt.ln2[0] / 2
    shifted = o.fma(a, 2 * o.fmt.log2e[0], o.fmt.shifter)
    r = o.fma(o.sub(shifted, o.fmt.shifter), -half_ln2, a)
    h = o.fma(o.mul(r, r), o.horner(r, _TANH_SINGLE_Q), r)
    # 2^k straight from the shifter's bits: k sits in the low mantissa bits.
    scale = o.from_bits(o.shl(o.iadd(o.bits(shifted), o.fmt.bias - o.fmt.bits_of(o.fmt.shifter)),
                              o.fmt.mantissa))
    y = o.fma(scale, h, o.fma(scale, 0.5, -0.5))
    return o.copysign(o.div(y, o.add(y, 1.0)), x)


def _logistic(o: _Ops, x: Value) -> Value:
    # 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = e^-|x| as a double-word e_hi + e_lo
    # so that neither the sum nor the quotient rounds before the end.
    if o.fmt.bits == 32:
        return _logistic_single(o, x)
    k_int, r_hi, r_lo = _exp_reduce(o, o.clamp(o.neg(o.abs(x)), o.fmt.exp_min, 0.0))
    e_hi, e_lo = o.fast_two_sum(*_exp_mantissa(o, r_hi, r_lo))
    e_hi, e_lo = _scale(o, e_hi, k_int), _scale(o, e_lo, k_int)
    d_hi, d_err = o.fast_two_sum(1.0, e_hi)
    negative = o.cmp("<", x, 0.0)
    result = _divide(o, o.select(negative, e_hi, 1.0), o.select(negative, e_lo, 0.0),
                     d_hi, o.add(d_err, e_lo))
    return o.select(o.is_nan(x), x, result)


def _logistic_single(o: _Ops, x: Value) -> Value:
    """float32 logistic from the float32 exp: e = e^-|x| rounded once (0.76 ulp), 1 + e split
    exactly, and one refined quotient. e's error reaches the result damped by 1 / (1 + e), so
    the result stays within about 1.3 ulp, at half the instructions of the double-word form."""
    e = _exp_core(o, o.clamp(o.neg(o.abs(x)), o.fmt.exp_min, 0.0))
    d_hi, d_lo = o.fast_two_sum(1.0, e)
    result = _divide(o, o.select(o.cmp("<", x, 0.0), e, 1.0), 0.0, d_hi, d_lo)
    return o.select(o.is_nan(x), x, result)


def _erf(o: _Ops, x: Value) -> Value:
    ax = o.abs(x)
    small = o.fma(ax, o.horner(o.mul(x, x), o.fmt.erf_small), ax)
    # erf = 1 - e^(L(x) - x^2) with L = log(e^(x^2) erfc(x)); the fma forms L - x^2 exactly
    # rounded, so x^2 needs no extra precision.
    xc = o.clamp(ax, _ERF_POLY_MAX, o.fmt.erf_one)
    exponent = o.fma(o.neg(xc), xc, o.horner(o.sub(xc, 1.0), o.fmt.erf_large))
    large = o.sub(1.0, _exp_core(o, exponent))
    result = o.copysign(o.select(o.cmp("<", ax, _ERF_POLY_MAX), small, large), x)
    return o.select(o.is_nan(x), x, result)


def _erfc(o: _Ops, x: Value) -> Value:
    """1 - x (1 + p(x^2)) from erf's polynomial for |x| < _ERFC_POLY_MAX; beyond, for a = |x|,
    erfc(a) = e^(-a^2) (1 + q(t)) / (1 + 2a), where the scaled function (between 1 and
    2/sqrt(pi)) is smooth in t = (a - c) / (a + c) out to the underflow point, and 2 - erfc(a)
    for negative x. a^2 enters exactly as a double word and e^(-a^2) stays an unrounded
    mantissa and a power of two, so the tail keeps its relative accuracy down to subnormals."""
    fmt = o.fmt
    one_minus_x, err = o.two_sum(1.0, o.neg(x))
    small = o.add(one_minus_x, o.fma(o.neg(x), o.horner(o.mul(x, x), fmt.erf_small), err))
    a = o.abs(x)
    ac = o.clamp(a, _ERFC_POLY_MAX, fmt.erfc_zero)
    centre = fmt.erfc_centre
    q = o.horner(o.div(o.sub(ac, centre), o.add(ac, centre)), fmt.erfc_q)
    square = o.mul(ac, ac)
    k_int, r_hi, r_lo = _exp_reduce(o, o.neg(square), o.fma(o.neg(ac), ac, square))
    m_hi, m_lo = _exp_mantissa(o, r_hi, r_lo)  # e^(-a^2) = 2^k (m_hi + m_lo)
    # (m_hi + m_lo)(1 + q) as a double word over 1 + 2a (exact as one), divided rounding once
    p_hi = o.mul(m_hi, q)
    n_hi, n_err = o.fast_two_sum(m_hi, p_hi)  # q < 1/7: |m_hi| > |p_hi|
    n_lo = o.add(n_err, o.add(o.fma(m_hi, q, o.neg(p_hi)), o.fma(m_lo, q, m_lo)))
    d_hi, d_lo = o.two_sum(1.0, o.add(ac, ac))
    tail = _scale(o, _divide(o, n_hi, n_lo, d_hi, d_lo), k_int)
    tail = o.select(o.cmp(">=", a, fmt.erfc_zero), 0.0, tail)
    large = o.select(o.cmp("<", x, 0.0), o.sub(2.0, tail), tail)
    result = o.select(o.cmp("<", a, _ERFC_POLY_MAX), small, large)
    return o.select(o.is_nan(x), x, result)


# ---- log family -------------------------------------------------------------------------

def _log_parts(o: _Ops, x_hi: Value, x_lo: Value | None = None) -> tuple[Value, Value, Value]:
    """x = x_hi + x_lo > 0 (finite) as 2^k e^(l_hi + l_lo), |l| < 1/2; returns (k, l_hi, l_lo).

    l_hi + l_lo is log(x / 2^k) to about 2^-(p+10) relative, so callers can round once (log,
    log2, log1p) or keep the pair (pow, where y log x magnifies its error).
    """
    fmt = o.fmt
    tiny = o.cmp("<", x_hi, fmt.min_normal)
    # Subnormals are scaled to normal first so their exponent can be read from the bits.
    scaled = o.select(tiny, o.mul(x_hi, 2.0 ** fmt.precision), x_hi)
    bits = o.bits(scaled)
    # The exponent k that puts the mantissa m in [2^(-3/8), 2^(5/8)): four quarter-octaves,
    # each centred on a c = 2^(j/4) with a known log, leave |log(m/c)| <= ln(2)/8.
    k_int = o.ashr(o.isub(bits, fmt.bits_of(2.0 ** -0.375)), fmt.mantissa)
    m = o.from_bits(o.isub(bits, o.shl(k_int, fmt.mantissa)))
    k = o.sub(o.to_float(k_int), o.select(tiny, float(fmt.precision), 0.0))
    centre, ln_c_hi, ln_c_lo = fmt.log_centres[0]
    for j, (c_j, hi_j, lo_j) in enumerate(fmt.log_centres[1:]):
        above = o.cmp(">=", m, 2.0 ** ((2 * j - 1) / 8))
        centre = o.select(above, c_j, centre)
        ln_c_hi = o.select(above, hi_j, ln_c_hi)
        ln_c_lo = o.select(above, lo_j, ln_c_lo)
    # log(m/c) = 2 atanh(s) with s = (m - c) / (m + c) as a double-word quotient s_hi + s_lo;
    # |s| <= 0.0433, so the series in s^2 is short.
    n = o.sub(m, centre)  # exact: m and c are within a factor 2^(1/8)
    d_hi, d_lo = o.fast_two_sum(o.add(centre, centre), n)
    inv = o.div(1.0, d_hi)
    s_hi = o.mul(n, inv)
    remainder = o.fma(o.neg(s_hi), d_hi, n)
    if x_lo is not None:
        # x_lo / 2^k; it only matters beside a normal x_hi (log1p), and k is capped so the
        # scale stays normal where the term is far below the last place anyway.
        exponent = o.isub(0, k_int)
        exponent = o.iselect(o.icmp("<", exponent, 1 - fmt.bias), 1 - fmt.bias, exponent)
        n_lo = o.mul(x_lo, o.pow2(exponent))
        d_lo = o.add(d_lo, n_lo)
        remainder = o.add(remainder, n_lo)
    s_lo = o.mul(o.fma(o.neg(s_hi), d_lo, remainder), inv)
    z = o.mul(s_hi, s_hi)
    # s_lo enters through the derivative of 2 atanh(s), 2 / (1 - s^2) ~ 2 (1 + z).
    two_s_lo = o.add(s_lo, s_lo)
    tail = o.fma(o.mul(s_hi, z), o.horner(z, fmt.log_q), o.fma(two_s_lo, z, two_s_lo))
    l_hi, err = o.fast_two_sum(ln_c_hi, o.add(s_hi, s_hi))  # |ln c| > |2 s| unless c = 1
    return k, l_hi, o.add(err, o.add(ln_c_lo, tail))


def _ln_pair(o: _Ops, k: Value, l_hi: Value, l_lo: Value) -> tuple[Value, Value]:
    """k ln2 + l_hi + l_lo as hi + lo with hi = fl(hi + lo)."""
    ln2_hi, ln2_lo = o.fmt.ln2
    a_hi = o.mul(k, ln2_hi)
    a_lo = o.fma(k, ln2_hi, o.neg(a_hi))
    hi, err = o.fast_two_sum(a_hi, l_hi)  # |k ln2| > 1/2 > |l| unless k = 0
    return o.fast_two_sum(hi, o.add(err, o.add(a_lo, o.fma(k, ln2_lo, l_lo))))


def _log_domain(o: _Ops, x: Value, result: Value, pole: float) -> Value:
    """Patches a log-like result: -inf at `pole`, NaN below it or for NaN, +inf at +inf."""
    result = o.select(o.cmp("==", x, _INF), _INF, result)
    result = o.select(o.cmp("==", x, pole), -_INF, result)
    return o.select(o.lt_or_nan(x, pole), _NAN, result)


def _log(o: _Ops, x: Value) -> Value:
    hi, lo = _ln_pair(o, *_log_parts(o, x))
    return _log_domain(o, x, o.add(hi, lo), 0.0)


def _log2(o: _Ops, x: Value) -> Value:
    k, l_hi, l_lo = _log_parts(o, x)
    e_hi, e_lo = o.fmt.log2e
    b_hi = o.mul(l_hi, e_hi)
    b_lo = o.add(o.fma(l_hi, e_hi, o.neg(b_hi)), o.fma(l_hi, e_lo, o.mul(l_lo, e_hi)))
    hi, err = o.fast_two_sum(k, b_hi)  # |k| >= 1 > |l| log2(e) unless k = 0
    return _log_domain(o, x, o.add(hi, o.add(err, b_lo)), 0.0)


def _log1p(o: _Ops, x: Value) -> Value:
    u_hi, u_lo = o.two_sum(1.0, x)
    hi, lo = _ln_pair(o, *_log_parts(o, u_hi, u_lo))
    result = _log_domain(o, x, o.add(hi, lo), -1.0)
    # log1p(x) rounds to x there; this also keeps -0 and subnormals, which the pair loses.
    return o.select(o.cmp("<", o.abs(x), 2.0 ** -o.fmt.precision), x, result)


# ---- trigonometric ----------------------------------------------------------------------

def _sin_cos(o: _Ops, x: Value, quadrant_offset: int) -> Value:
    """sin(x + quadrant_offset * pi/2)."""
    finite = o.cmp("<", o.abs(x), _INF)
    x = o.select(finite, x, 0.0)  # keeps inf - inf out of the reduction
    k, k_int = o.nearest_int(x, o.fmt.two_over_pi)
    c1, c2, c3 = o.fmt.pi_2
    # x - k pi/2 as r_hi + r_lo. The first step is exact (x and k*c1 agree to within 1 on c1's
    # grid); the rounding error of the second is recovered exactly and the third is small.
    r1 = o.fma(k, -c1, x)
    p = o.mul(k, c2)
    p_err = o.fma(k, c2, o.neg(p))
    s, s_err = o.two_sum(r1, o.neg(p))
    r_hi, r_lo = o.fast_two_sum(s, o.sub(s_err, o.fma(k, c3, p_err)))
    z = o.mul(r_hi, r_hi)
    sin_r = o.add(r_hi, o.fma(o.mul(r_hi, z), o.horner(z, o.fmt.sin_q), r_lo))
    cos_r = o.add(1.0, o.fma(z, o.fma(z, o.horner(z, o.fmt.cos_q), -0.5),
                             o.neg(o.mul(r_hi, r_lo))))
    quadrant = o.iadd(k_int, quadrant_offset)
    result = o.select(o.icmp("!=", o.iand(quadrant, 1), 0), cos_r, sin_r)
    # Quadrants 2 and 3 negate: bit 1 of the quadrant moves to the sign bit.
    sign = o.shl(o.iand(quadrant, 2), o.fmt.bits - 2)
    result = o.clamp(o.from_bits(o.ixor(o.bits(result), sign)), -1.0, 1.0)
    return o.select(finite, result, _NAN)


def _sin(o: _Ops, x: Value) -> Value:
    return o.select(o.cmp("==", x, 0.0), x, _sin_cos(o, x, 0))


def _cos(o: _Ops, x: Value) -> Value:
    return _sin_cos(o, x, 1)


# ---- roots and powers -------------------------------------------------------------------

def _sqrt(o: _Ops, x: Value) -> Value:
    return o.sqrt(x)


def _rsqrt(o: _Ops, x: Value) -> Value:
    return o.div(1.0, o.sqrt(x))


def _pow(o: _Ops, x: Value, y: Value) -> Value:
    fmt = o.fmt
    ax = o.abs(x)
    # |x|^y = e^(y log|x|) with y log|x| as a double-word product.
    l_hi, l_lo = _ln_pair(o, *_log_parts(o, ax))
    p_hi = o.mul(y, l_hi)
    p_lo = o.fma(y, l_lo, o.fma(y, l_hi, o.neg(p_hi)))
    clamped = o.clamp(p_hi, fmt.exp_min, fmt.exp_max)
    # Past the clamp the result is 0 or inf whatever the low part (which may be inf or NaN).
    p_lo = o.select(o.cmp("==", clamped, p_hi), p_lo, 0.0)
    magnitude = _exp_core(o, clamped, p_lo)

    y_int = o.cmp("==", o.trunc(y), y)
    half_y = o.mul(y, 0.5)
    y_odd = o.and_(y_int, o.cmp("!=", o.trunc(half_y), half_y))
    y_inf = o.cmp("==", o.abs(y), _INF)
    # |x| in {0, inf} or y = ±inf: the result is 0 or inf, inf when |x| > 1 and y > 0 agree.
    extreme = o.or_(o.cmp("==", ax, 0.0), o.cmp("==", ax, _INF), y_inf)
    grows = o.xor(o.cmp(">", ax, 1.0), o.cmp("<", y, 0.0))
    magnitude = o.select(extreme, o.select(grows, _INF, 0.0), magnitude)
    result = o.select(y_odd, o.copysign(magnitude, x), magnitude)
    negative_base = o.and_(o.cmp("<", x, 0.0), o.cmp("<", ax, _INF))
    result = o.select(o.or_(o.and_(negative_base, o.not_(y_int)), o.is_nan(x, y)),
                      _NAN, result)
    one = o.or_(o.cmp("==", y, 0.0), o.cmp("==", x, 1.0),
                o.and_(o.cmp("==", x, -1.0), y_inf))
    return o.select(one, 1.0, result)


_UNARY: dict[str, Callable[[_Ops, Value], Value]] = {
    "exp": _exp,
    "exp2": _exp2,
    "expm1": _expm1,
    "log": _log,
    "log2": _log2,
    "log1p": _log1p,
    "tanh": _tanh,
    "logistic": _logistic,
    "erf": _erf,
    "erfc": _erfc,
    "sin": _sin,
    "cos": _cos,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
}

UNARY_FUNCTIONS: frozenset[str] = frozenset(_UNARY)


def _routine(module: ir.Module, name: str, ty: ir.Type, arity: int,
             emitter: Callable[..., Value]) -> ir.Function:
    """The module's internal function computing `name` on values of type `ty`, defined by
    `emitter` on first use and inlined into every caller by LLVM."""
    ops = _Ops(ir.IRBuilder(), ty)  # checks the type before anything is added to the module
    symbol = f"glue.math.{name}.{ops._suffix}"
    fn = module.globals.get(symbol)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * arity), symbol)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        ops.b.position_at_end(fn.append_basic_block("entry"))
        ops.b.ret(emitter(ops, *fn.args))
    return fn


def emit_unary(builder: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    """Emits `name(x)` at the builder's position; x is a float/double scalar or vector."""
    emitter = _UNARY.get(name)
    if emitter is None:
        raise ValueError(f"mathlib has no unary function {name!r}; it has {sorted(_UNARY)}")
    return builder.call(_routine(builder.module, name, x.type, 1, emitter), [x])


def emit_pow(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Emits `x ** y` (C99 `pow` semantics) at the builder's position; x and y share one type."""
    if x.type != y.type:
        raise TypeError(f"pow operands must have one type, got {x.type} and {y.type}")
    return builder.call(_routine(builder.module, "pow", x.type, 2, _pow), [x, y])
