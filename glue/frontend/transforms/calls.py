"""Differentiation and batching of calls: custom_jvp_call, custom_vjp_call, checkpoint,
optimization_barrier and debug_print.

- custom_jvp_call: forward mode runs the user's jvp graph. Reverse mode linearizes that graph in
  its tangent inputs and transposes it (the rule must be linear in the tangents, as JAX
  requires), so one rule serves both modes.
- custom_vjp_call: reverse mode runs the user's fwd graph, keeps its residuals and runs bwd on
  them; forward mode is refused, as in JAX.
- checkpoint: reverse mode computes the body's forward once for the outputs and again inside
  the backward, from the inputs (passed through an optimization_barrier so that the program's
  common-subexpression elimination cannot merge the two), keeping from the first pass only
  what the policy saves; forward mode and batching go through the body.
- constants a custom-derivative function closes over get no derivative: one that would need
  one (a closed-over value being differentiated) is an error naming the function.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from glue.errors import GlueError, describe_location
from glue.frontend.transforms.autodiff import JVP, VJP, Linearized, jvp_graph
from glue.frontend.transforms.batching import BATCH, batch_graph, move_batch
from glue.frontend.transforms.control import register_rules
from glue.frontend.transforms.core import (aval, closed, current_source, emit, emit_eqn, filled, groups,
                                           reduce_sum, reshape, rule_body, run_body, zeros)
from glue.frontend.transforms.partial import depends
from glue.frontend.tracing import results_of
from glue.ir import PRIMITIVES, Eqn, Graph, Primitive, TensorType
from glue.ir.primitives import has_effects


def _closure_error(kind: str) -> GlueError:
    return GlueError(f"a {kind} function closes over a value that is being differentiated; pass that "
                     f"value as an argument of the function instead {describe_location(current_source())}")


def _batched(xs: Sequence[Any], dims: Sequence[int | None], size: int) -> tuple[list[Any], list[bool]]:
    """The operands with every batch axis moved to the front, and which are batched."""
    flags = [d is not None for d in dims]
    return [move_batch(x, d, 0, size) if f else x for x, d, f in zip(xs, dims, flags)], flags


def _batched_graph(graph: Graph, in_flags: Sequence[bool], out_flags: Sequence[bool], size: int,
                   types: Sequence[TensorType], name: str) -> Graph:
    """`graph` over a batch: inputs flagged in `in_flags` and outputs in `out_flags` carry the
    batch axis first."""
    effects = any(has_effects(e.primitive, e.params) for e in graph.eqns)

    def fn(*args):
        outs, dims = batch_graph(closed(graph), args, [0 if f else None for f in in_flags], size)
        return [move_batch(o, d, 0, size) if f else o for o, d, f in zip(outs, dims, out_flags)]

    return rule_body(fn, types, effects, name)


# --- custom_jvp_call ------------------------------------------------------------------------

def _custom_jvp_jvp(ts, primals, *, body, jvp, num_consts):
    n_args = len(primals) - num_consts
    if any(t is not None for t in ts[n_args:]):
        raise _closure_error("custom_jvp")
    tangents = [filled(t, aval(p)) for t, p in zip(ts[:n_args], primals[:n_args])]
    got = run_body(jvp, list(primals) + tangents)
    n_out = len(body.outvars)
    return got[:n_out], [t if a.type.dtype.is_float else None for t, a in zip(got[n_out:], body.outvars)]


def _custom_jvp_linearize(primals, active, *, body, jvp, num_consts):
    n_args = len(primals) - num_consts
    if any(active[n_args:]):
        raise _closure_error("custom_jvp")
    arg_types = [aval(p) for p in primals[:n_args]]
    flags = [False] * len(primals) + [a and t.dtype.is_float for a, t in zip(active[:n_args], arg_types)]
    lin = Linearized(closed(jvp), list(primals) + [zeros(t) for t in arg_types], flags)
    n_out = len(body.outvars)

    def pullback(cts, wanted):
        grads = lin.transpose([None] * n_out + list(cts))
        return grads[len(primals):] + [None] * num_consts

    return lin.outs[:n_out], pullback


def _custom_jvp_batch(xs, dims, size, *, body, jvp, num_consts):
    operands, flags = _batched(xs, dims, size)
    n_args = len(xs) - num_consts
    n_out = len(body.outvars)
    jvp_in = flags + flags[:n_args]
    jvp_out = depends(jvp, jvp_in)
    out = [a or b or c for a, b, c in zip(depends(body, flags), jvp_out[:n_out], jvp_out[n_out:])]
    types = [aval(o) for o in operands]
    new_body = _batched_graph(body, flags, out, size, types, "a batched custom_jvp function")
    new_jvp = _batched_graph(jvp, jvp_in, out + out, size, types + types[:n_args], "a batched custom_jvp rule")
    result = emit("custom_jvp_call", *operands, body=new_body, jvp=new_jvp, num_consts=num_consts)
    return result, [0 if f else None for f in out]


register_rules("custom_jvp_call", _custom_jvp_jvp, _custom_jvp_linearize, _custom_jvp_batch)


# --- custom_vjp_call ------------------------------------------------------------------------

def _custom_vjp_jvp(ts, primals, **params):
    raise GlueError("a custom_vjp function cannot be differentiated in forward mode (jvp), as in JAX; "
                    f"give it a custom_jvp rule instead {describe_location(current_source())}")


def _custom_vjp_linearize(primals, active, *, body, fwd, bwd, num_consts):
    nb, nf, nw = num_consts
    n_args = len(primals) - nb - nf - nw
    if any(active[n_args:]):
        raise _closure_error("custom_vjp")
    args, _, fwd_consts, bwd_consts = groups(primals, (n_args, nb, nf, nw))
    got = run_body(fwd, args + fwd_consts)
    n_out = len(body.outvars)
    outs, residuals = got[:n_out], got[n_out:]

    def pullback(cts, wanted):
        cts = [filled(c, a.type) for c, a in zip(cts, body.outvars)]
        grads = run_body(bwd, residuals + cts + bwd_consts)
        return [g if w else None for g, w in zip(grads, wanted[:n_args])] + [None] * (nb + nf + nw)

    return outs, pullback


def _custom_vjp_batch(xs, dims, size, *, body, fwd, bwd, num_consts):
    nb, nf, nw = num_consts
    n_args = len(xs) - nb - nf - nw
    operands, flags = _batched(xs, dims, size)
    types = [aval(o) for o in operands]
    args_b, body_b, fwd_b, bwd_b = groups(flags, (n_args, nb, nf, nw))
    n_out = len(body.outvars)
    fwd_out = depends(fwd, args_b + fwd_b)
    out = [a or b for a, b in zip(depends(body, args_b + body_b), fwd_out[:n_out])]
    res = fwd_out[n_out:]
    arg_t, body_t, fwd_t, bwd_t = groups(types, (n_args, nb, nf, nw))
    new_body = _batched_graph(body, args_b + body_b, out, size, arg_t + body_t, "a batched custom_vjp function")
    new_fwd = _batched_graph(fwd, args_b + fwd_b, out + res, size, arg_t + fwd_t, "a batched custom_vjp fwd")
    residual_types = [TensorType((size,) + a.type.shape, a.type.dtype) if f else a.type
                      for a, f in zip(fwd.outvars[n_out:], res)]
    ct_types = [TensorType((size,) + a.type.shape, a.type.dtype) if f else a.type for a, f in zip(body.outvars, out)]

    def batched_bwd(*flat):
        grads, grad_dims = batch_graph(closed(bwd), flat, [0 if f else None for f in res + out + bwd_b], size)
        # an argument shared by the batch gets the cotangents of all its examples, summed
        return [move_batch(g, d, 0, size) if b else (g if d is None else reduce_sum(g, (d,)))
                for g, d, b in zip(grads, grad_dims, args_b)]

    new_bwd = rule_body(batched_bwd, residual_types + ct_types + bwd_t, False, "a batched custom_vjp bwd")
    result = emit("custom_vjp_call", *operands, body=new_body, fwd=new_fwd, bwd=new_bwd, num_consts=num_consts)
    return result, [0 if f else None for f in out]


register_rules("custom_vjp_call", _custom_vjp_jvp, _custom_vjp_linearize, _custom_vjp_batch)


# --- checkpoint -----------------------------------------------------------------------------

def _nothing_saveable(prim: Primitive, *avals: TensorType, **params: Any) -> bool:
    return False


def _everything_saveable(prim: Primitive, *avals: TensorType, **params: Any) -> bool:
    return True


def _dots_saveable(prim: Primitive, *avals: TensorType, **params: Any) -> bool:
    return prim.name == "dot_general"


def _dots_with_no_batch_dims_saveable(prim: Primitive, *avals: TensorType, **params: Any) -> bool:
    return prim.name == "dot_general" and not params["dimension_numbers"][1][0]


# The checkpoint policies by the name a checkpoint equation records: JAX-style predicates
# `policy(primitive, *operand types, **params)` saying which results the forward pass keeps.
POLICIES: dict[str, Callable[..., bool]] = {
    "nothing_saveable": _nothing_saveable, "everything_saveable": _everything_saveable,
    "dots_saveable": _dots_saveable, "dots_with_no_batch_dims_saveable": _dots_with_no_batch_dims_saveable,
}
for _name, _fn in POLICIES.items():
    _fn.__name__ = _fn.__qualname__ = _name


def _saved(policy: str, eqn: Eqn) -> bool:
    if has_effects(eqn.primitive, eqn.params):  # a print runs again where its values are recomputed
        return False
    return POLICIES[policy](PRIMITIVES[eqn.primitive], *(a.type for a in eqn.inputs), **eqn.param_dict)


def _forward_values(body: Graph, args: Sequence[Any]) -> tuple[list[Any], dict[int, Any]]:
    """`body` on `args`, emitted equation by equation: its outputs and every value it computed."""
    values: dict[int, Any] = {v.id: a for v, a in zip(body.invars, args)}

    def read(atom):
        return atom.type.dtype.numpy.type(atom.value) if not hasattr(atom, "id") else values[atom.id]

    for eqn in body.eqns:
        out = emit_eqn(eqn, [read(a) for a in eqn.inputs])
        values.update({v.id: o for v, o in zip(eqn.outvars, results_of(eqn, out))})
    return [read(a) for a in body.outvars], values


def _checkpoint_jvp(ts, primals, *, body, policy, prevent_cse):
    return jvp_graph(closed(body), primals, ts)


def _checkpoint_linearize(primals, active, *, body, policy, prevent_cse):
    outs, values = _forward_values(body, primals)

    def pullback(cts, wanted):
        reuse = {v.id: values[v.id] for eqn in body.eqns if _saved(policy, eqn) for v in eqn.outvars}
        args = list(primals)
        if prevent_cse and policy != "everything_saveable" and args:
            args = emit("optimization_barrier", *args)
        return Linearized(closed(body), args, active, reuse=reuse).transpose(cts)

    return outs, pullback


def _checkpoint_batch(xs, dims, size, *, body, policy, prevent_cse):
    operands, flags = _batched(xs, dims, size)
    out = depends(body, flags)
    new_body = _batched_graph(body, flags, out, size, [aval(o) for o in operands], "a batched checkpoint")
    result = emit("checkpoint", *operands, body=new_body, policy=policy, prevent_cse=prevent_cse)
    return result, [0 if f else None for f in out]


register_rules("checkpoint", _checkpoint_jvp, _checkpoint_linearize, _checkpoint_batch)


# --- optimization_barrier and debug_print ---------------------------------------------------

def _barrier_jvp(ts, primals, out):
    moving = [t for t in ts if t is not None]
    through = iter(emit("optimization_barrier", *moving) if moving else ())
    return [None if t is None else next(through) for t in ts]


def _barrier_vjp(cts, wanted, primals, out):
    return [ct if w else None for ct, w in zip(cts, wanted)]


def _barrier_batch(xs, dims, size):
    return emit("optimization_barrier", *xs), list(dims)


JVP["optimization_barrier"] = _barrier_jvp
VJP["optimization_barrier"] = _barrier_vjp
BATCH["optimization_barrier"] = _barrier_batch


def _print_jvp(ts, primals, out, **params):
    return [None]


def _print_vjp(cts, wanted, primals, out, **params):
    return [None] * len(primals)


def _example(x: Any, axis: int, b: int) -> Any:
    """Example `b` of `x` batched along `axis`."""
    shape = aval(x).shape
    start = tuple(b if i == axis else 0 for i in range(len(shape)))
    limit = tuple(b + 1 if i == axis else n for i, n in enumerate(shape))
    piece = emit("slice", x, start=start, limit=limit, strides=(1,) * len(shape))
    return reshape(piece, shape[:axis] + shape[axis + 1:])


def _print_batch(xs, dims, size, *, fmt, names):
    """A batched print prints each example in turn."""
    token = xs[0]
    for b in range(size):
        values = [x if d is None else _example(x, d, b) for x, d in zip(xs[1:], dims[1:])]
        token = emit("debug_print", token, *values, fmt=fmt, names=names)[0]
    return [token], [None]


JVP["debug_print"] = _print_jvp
VJP["debug_print"] = _print_vjp
BATCH["debug_print"] = _print_batch
