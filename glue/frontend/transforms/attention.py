"""Differentiation and batching of `attention` and `attention_bwd`.

The VJP of attention is the primitive `attention_bwd` (FlashAttention's backward: P recomputed
from the saved row logsumexp, which is why attention returns it), so a gradient never holds
T x S values either. Forward mode, and derivatives of attention_bwd (second order), go through
the unfused math (glue.scheduler.attention), with its T x S scores: they are rare enough to get
no kernel of their own. vmap folds the batch axis into B.
"""
from __future__ import annotations

from typing import Any, Sequence

from glue.frontend.transforms.autodiff import JVP, VJP, Linearized, jvp_graph
from glue.frontend.transforms.batching import BATCH, move_batch
from glue.frontend.transforms.core import aval, broadcast, closed, emit, reshape, rule_body, zeros
from glue.ir import TensorType
from glue.scheduler.attention import Ops, Spec, unfused_attention, unfused_attention_bwd

OPS = Ops(emit, aval, lambda value, dtype: dtype.numpy.type(value))


def _parts(primals: Sequence[Any], params: dict[str, Any]) -> tuple[Spec, list[Any], Any, Any]:
    q, k, v = primals[:3]
    spec = Spec.of(aval(q), aval(k), aval(v), params)
    extras = list(primals[3:3 + spec.has_bias + spec.has_mask])
    bias = extras[0] if spec.has_bias else None
    mask = extras[spec.has_bias] if spec.has_mask else None
    return spec, extras, bias, mask


def _unfused_body(primals: Sequence[Any], params: dict[str, Any], backward: bool):
    """The closed body computing the equation the plain way, with the T x S scores."""
    spec, _, _, _ = _parts(primals, params)

    def unfused(*xs: Any) -> Sequence[Any]:
        q, k, v, *rest = xs
        bias = rest[0] if spec.has_bias else None
        mask = rest[spec.has_bias] if spec.has_mask else None
        if not backward:
            return unfused_attention(OPS, spec, q, k, v, bias, mask)
        out, _, d_out, d_lse = rest[-4:]
        return unfused_attention_bwd(OPS, spec, q, k, v, bias, mask, out, d_out, d_lse, params["bias_grad"])

    return closed(rule_body(unfused, [aval(x) for x in primals], False, "the unfused attention"))


def _unfused_jvp(backward: bool):
    """Forward mode through the unfused math (no kernel of its own: rare for attention)."""
    def jvp(tangents: list, primals: list, out: Any, **params: Any) -> list:
        return jvp_graph(_unfused_body(primals, params, backward), primals, tangents)[1]
    return jvp


def _attention_vjp(ct: list, wanted: Sequence[bool], primals: list, out: list, **params: Any) -> list:
    spec, extras, bias, _ = _parts(primals, params)
    d_out, d_lse = (c if c is not None else zeros(aval(o)) for c, o in zip(ct, out))
    bias_grad = spec.has_bias and bool(wanted[3])
    grads = list(emit("attention_bwd", *primals, *out, d_out, d_lse, bias_grad=bias_grad, **params))
    cts = [g if w else None for g, w in zip(grads[:3], wanted)]
    cts += [grads[3] if bias_grad else None] if spec.has_bias else []
    return cts + [None] * spec.has_mask


def _attention_bwd_vjp(ct: list, wanted: Sequence[bool], primals: list, out: list, **params: Any) -> list:
    """Second order (the gradient of a gradient) through the unfused backward."""
    return Linearized(_unfused_body(primals, params, True), primals, wanted).transpose(ct)


def _batched(values: Sequence[Any], bdims: Sequence[int | None], size: int, spec: Spec) -> list[Any]:
    """Every operand with the vmapped axis folded into its leading (B) axis; a bias or mask that
    broadcasts along B is made full there first."""
    out = []
    for x, d in zip(values, bdims):
        x = move_batch(x, d, 0, size)
        shape = aval(x).shape
        if shape[1] == 1 and spec.b != 1:  # a B-broadcast bias or mask stays one per example
            shape = (size, spec.b) + shape[2:]
            x = broadcast(x, shape, range(len(shape)))
        out.append(reshape(x, (size * shape[1],) + shape[2:]))
    return out


def _unbatched(x: Any, size: int) -> Any:
    shape = aval(x).shape
    return reshape(x, (size, shape[0] // size) + shape[1:])


def _example(x: Any, d: int | None) -> TensorType:
    t = aval(x)
    return t if d is None else TensorType(t.shape[:d] + t.shape[d + 1:], t.dtype)


def _batch_rule(name: str):
    def rule(values: list, bdims: list, size: int, **params: Any) -> tuple[list, list]:
        spec = Spec.of(*(_example(x, d) for x, d in zip(values[:3], bdims[:3])), params)
        results = emit(name, *_batched(values, bdims, size, spec), **params)
        return [_unbatched(r, size) for r in results], [0] * len(results)
    return rule


JVP["attention"], VJP["attention"] = _unfused_jvp(False), _attention_vjp
JVP["attention_bwd"], VJP["attention_bwd"] = _unfused_jvp(True), _attention_bwd_vjp
BATCH["attention"], BATCH["attention_bwd"] = _batch_rule("attention"), _batch_rule("attention_bwd")
