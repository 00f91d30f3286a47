"""Algebraic identities that hold bit for bit under the reference semantics.

Float identities are chosen with IEEE signed zeros and NaNs in mind: x + (-0.0) and x - 0.0
are x, but x + 0.0 is not (-0.0 + 0.0 is +0.0), and x * 0 is 0 only for integers (NaN * 0 is
NaN, -1.0 * 0 is -0.0). pow(x, 0.5) is not sqrt(x) (they differ at -0.0 and -inf), and
exp(log(x)) is not x, so neither is rewritten.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from glue.ir import Eqn, Literal
from glue.ir.core import Atom
from glue.ir.dtypes import DType
from glue.scheduler.passes.rewrite import (Replacement, Rule, Sweep, derive, fill, literal, splat, stand_in,
                                          table_pass)

Value = Callable[[DType], Any]


def _zero(d: DType) -> Any:
    return False if d.kind == "bool" else 0 if d.is_int else 0.0


def _add_unit(d: DType) -> Any:
    return 0 if d.is_int else -0.0


def _one(d: DType) -> Any:
    return 1 if d.is_int else 1.0


def _all_ones(d: DType) -> Any:
    if d.kind == "bool":
        return True
    return -1 if d.signed else (1 << d.bits) - 1


def _equals(lit: Literal | None, value: Any) -> bool:
    """`lit` holds exactly `value` (signed zeros told apart)."""
    if lit is None or lit.value != value:
        return False
    return not isinstance(value, float) or math.copysign(1.0, lit.value) == math.copysign(1.0, value)


def _same(a: Atom, b: Atom) -> bool:
    if isinstance(a, Literal) or isinstance(b, Literal):
        return isinstance(a, Literal) and isinstance(b, Literal) and a.type == b.type \
            and _equals(a, b.value)
    return a is b


def _dtype(eqn: Eqn) -> DType:
    return eqn.inputs[0].type.dtype


def _unit(value: Value, left: bool = True) -> Rule:
    """op(x, unit) is x (and op(unit, x) too when `left`)."""
    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        x, y = eqn.inputs
        unit = value(_dtype(eqn))
        if _equals(splat(y, ctx), unit):
            return stand_in(x, eqn)
        return stand_in(y, eqn) if left and _equals(splat(x, ctx), unit) else None
    return rule


def _absorbing(value: Value) -> Rule:
    """op(x, z) and op(z, x) are z."""
    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        z = value(_dtype(eqn))
        hit = z is not None and any(_equals(splat(a, ctx), z) for a in eqn.inputs)
        return fill(z, eqn) if hit else None
    return rule


def _idempotent(eqn: Eqn, ctx: Sweep) -> Replacement:
    x, y = eqn.inputs
    return stand_in(x, eqn) if _same(x, y) else None


def _cancelling(value: Value) -> Rule:
    """op(x, x) is the constant `value` (for dtypes where it is defined)."""
    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        x, y = eqn.inputs
        result = value(_dtype(eqn))
        return fill(result, eqn) if result is not None and _same(x, y) else None
    return rule


def _involution(eqn: Eqn, ctx: Sweep) -> Replacement:
    inner = ctx.producer(eqn.inputs[0])
    return inner.inputs[0] if inner is not None and inner.primitive == eqn.primitive else None


def _square(eqn: Eqn, ctx: Sweep) -> Replacement:
    # With a literal (scalar) exponent of 2 the reference computes exactly x * x.
    x, y = eqn.inputs
    return (derive(eqn, "mul", (x, x)),) if isinstance(y, Literal) and y.value == 2 else None


def _select(eqn: Eqn, ctx: Sweep) -> Replacement:
    pred, on_true, on_false = eqn.inputs
    if _same(on_true, on_false):
        return stand_in(on_true, eqn)
    known = splat(pred, ctx)
    return None if known is None else stand_in(on_true if known.value else on_false, eqn)


def _empty_reduction(eqn: Eqn, ctx: Sweep) -> Replacement:
    return eqn.inputs[0] if eqn.param_dict["axes"] == () else None


def _empty_sum(eqn: Eqn, ctx: Sweep) -> Replacement:
    # A float sum over no axes still adds its identity +0.0, which turns -0.0 into +0.0.
    (x,) = eqn.inputs
    if eqn.param_dict["axes"] != () or not x.type.dtype.is_float:
        return _empty_reduction(eqn, ctx)
    return (derive(eqn, "add", (x, literal(0.0, x.type.dtype))),)


def _first(*rules: Rule) -> Rule:
    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        for r in rules:
            out = r(eqn, ctx)
            if out is not None:
                return out
        return None
    return rule


def _ints_only(value: Value) -> Value:
    return lambda d: value(d) if not d.is_float else None


RULES: dict[str, Rule] = {
    "add": _unit(_add_unit),
    "sub": _first(_unit(_zero, left=False), _cancelling(_ints_only(_zero))),
    "mul": _first(_unit(_one), _absorbing(_ints_only(_zero))),
    "div": _unit(_one, left=False),
    "pow": _square,
    "max": _idempotent,
    "min": _idempotent,
    "and": _first(_idempotent, _unit(_all_ones), _absorbing(_zero)),
    "or": _first(_idempotent, _unit(_zero), _absorbing(_all_ones)),
    "xor": _first(_unit(_zero), _cancelling(_zero)),
    "neg": _involution,
    "not": _involution,
    "select": _select,
    "reduce_sum": _empty_sum,
    "reduce_prod": _empty_reduction,
    "reduce_max": _empty_reduction,
    "reduce_min": _empty_reduction,
}

algebra = table_pass(RULES)
