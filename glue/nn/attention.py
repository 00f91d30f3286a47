"""`glue.nn.dot_product_attention`: jax.nn.dot_product_attention's signature, layout and
semantics, as one `attention` equation (which the scheduler runs tiled, never materialising
the T x S scores, and whose gradient is the `attention_bwd` equation)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

import glue.numpy as gnp
from glue.frontend.tracing import bind, type_of
from glue.ir import dtypes as dt
from glue.ir.primitives import attention_accumulator
from glue.numpy import _fail


def large_negative(dtype: dt.DType) -> float:
    """The value masked logits take: JAX's `-0.7 * finfo(dtype).max` (finite, so a fully
    masked row averages v uniformly instead of giving NaN)."""
    return -0.7 * float(np.finfo(attention_accumulator(dtype).numpy).max)


def _rank4(x: Any, what: str, operands: tuple) -> Any:
    x = gnp.asarray(x)
    if x.ndim > 4:
        raise _fail("dot_product_attention", f"the {what} must have rank 4 at most, not {x.ndim}", *operands)
    return gnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)


def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, *,
                          scale: float | None = None, is_causal: bool = False) -> Any:
    """softmax(query key^T * scale + bias, masked) value over heads.

    query (B, T, N, H), key and value (B, S, K, H) with K dividing N (grouped-query attention:
    query head n reads key/value head n // (N // K)); rank-3 operands (no batch axis) too.
    `bias` is added to the logits and `mask` (bool, True keeps) removes logits, both
    broadcasting to (B, N, T, S); `is_causal` keeps key j for query i only when j <= i. `scale`
    defaults to 1 / sqrt(H). The logits and softmax are computed in float32 for 16-bit inputs;
    the result has the query's dtype and shape with value's head size.
    """
    q, k, v = gnp.asarray(query), gnp.asarray(key), gnp.asarray(value)
    operands = (q, k, v)
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise _fail("dot_product_attention", "query, key and value must all be rank 4 (B, T, N, H) or rank 3",
                    *operands)
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = (gnp.expand_dims(x, 0) for x in (q, k, v))
    dtype = type_of(q).dtype
    if not dtype.is_float or type_of(k).dtype != dtype or type_of(v).dtype != dtype:
        raise _fail("dot_product_attention", "query, key and value need one floating-point dtype", *operands)
    extras = []
    if bias is not None:
        extras.append(gnp.astype(_rank4(bias, "bias", operands), dtype))
    if mask is not None:
        extras.append(gnp.astype(_rank4(mask, "mask", operands), dt.bool_))
    head = q.shape[-1]
    scale = 1.0 / math.sqrt(head) if scale is None else float(scale)
    out, _ = bind("attention", q, k, v, *extras, scale=scale, causal=bool(is_causal), layout="BTNH",
                  masked_value=large_negative(dtype), has_bias=bias is not None, has_mask=mask is not None)
    return out[0] if unbatched else out
