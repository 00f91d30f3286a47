"""Cast simplification: conversions to the dtype a value already has, and chains whose middle
step loses nothing.

convert(convert(x, A), B) equals convert(x, B) whenever A holds every value of x's dtype
exactly: the second conversion then sees x's own value, so it rounds (or truncates, or
saturates) exactly as a direct one would. With B equal to x's dtype this removes widening
round trips (f16 -> f32 -> f16, i32 -> i64 -> i32). Narrowing chains (f32 -> f16 -> f32) round,
so they stay. `tests/scheduler/test_passes.py` checks the table against the reference.
"""
from __future__ import annotations

from glue.ir import Eqn
from glue.ir import dtypes as dt
from glue.scheduler.passes.rewrite import Replacement, Rule, Sweep, derive, table_pass

# (source, wider): every value of `source` converts to `wider` exactly and back.
LOSSLESS: frozenset[tuple[dt.DType, dt.DType]] = frozenset(
    [(dt.bool_, d) for d in dt.ALL_DTYPES if d != dt.bool_]
    + [(dt.int32, dt.int64), (dt.int32, dt.float64), (dt.float32, dt.float64)]
    + [(half, wide) for half in (dt.float16, dt.bfloat16) for wide in (dt.float32, dt.float64)])


def _convert(eqn: Eqn, ctx: Sweep) -> Replacement:
    (x,) = eqn.inputs
    target = eqn.param_dict["new_dtype"]
    inner = ctx.producer(x)
    if inner is not None and inner.primitive == "convert_element_type" \
            and (inner.inputs[0].type.dtype, x.type.dtype) in LOSSLESS:
        x = inner.inputs[0]
    if x.type.dtype == target:
        return x
    return (derive(eqn, "convert_element_type", (x,), new_dtype=target),) if x is not eqn.inputs[0] else None


RULES: dict[str, Rule] = {"convert_element_type": _convert}

casts = table_pass(RULES)
