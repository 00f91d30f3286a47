"""Differentiation and batching of `attention` and `attention_bwd`.

The VJP of attention is the primitive `attention_bwd` (FlashAttention's backward: P recomputed
from the saved row logsumexp, which is why attention returns it), so a gradient never holds
T x S values either. The JVP is the unfused math differentiated (forward mode is rare for
attention and gets no kernel of its own). vmap folds the batch axis into B.
"""
from __future__ import annotations

from typing import Any, Sequence

from glue.errors import GlueError
from glue.frontend.transforms.autodiff import JVP, VJP, jvp_graph
from glue.frontend.transforms.batching import BATCH, move_batch
from glue.frontend.transforms.core import aval, broadcast, closed, emit, reshape, rule_body, zeros
from glue.ir import TensorType
from glue.scheduler.attention import Ops, Spec, unfused_attention

OPS = Ops(emit, aval, lambda value, dtype: dtype.numpy.type(value))


def _parts(primals: Sequence[Any], params: dict[str, Any]) -> tuple[Spec, list[Any], Any, Any]:
    q, k, v = primals[:3]
    spec = Spec.of(aval(q), aval(k), aval(v), params)
    extras = list(primals[3:3 + spec.has_bias + spec.has_mask])
    bias = extras[0] if spec.has_bias else None
    mask = extras[spec.has_bias] if spec.has_mask else None
    return spec, extras, bias, mask


def _attention_jvp(tangents: list, primals: list, out: Any, **params: Any) -> list:
    spec, extras, _, _ = _parts(primals, params)

    def unfused(*xs: Any) -> tuple[Any, Any]:
        q, k, v, *rest = xs
        return unfused_attention(OPS, spec, q, k, v, rest[0] if spec.has_bias else None,
                                 rest[spec.has_bias] if spec.has_mask else None)

    body = rule_body(unfused, [aval(x) for x in primals], False, "the attention JVP")
    return jvp_graph(closed(body), primals, tangents)[1]


def _attention_vjp(ct: list, wanted: Sequence[bool], primals: list, out: list, **params: Any) -> list:
    spec, extras, bias, _ = _parts(primals, params)
    d_out, d_lse = (c if c is not None else zeros(aval(o)) for c, o in zip(ct, out))
    bias_grad = spec.has_bias and bool(wanted[3])
    grads = list(emit("attention_bwd", *primals, *out, d_out, d_lse, bias_grad=bias_grad, **params))
    cts = [g if w else None for g, w in zip(grads[:3], wanted)]
    cts += [grads[3] if bias_grad else None] if spec.has_bias else []
    return cts + [None] * spec.has_mask


def _second_order(*_: Any, **__: Any) -> Any:
    raise GlueError("attention_bwd: derivatives of attention's gradient (second order, forward mode over "
                    "the backward) are not supported; differentiate a function without "
                    "glue.nn.dot_product_attention's fused kernel, written out with softmax")


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


JVP["attention"], VJP["attention"] = _attention_jvp, _attention_vjp
JVP["attention_bwd"], VJP["attention_bwd"] = _second_order, _second_order
BATCH["attention"], BATCH["attention_bwd"] = _batch_rule("attention"), _batch_rule("attention_bwd")
