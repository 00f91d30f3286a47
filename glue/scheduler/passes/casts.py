"""Cast simplification: conversions to the dtype a value already has, and chains whose middle
step loses nothing.

convert(convert(x, A), B) equals convert(x, B) whenever A holds every value of x's dtype
exactly: the second conversion then sees x's own value, so it rounds (or truncates, or
saturates) exactly as a direct one would; except that an integer converted to a narrower
integer wraps, where the same value through a float saturates, so an integer -> float ->
integer chain goes only where the last integer type holds every value of the first. With B
equal to x's dtype this removes widening round trips (f16 -> f32 -> f16, i32 -> i64 -> i32,
u8 -> bf16 -> u8). Narrowing chains (f32 -> f16 -> f32) round, so they stay.
`tests/scheduler/test_passes.py` checks the table against the reference.
"""
from __future__ import annotations

import numpy as np

from glue.ir import Eqn
from glue.ir import dtypes as dt
from glue.scheduler.passes.rewrite import Replacement, Rule, Sweep, derive, table_pass

_PRECISION = {dt.float16: 11, dt.bfloat16: 8, dt.float32: 24, dt.float64: 53}  # significand bits


def holds(wide: dt.DType, narrow: dt.DType) -> bool:
    """Whether every value of `narrow` is exactly a value of `wide`."""
    if narrow == dt.bool_ or wide == dt.bool_:
        return narrow == dt.bool_
    if narrow.is_float:
        return wide.is_float and _PRECISION[wide] >= _PRECISION[narrow] and wide.bits > narrow.bits
    info = np.iinfo(narrow.numpy)
    if wide.is_int:
        return np.iinfo(wide.numpy).min <= info.min and info.max <= np.iinfo(wide.numpy).max
    return max(-int(info.min), int(info.max)) <= 2 ** _PRECISION[wide]


# (source, wider): every value of `source` converts to `wider` exactly and back.
LOSSLESS: frozenset[tuple[dt.DType, dt.DType]] = frozenset(
    (source, wide) for source in dt.ALL_DTYPES for wide in dt.ALL_DTYPES if source != wide and holds(wide, source))


def skips_middle(source: dt.DType, middle: dt.DType, target: dt.DType) -> bool:
    """Whether convert(convert(x, middle), target) equals convert(x, target) for x of `source`."""
    if (source, middle) not in LOSSLESS:
        return False
    wraps_or_saturates = source.is_int and middle.is_float and target.is_int
    return not wraps_or_saturates or holds(target, source)


def _convert(eqn: Eqn, ctx: Sweep) -> Replacement:
    (x,) = eqn.inputs
    target = eqn.param_dict["new_dtype"]
    inner = ctx.producer(x)
    if inner is not None and inner.primitive == "convert_element_type" \
            and skips_middle(inner.inputs[0].type.dtype, x.type.dtype, target):
        x = inner.inputs[0]
    if x.type.dtype == target:
        return x
    return (derive(eqn, "convert_element_type", (x,), new_dtype=target),) if x is not eqn.inputs[0] else None


RULES: dict[str, Rule] = {"convert_element_type": _convert}

casts = table_pass(RULES)
