"""What the program generator knows about every value it creates, so that it builds only
programs whose float64 and native evaluations are guaranteed to agree within tolerance.

For each value it tracks a bound on its magnitude, a lower bound on the value, whether the
value is computed exactly (and on which binary grid), and bounds on its relative and absolute
rounding error against an evaluation in float64. Program inputs are multiples of 1/8 in
[-4, 4], so additions, products and layout changes of them are usually exact in every dtype;
discontinuous operations (floor, comparisons, argmax, float -> int casts) are only applied to
exact values, and every rounded value is checked against the comparison tolerance.

`RULES` holds one rule per primitive; a rule sees the operands' facts and returns what it
propagates (before the primitive's own rounding, which `derive` adds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from glue.backend_cpu.kernels import SUM_BLOCK
from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.reference.compare import TOLERANCES, least_precise

# Program inputs: floats are multiples of 2**-FLOAT_BITS in [-FLOAT_MAX, FLOAT_MAX], ints lie in
# INT_RANGE (UINT_RANGE for unsigned types).
FLOAT_BITS, FLOAT_MAX = 3, 4.0
INT_RANGE = (-2, 5)
UINT_RANGE = (0, 7)


def int_range(dtype: DType) -> tuple[int, int]:
    """The range program inputs (and integer literals) of an integer dtype are drawn from."""
    return UINT_RANGE if dtype.is_unsigned else INT_RANGE

_PRECISION = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
_FINEST = {"f16": 24, "bf16": 133, "f32": 149, "f64": 1074}  # the smallest subnormal is 2**-finest
# Primitives whose reference implementation is a library function rather than one rounding.
TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "logistic",
                            "sin", "cos", "erf", "erfc", "sqrt", "rsqrt", "pow"})


def unit_roundoff(dtype: DType) -> float:
    """The largest relative rounding error of `dtype` (0 for integers and bool)."""
    return 2.0 ** -_PRECISION[dtype.name] if dtype.is_float else 0.0


@dataclass(frozen=True)
class Facts:
    """Bounds on one value: lo <= v <= mag (|v| <= mag); exact on the grid 2**-bits unless
    bits is None; |native - float64| <= rel*|v| (when rel is known) and <= err; `tol` is the
    least precise float dtype whose rounding reached the value (None while it is exact)."""

    mag: float
    lo: float
    bits: int | None = 0
    rel: float | None = 0.0
    err: float = 0.0
    tol: DType | None = None

    @property
    def exact(self) -> bool:
        return self.bits is not None

    @property
    def nonneg(self) -> bool:
        return self.lo >= 0


def input_facts(dtype: DType) -> Facts:
    if dtype.is_float:
        return Facts(FLOAT_MAX, -FLOAT_MAX, FLOAT_BITS)
    if dtype.is_int:
        lo, hi = int_range(dtype)
        return Facts(float(max(abs(lo), hi)), float(lo))
    return Facts(1.0, 0.0)


def literal_facts(value: Any) -> Facts:
    value = float(value)
    bits = next((b for b in range(64) if (value * 2 ** b).is_integer()), None)
    return Facts(abs(value), value, bits)


def representable(dtype: DType, mag: float, bits: int) -> bool:
    """Whether every multiple of 2**-bits up to `mag` is exact in `dtype`."""
    if not dtype.is_float:
        return True
    if bits > _FINEST[dtype.name]:
        return False
    return mag == 0 or math.log2(mag) + bits <= _PRECISION[dtype.name]  # in logs: no overflow


class Est(NamedTuple):
    """What a rule propagates: bounds of the exact result and the operands' error carried into it."""

    mag: float
    lo: float
    bits: int | None
    rel: float | None
    err: float


def _bits(*fs: Facts) -> int | None:
    return None if any(f.bits is None for f in fs) else max(f.bits for f in fs)


def _rel(f: Facts) -> float | None:
    """A relative error bound, from `rel` or, for values bounded away from zero, from `err`."""
    if f.rel is not None:
        return f.rel
    return f.err / f.lo if f.lo > 0 else None


def _sum_rel(*rels: float | None) -> float | None:
    return None if None in rels else sum(rels)


def _accumulator(dtype: DType) -> DType:
    return dt.float32 if dtype.is_float and dtype.bits < 32 else dtype


