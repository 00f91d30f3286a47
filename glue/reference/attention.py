"""The NumPy meaning of `attention` and `attention_bwd`: the unfused math, as
jax.nn.dot_product_attention writes it (scores, bias, mask, a max-shifted softmax, the product
with v), computed in float32 for 16-bit inputs; and its gradient from P recomputed out of the
saved row logsumexp. Backends run these tiled; these define what the tiles must add up to."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.reference.impls import IMPLS


def _bnth(x: np.ndarray, layout: str) -> np.ndarray:
    return x.transpose(0, 2, 1, 3) if layout == "BTNH" else x


def _wide(*xs: np.ndarray) -> Any:
    dtype = np.result_type(np.float32, *[x.dtype for x in xs])
    return [x.astype(dtype) for x in xs]


def _operands(q, k, v, extras: Sequence[np.ndarray], layout: str, has_bias: bool, has_mask: bool):
    """q, k, v in BNTH and float32 or wider, k and v repeated to q's heads, the bias and the mask
    that keeps each logit (causal or not) in (B, N, T, S) broadcast form."""
    q, k, v = _wide(*(_bnth(x, layout) for x in (q, k, v)))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    bias = extras[0].astype(q.dtype) if has_bias else None
    mask = extras[has_bias] if has_mask else None
    return q, k, v, bias, mask


def _keep(mask: np.ndarray | None, causal: bool, t: int, s: int) -> np.ndarray:
    keep = np.ones((1, 1, t, s), bool) if mask is None else mask
    if causal:
        keep = keep & np.tril(np.ones((t, s), bool))
    return keep


def _logits(q, k, bias, keep, scale: float, masked_value: float) -> np.ndarray:
    s = np.einsum("bnth,bnsh->bnts", q, k) * q.dtype.type(scale)
    if bias is not None:
        s = s + bias
    return np.where(keep, s, q.dtype.type(masked_value))


@IMPLS.register("attention")
def attention(q, k, v, *extras, scale, causal, layout, masked_value, has_bias, has_mask, precision=None):
    """Exact at every precision, as the reference's dot_general."""
    q_, k_, v_, bias, mask = _operands(q, k, v, extras, layout, has_bias, has_mask)
    keep = _keep(mask, causal, q_.shape[2], k_.shape[2])
    with np.errstate(all="ignore"):  # rows masked with -inf everywhere give NaN, as unfused code does
        s = _logits(q_, k_, bias, keep, scale, masked_value)
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        total = e.sum(-1, keepdims=True)
        out = np.einsum("bnts,bnsh->bnth", e / total, v_)
        lse = (m + np.log(total))[..., 0]
    return _bnth(out, layout).astype(q.dtype), lse.astype(q_.dtype)


def _grouped(x: np.ndarray, kv_heads: int) -> np.ndarray:
    """A gradient over q's heads summed down to the kv heads each group of them read."""
    b, n, s, h = x.shape
    return x.reshape(b, kv_heads, n // kv_heads, s, h).sum(2)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return x.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)


@IMPLS.register("attention_bwd")
def attention_bwd(q, k, v, *rest, scale, causal, layout, masked_value, has_bias, has_mask, bias_grad,
                  precision=None):
    extras, (out, lse, d_out, d_lse) = rest[:-4], rest[-4:]
    q_, k_, v_, bias, mask = _operands(q, k, v, extras, layout, has_bias, has_mask)
    out_, d_out_ = _wide(_bnth(out, layout), _bnth(d_out, layout))
    keep = _keep(mask, causal, q_.shape[2], k_.shape[2])
    with np.errstate(all="ignore"):
        # P from the logits themselves, not from lse: a row masked everywhere with a large
        # finite value has lse == masked_value in float32, where P is 1/S
        s = _logits(q_, k_, bias, keep, scale, masked_value)
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        dv = np.einsum("bnts,bnth->bnsh", p, d_out_)
        dp = np.einsum("bnth,bnsh->bnts", d_out_, v_)
        delta = (d_out_ * out_).sum(-1) - d_lse.astype(q_.dtype)
        ds = np.where(keep, p * (dp - delta[..., None]), 0)
    dq = np.einsum("bnts,bnsh->bnth", ds, k_) * q_.dtype.type(scale)
    dk = np.einsum("bnts,bnth->bnsh", ds, q_) * q_.dtype.type(scale)
    kv_heads = k.shape[2] if layout == "BTNH" else k.shape[1]
    grads = [_bnth(dq, layout).astype(q.dtype), _bnth(_grouped(dk, kv_heads), layout).astype(k.dtype),
             _bnth(_grouped(dv, kv_heads), layout).astype(v.dtype)]
    if bias_grad:
        grads.append(_sum_to(ds, extras[0].shape).astype(extras[0].dtype))
    return tuple(grads)