def _accumulated(out: TensorType, mag: float, bits: int | None, terms: int) -> float:
    """Absolute error of summing `terms` values up to a total magnitude `mag` in the accumulator."""
    acc = _accumulator(out.dtype)
    if not acc.is_float or (bits is not None and representable(acc, mag, bits)):
        return 0.0
    return terms * unit_roundoff(acc) * mag


def _same(f: Facts, *_: Any, **__: Any) -> Est:
    return Est(f.mag, f.lo, f.bits, f.rel, f.err)


def _neg(f: Facts, *_: Any) -> Est:
    return Est(f.mag, -f.mag, f.bits, f.rel, f.err)


def _abs(f: Facts, *_: Any) -> Est:
    return Est(f.mag, max(0.0, f.lo), f.bits, f.rel, f.err)


def _integral(f: Facts, *_: Any) -> Est:  # floor, ceil, round of an exact value
    return Est(f.mag + 1, f.lo - 1 if f.lo < 0 else 0.0, 0, 0.0, 0.0)


def _sign(f: Facts, *_: Any) -> Est:
    return Est(1.0, 0.0 if f.nonneg else -1.0, 0, 0.0, 0.0)


def _not(f: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    mag = 1.0 if types[0].dtype == dt.bool_ else f.mag + 1
    return Est(mag, 0.0 if types[0].dtype == dt.bool_ else -mag, 0, 0.0, 0.0)


def _smooth(value: Callable[[float], float], lipschitz: Callable[[float], float],
            cond: float | None, lower: Callable[[Facts], float] | None = None):
    """A continuous unary function: its range bound, Lipschitz constant and condition number."""
    def rule(f: Facts, *_: Any) -> Est:
        mag = value(f.mag)
        rel = None if cond is None or _rel(f) is None else cond * _rel(f)
        return Est(mag, lower(f) if lower else -mag, None, rel, lipschitz(f.mag) * f.err)
    return rule


def _exp_rel(f: Facts, scale: float = 1.0) -> Est:
    mag = math.exp(scale * f.mag)
    return Est(mag, math.exp(-scale * f.mag), None, scale * f.err, mag * scale * f.err)


def _add(x: Facts, y: Facts, *_: Any, sub: bool = False) -> Est:
    err = x.err + y.err
    rel = (_sum_rel(_rel(x), _rel(y)) if not sub and x.nonneg and y.nonneg else None)
    lo = x.lo - y.mag if sub else x.lo + y.lo
    return Est(x.mag + y.mag, lo, _bits(x, y), rel, err)


def _mul(x: Facts, y: Facts, *_: Any) -> Est:
    mag = x.mag * y.mag
    lo = x.lo * y.lo if x.nonneg and y.nonneg else -mag
    bits = None if x.bits is None or y.bits is None else x.bits + y.bits
    return Est(mag, lo, bits, _sum_rel(_rel(x), _rel(y)), x.err * y.mag + y.err * x.mag + x.err * y.err)


def _div(x: Facts, y: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    if types[0].dtype.is_unsigned and y.lo >= 1:  # a zero divisor would give all ones
        return Est(x.mag, 0.0, 0, 0.0, 0.0)
    if not types[0].dtype.is_float:  # truncating; -1 on a zero divisor
        return Est(max(x.mag, 1.0), -max(x.mag, 1.0), 0, 0.0, 0.0)
    mag = x.mag / y.lo  # divisors are guarded to lie in [0.5, inf)
    lo = x.lo / y.mag if x.nonneg else -mag
    return Est(mag, lo, None, _sum_rel(_rel(x), _rel(y)), x.err / y.lo + y.err * x.mag / y.lo ** 2)


def _rem(x: Facts, y: Facts, *_: Any) -> Est:  # exact operands only: fmod is exact
    mag = min(x.mag, y.mag) if y.lo > 0 else x.mag
    return Est(mag, 0.0 if x.nonneg else -mag, _bits(x, y), 0.0, 0.0)


def _pow(x: Facts, y: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    if not types[0].dtype.is_float:  # a small literal exponent
        k = int(y.mag)
        mag = x.mag ** k if y.lo >= 0 else 1.0
        return Est(mag, 0.0 if x.nonneg else -mag, 0, 0.0, 0.0)
    # bases are guarded to lie in [0.5, inf)
    mag = max(x.mag, 1 / x.lo) ** y.mag
    log_base = max(abs(math.log(x.lo)), math.log(max(x.mag, 1.0)))
    rx = _rel(x)
    rel = None if rx is None else y.mag * rx + log_base * y.err
    return Est(mag, min(x.lo, 1 / x.mag) ** y.mag, None, rel, mag * (rel if rel is not None else math.inf))


def _extremum(largest: bool):
    def rule(*fs: Facts) -> Est:
        fs = [f for f in fs if isinstance(f, Facts)]
        lo = max(f.lo for f in fs) if largest else min(f.lo for f in fs)
        rels = [_rel(f) for f in fs]
        return Est(max(f.mag for f in fs), lo, _bits(*fs), None if None in rels else max(rels),
                   max(f.err for f in fs))
    return rule


def _bitwise(x: Facts, y: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    if types[0].dtype == dt.bool_:
        return Est(1.0, 0.0, 0, 0.0, 0.0)
    mag = 2 * max(x.mag, y.mag, 1.0)
    return Est(mag, 0.0 if x.nonneg and y.nonneg else -mag, 0, 0.0, 0.0)


def _shift_left(x: Facts, y: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    """x * 2**y, or 0 for amounts past the width (negative ones read as unsigned are)."""
    mag = x.mag * 2.0 ** min(y.mag, types[0].dtype.bits)
    return Est(mag, 0.0 if x.nonneg else -mag, 0, 0.0, 0.0)


def _shift_right(logical: bool):
    def rule(x: Facts, y: Facts, types: Sequence[TensorType], *_: Any) -> Est:
        if x.nonneg:
            return Est(x.mag, 0.0, 0, 0.0, 0.0)
        if logical:  # a negative value's bits read as a large unsigned number
            return Est(2.0 ** (types[0].dtype.bits - 1), 0.0, 0, 0.0, 0.0)
        return Est(x.mag, min(x.lo, -1.0), 0, 0.0, 0.0)
    return rule


def _population_count(f: Facts, types: Sequence[TensorType], *_: Any) -> Est:
    return Est(float(types[0].dtype.bits) if f.lo < 0 else f.mag, 0.0, 0, 0.0, 0.0)


def _bitcast(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    """Integers of one width keep their value where both dtypes hold it (a negative one read as
    unsigned wraps, which `derive` sees to); any other reinterpretation can give any value of
    the result dtype, which no bound admits."""
    if types[0].dtype.is_int and out.dtype.is_int and f.mag < 2.0 ** (out.dtype.bits - 1):
        return _same(f)
    return Est(math.inf, -math.inf, None, None, math.inf)


def _boolean(*_: Any, **__: Any) -> Est:
    return Est(1.0, 0.0, 0, 0.0, 0.0)


def _select(pred: Facts, x: Facts, y: Facts, *_: Any) -> Est:
    return _extremum(False)(x, y)._replace(mag=max(x.mag, y.mag))


def _convert(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    if out.dtype == dt.bool_:
        return Est(1.0, 0.0, 0, 0.0, 0.0)
    if out.dtype.is_int and types[0].dtype.is_float:
        # from exact values only; truncates toward zero, and saturates (at 0 for unsigned types)
        lo = 0.0 if out.dtype.is_unsigned else -math.floor(f.mag)
        return Est(math.floor(f.mag), lo, 0, 0.0, 0.0)
    return _same(f)


def _reduced(types: Sequence[TensorType], axes: Sequence[int]) -> int:
    return math.prod(types[0].shape[a] for a in axes)


def _reduce_sum(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    n = _reduced(types, params["axes"])
    mag = n * f.mag
    # Every backend adds at most SUM_BLOCK terms one after another and joins the blocks with a
    # compensated sum (two roundings more), so the error does not grow with n past a block.
    terms = min(n, SUM_BLOCK + 2)
    acc = _accumulated(out, mag, f.bits, terms)
    rel = None if not f.nonneg or _rel(f) is None else _rel(f) + terms * unit_roundoff(_accumulator(out.dtype))
    return Est(mag, n * f.lo, f.bits, rel, n * f.err + acc)


def _power(x: float, n: int) -> float:
    """x ** n, infinite where a float overflows (a long product's bound)."""
    try:
        return x ** n
    except OverflowError:
        return math.inf


def _reduce_prod(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    n = _reduced(types, params["axes"])
    mag = _power(f.mag, n)
    bits = None if f.bits is None else f.bits * n
    exact = bits is not None and representable(_accumulator(out.dtype), mag, bits)
    rf = _rel(f)
    rel = None if rf is None else n * rf + (0.0 if exact else n * unit_roundoff(_accumulator(out.dtype)))
    err = n * _power(f.mag, max(n - 1, 0)) * f.err + (0.0 if exact else n * unit_roundoff(_accumulator(out.dtype)) * mag)
    return Est(mag, _power(f.lo, n) if f.nonneg else -mag, bits, rel, err)


def _index_result(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    n = types[0].shape[params["axis"]]
    return Est(float(n - 1), 0.0, 0, 0.0, 0.0)


def _pad(f: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    return _extremum(False)(f, literal_facts(params["value"]))._replace(
        mag=max(f.mag, abs(params["value"])))


def _concatenate(*args: Any) -> Est:
    fs = [a for a in args if isinstance(a, Facts)]
    return _extremum(False)(*fs)._replace(mag=max(f.mag for f in fs))


def _iota(types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    return Est(float(params["shape"][params["dimension"]] - 1), 0.0, 0, 0.0, 0.0)


def _dot_general(x: Facts, y: Facts, types: Sequence[TensorType], out: TensorType, params: dict) -> Est:
    (lc, _), _ = params["dimension_numbers"]
    k = math.prod(types[0].shape[a] for a in lc)
    product = _mul(x, y)
    mag = k * product.mag
    acc = _accumulated(out, mag, product.bits, k)
    nonneg = x.nonneg and y.nonneg
    rel = None if not nonneg or product.rel is None else product.rel + k * unit_roundoff(_accumulator(out.dtype))
    return Est(mag, k * product.lo if nonneg else -mag, product.bits, rel, k * product.err + acc)


def _scatter_add(x: Facts, idx: Facts, u: Facts, types: Sequence[TensorType], out: TensorType,
                 params: dict) -> Est:
    count = math.prod(types[1].shape[params["batch_dims"]:])
    mag = x.mag + count * u.mag
    bits = _bits(x, u)
    exact = bits is not None and representable(out.dtype, mag, bits)
    acc = 0.0 if exact or not out.dtype.is_float else count * unit_roundoff(out.dtype) * mag
    rel = (None if not (x.nonneg and u.nonneg) or None in (_rel(x), _rel(u))
           else max(_rel(x), _rel(u)) + count * unit_roundoff(out.dtype))
    return Est(mag, x.lo + count * min(0.0, u.lo), bits, rel, x.err + count * u.err + acc)


def _unary_table() -> dict[str, Callable[..., Est]]:
    ln2 = math.log(2)
    return {
        "neg": _neg, "abs": _abs, "sign": _sign, "floor": _integral, "ceil": _integral,
        "round": _integral, "not": _not,
        "exp": lambda f, *_: _exp_rel(f), "exp2": lambda f, *_: _exp_rel(f, ln2),
        "expm1": lambda f, *_: _exp_rel(f)._replace(
            mag=math.expm1(f.mag), lo=math.expm1(f.lo),
            rel=None if _rel(f) is None else (1 + f.mag) * _rel(f)),
        # log, log2 and rsqrt operands are guarded into [0.5, inf); log1p and sqrt into [0, inf)
        "log": _smooth(lambda m: max(ln2, math.log(max(m, 1.0))), lambda m: 2.0, None),
        "log2": _smooth(lambda m: max(1.0, math.log2(max(m, 1.0))), lambda m: 2 / ln2, None),
        "log1p": _smooth(math.log1p, lambda m: 1.0, 1.0, lambda f: 0.0),
        "sqrt": lambda f, *_: Est(math.sqrt(f.mag), 0.0, None, None if _rel(f) is None else _rel(f) / 2,
                                  math.sqrt(f.err)),
        "rsqrt": lambda f, *_: Est(f.lo ** -0.5, f.mag ** -0.5, None, _rel(f) / 2, f.err * f.lo ** -1.5),
        "tanh": _smooth(lambda m: min(m, 1.0), lambda m: 1.0, 1.0, lambda f: math.tanh(f.lo)),
        "logistic": lambda f, *_: Est(1.0, 1 / (1 + math.exp(-f.lo)), None, f.err, f.err / 4),
        "sin": _smooth(lambda m: min(m, 1.0), lambda m: 1.0, None),
        "cos": _smooth(lambda m: 1.0, lambda m: 1.0, None),
        "erf": _smooth(lambda m: min(1.0, 1.13 * m), lambda m: 1.13, 1.0, lambda f: math.erf(f.lo)),
        # erfc falls steeply for large x, so only an absolute error bound carries through
        "erfc": _smooth(lambda m: min(2.0, 1 + 1.13 * m), lambda m: 1.13, None, lambda f: math.erfc(f.mag)),
    }


RULES: dict[str, Callable[..., Est]] = {
    **_unary_table(),
    "add": _add, "sub": lambda x, y, *_: _add(x, y, sub=True), "mul": _mul, "div": _div,
    "rem": _rem, "pow": _pow, "max": _extremum(True), "min": _extremum(False),
    "and": _bitwise, "or": _bitwise, "xor": _bitwise,
    "shift_left": _shift_left, "shift_right_logical": _shift_right(True),
    "shift_right_arithmetic": _shift_right(False), "population_count": _population_count,
    "bitcast_convert_type": _bitcast,
    **{c: _boolean for c in ("eq", "ne", "lt", "le", "gt", "ge")},
    "select": _select, "convert_element_type": _convert,
    "reduce_sum": _reduce_sum, "reduce_prod": _reduce_prod,
    "reduce_max": lambda f, *_: _same(f), "reduce_min": lambda f, *_: _same(f),
    "argmax": _index_result, "argmin": _index_result,
    **{p: lambda f, *_: _same(f) for p in ("broadcast_in_dim", "reshape", "transpose", "slice")},
    "pad": _pad, "concatenate": _concatenate, "iota": _iota, "dot_general": _dot_general,
    "gather": lambda x, idx, *_: _same(x), "scatter_add": _scatter_add,
}


def rounding(primitive: str, dtype: DType, math_ulps: float) -> float:
    """Relative error of one application of `primitive` in `dtype`: one rounding, or for library
    math `math_ulps` ulps (2 unit roundoffs each) of the compute dtype, f32 for 16-bit floats,
    then one rounding into `dtype`."""
    if primitive not in TRANSCENDENTAL:
        return unit_roundoff(dtype)
    compute = _accumulator(dtype)
    return 2 * math_ulps * unit_roundoff(compute) + (unit_roundoff(dtype) if compute != dtype else 0.0)


def derive(primitive: str, facts: Sequence[Facts], types: Sequence[TensorType], out: TensorType,
           params: dict[str, Any], math_ulps: float = 2.0) -> Facts:
    """The facts of `primitive[params]` applied to operands with `facts`."""
    est = RULES[primitive](*facts, types, out, params)
    if out.dtype.is_unsigned and est.lo < 0:  # wraps around: any value of the dtype
        return Facts(float(2 ** out.dtype.bits - 1), 0.0)
    tol = least_precise(*(f.tol for f in facts))
    if not out.dtype.is_float or (est.bits is not None and representable(out.dtype, est.mag, est.bits)):
        return Facts(est.mag, est.lo, est.bits if out.dtype.is_float else 0)
    own = rounding(primitive, out.dtype, math_ulps)
    prop_rel = 0.0 if est.err == 0 else est.rel
    rel = None if prop_rel is None else prop_rel + own
    err = est.err + own * est.mag
    if rel is None and est.lo > 0:
        rel = err / est.lo
    return Facts(est.mag, est.lo, None, rel, err, least_precise(tol, out.dtype))


def within_tolerance(f: Facts, scale: float = 1.0) -> bool:
    """Whether a value with these facts passes `glue.reference.compare.mismatch` at its `tol`."""
    if f.tol is None:
        return True
    rtol, atol = TOLERANCES[f.tol.name]
    return (f.rel is not None and f.rel <= rtol * scale) or f.err <= atol * scale
