"""Differentiation and batching of control flow: scan, while and cond.

Each rule builds the transformed equation with new bodies, traced from the old ones through
the graph interpreters (`jvp_graph`, `Linearized`, `batch_graph`), so nested control flow
transforms by the same rules. Which carries need tangents or a batch axis is a fixed point of
the body's data flow (`depends`), as in JAX. Symbolic zeros stay symbolic where no derivative
flows; where a loop needs a value, they become arrays of zeros.

- scan: forward mode is one scan of primal and tangent carries. Reverse mode saves residuals:
  the body's VJP is split (`partial.split_vjp`) into a forward that also emits, per iteration,
  the values the backward needs (stacked like ys; inputs the backward needs as they are, such
  as the scanned xs and the constants, are read from the operands instead), and a backward run
  by a second scan in the opposite direction whose carry is the cotangent of the carry plus
  accumulators for the constants' cotangents.
- cond: forward mode branches on primal and tangent; reverse mode saves each branch's residuals
  (zeros in the branches not taken) and branches again for the backward. With a batched
  predicate every branch runs and a select picks each example's result.
- while: forward mode loops over primal and tangent carries; reverse mode is refused, as in
  JAX (the trip count is unknown until it runs). With a batched predicate the loop runs until
  every example is done, each keeping its carry once its own predicate fails.
"""
from __future__ import annotations

from typing import Callable, Sequence

from glue.errors import GlueError, describe_location
from glue.frontend.tracing import bind
from glue.frontend.transforms.autodiff import (JVP, JVP_JOINT, LINEARIZE, VJP, jvp_by_joint, jvp_graph,
                                               vjp_by_linearizing)
from glue.frontend.transforms.batching import BATCH, batch_graph, move_batch
from glue.frontend.transforms.core import (aval, broadcast, closed, current_source, emit, filled, groups,
                                           moveaxis, pick, plus, rule_body, run_body, spread, zeros)
from glue.frontend.transforms.partial import Split, depends, residual_values, split_vjp
from glue.ir import Graph, TensorType, Var
from glue.ir import dtypes as dt
from glue.ir.primitives import has_effects


def register_rules(name: str, jvp: Callable, linearize: Callable | None, batch: Callable) -> None:
    """Fill every table for a primitive whose forward mode computes outputs and tangents
    together (`jvp`, a JVP_JOINT rule) and whose reverse mode is a LINEARIZE rule."""
    JVP_JOINT[name], JVP[name] = jvp, jvp_by_joint(name)
    if linearize is not None:
        LINEARIZE[name], VJP[name] = linearize, vjp_by_linearizing(name)
    BATCH[name] = batch


def _fixed_point(body: Graph, carry: list[bool], rest: Sequence[bool], floats_only: bool) -> tuple[list[bool], list[bool]]:
    """Carry flags closed under the body (a carry is flagged when it starts flagged or the body
    makes it depend on a flagged input), and the body's output flags for them."""
    while True:
        out = depends(body, carry + list(rest), floats_only)
        grown = [a or b for a, b in zip(carry, out)]
        if grown == carry:
            return carry, out
        carry = grown


# --- scan -----------------------------------------------------------------------------------

def _slice_type(t: TensorType) -> TensorType:
    return TensorType(t.shape[1:], t.dtype)


def _stacked(t: TensorType, length: int) -> TensorType:
    return TensorType((length,) + t.shape, t.dtype)


def _scan_jvp(ts, primals, *, body, length, reverse, num_carry, num_consts):
    nk, nc = num_carry, num_consts
    effects = has_effects("scan", {"body": body})
    nz = [t is not None for t in ts]
    carry_nz, out_nz = _fixed_point(body, nz[:nk], nz[nk:], floats_only=True)
    in_nz = carry_nz + nz[nk:]
    y_nz = out_nz[nk:]
    sizes = (nk, nc, len(primals) - nk - nc)
    operands, body_types, counts = [], [], []
    for group, ps, flags, vs in zip(range(3), groups(primals, sizes), groups(in_nz, sizes),
                                    groups(body.invars, sizes)):
        lo = sum(sizes[:group])
        tangents = [filled(ts[lo + i], aval(p)) for i, (p, f) in enumerate(zip(ps, flags)) if f]
        operands += ps + tangents
        body_types += [v.type for v in vs] + [v.type for v in pick(vs, flags)]
        counts.append(len(ps) + len(tangents))
    y_types = [a.type for a in body.outvars[nk:]]

    def step(*flat):
        parts = groups(flat, counts)
        primal_args, tangent_args = [], []
        for part, flags, n in zip(parts, groups(in_nz, sizes), sizes):
            primal_args += part[:n]
            tangent_args += spread(part[n:], flags)
        outs, touts = jvp_graph(closed(body), primal_args, tangent_args)
        carry_t = [filled(t, v.type) for t, v, f in zip(touts[:nk], body.invars, carry_nz) if f]
        y_t = [filled(t, ty) for t, ty, f in zip(touts[nk:], y_types, y_nz) if f]
        return outs[:nk] + carry_t + outs[nk:] + y_t

    graph = rule_body(step, body_types, effects, "the jvp of a scan body")
    out = bind("scan", *operands, body=graph, length=length, reverse=reverse, num_carry=counts[0],
               num_consts=counts[1])
    n_ct, n_y = sum(carry_nz), len(y_types)
    carry, carry_t = out[:nk], out[nk:nk + n_ct]
    ys, ys_t = out[nk + n_ct:nk + n_ct + n_y], out[nk + n_ct + n_y:]
    return carry + ys, spread(carry_t, carry_nz) + spread(ys_t, y_nz)


def _scan_linearize(primals, active, *, body, length, reverse, num_carry, num_consts):
    nk, nc = num_carry, num_consts
    n_in, n_out = len(primals), len(body.outvars)
    floats = [v.type.dtype.is_float for v in body.invars]
    carry_act, out_act = _fixed_point(body, [a and f for a, f in zip(active[:nk], floats)],
                                      active[nk:], floats_only=True)
    body_active = carry_act + list(active[nk:])
    wanted = [a and f for a, f in zip(body_active, floats)]
    direct = [i >= nk for i in range(n_in)]  # constants and xs can be read again; carries change
    split = split_vjp(body, body_active, out_act, wanted, direct, "a scan body")
    fwd = bind("scan", *primals, body=split.fwd, length=length, reverse=reverse, num_carry=nk, num_consts=nc)
    outs, saved = fwd[:n_out], fwd[n_out:]

    def pullback(cts, wanted_now):
        return _scan_backward(split, primals, saved, cts, wanted, out_act, body, length, reverse, nk, nc)

    return outs, pullback


def _scan_backward(split: Split, primals, saved, cts, wanted, out_act, body: Graph, length: int,
                   reverse: bool, nk: int, nc: int) -> list[Any]:
    """The reverse scan: carries the carry's cotangent and the constants' accumulated ones."""
    out_types = [a.type for a in body.outvars]
    carry_ct = [filled(ct, t) for ct, t, w in zip(cts[:nk], out_types[:nk], wanted[:nk]) if w]
    const_acc = [zeros(v.type) for v, w in zip(body.invars[nk:nk + nc], wanted[nk:nk + nc]) if w]
    # residuals the backward reads as they are: constants are constants, xs are scanned again
    const_res = [i for i in split.from_input if i is not None and i < nk + nc]
    x_res = [i for i in split.from_input if i is not None and i >= nk + nc]
    ys_ct = [filled(ct, _stacked(t, length)) for ct, t, a in zip(cts[nk:], out_types[nk:], out_act[nk:]) if a]
    carries = carry_ct + const_acc
    consts = [primals[i] for i in const_res]
    xs = list(saved) + [primals[i] for i in x_res] + ys_ct
    types = [aval(v) for v in carries + consts] + [_slice_type(aval(x)) for x in xs]
    sizes = (len(carry_ct), len(const_acc), len(consts), len(saved), len(x_res), len(ys_ct))
    wanted_carry = sum(wanted[:nk])

    def step(*flat):
        ct_carry, acc, const_vals, saved_t, x_t, ct_y = groups(flat, sizes)
        inputs = {i: v for i, v in zip(const_res + x_res, const_vals + x_t)}
        residuals = residual_values(split, inputs, saved_t)
        ct_in = spread(ct_carry, wanted[:nk]) + spread(ct_y, out_act[nk:])
        grads = run_body(split.bwd, residuals + pick([filled(c, t) for c, t in zip(ct_in, out_types)], out_act))
        new_carry, new_consts, new_xs = groups(grads, (wanted_carry, sum(wanted[nk:nk + nc]),
                                                        len(grads) - wanted_carry - sum(wanted[nk:nk + nc])))
        return new_carry + [plus(a, g) for a, g in zip(acc, new_consts)] + new_xs

    graph = rule_body(step, types, False, "the backward of a scan body")
    out = bind("scan", *carries, *consts, *xs, body=graph, length=length, reverse=not reverse,
               num_carry=len(carries), num_consts=len(consts))
    n_carry = len(carries)
    grads = spread(out[:len(carry_ct)], wanted[:nk]) + spread(out[len(carry_ct):n_carry], wanted[nk:nk + nc]) + \
        spread(out[n_carry:], wanted[nk + nc:])
    return grads


def _scan_batch(xs, dims, size, *, body, length, reverse, num_carry, num_consts):
    nk, nc = num_carry, num_consts
    effects = has_effects("scan", {"body": body})
    batched = [d is not None for d in dims]
    carry_b, out_b = _fixed_point(body, batched[:nk], batched[nk:], floats_only=False)
    in_b = carry_b + batched[nk:]
    operands, types = [], []
    for i, (x, d, v) in enumerate(zip(xs, dims, body.invars)):
        if i >= nk + nc and d is not None:  # a scanned operand: its batch axis goes after the scan axis
            operands.append(moveaxis(x, d, 1))
        elif in_b[i]:
            operands.append(move_batch(x, d, 0, size))
        else:
            operands.append(x)
        types.append(TensorType((size,) + v.type.shape, v.type.dtype) if in_b[i] else v.type)

    def step(*flat):
        outs, out_dims = batch_graph(closed(body), flat, [0 if b else None for b in in_b], size)
        return [move_batch(o, d, 0, size) if b else o for o, d, b in zip(outs, out_dims, out_b)]

    graph = rule_body(step, types, effects, "a batched scan body")
    out = bind("scan", *operands, body=graph, length=length, reverse=reverse, num_carry=nk, num_consts=nc)
    return out, [0 if b else None for b in out_b[:nk]] + [1 if b else None for b in out_b[nk:]]


register_rules("scan", _scan_jvp, _scan_linearize, _scan_batch)


# --- while ----------------------------------------------------------------------------------

def _with_unused(graph: Graph, at: int, types: Sequence[TensorType]) -> Graph:
    """`graph` taking extra, unused inputs of `types` before its input `at`."""
    invars = graph.invars
    return Graph((), invars[:at] + tuple(Var(t) for t in types) + invars[at:], graph.eqns, graph.outvars)


def _while_jvp(ts, primals, *, cond, body, num_carry, cond_consts):
    nk, ncc = num_carry, cond_consts
    effects = has_effects("while", {"cond": cond, "body": body})
    nz = [t is not None for t in ts]
    body_const_nz = nz[nk + ncc:]
    carry_nz, _ = _fixed_point(body, nz[:nk], body_const_nz, floats_only=True)
    carry, cconsts, bconsts = groups(primals, (nk, ncc, len(primals) - nk - ncc))
    carry_t = [filled(ts[i], aval(p)) for i, (p, f) in enumerate(zip(carry, carry_nz)) if f]
    bconst_t = [ts[nk + ncc + i] for i, f in enumerate(body_const_nz) if f]
    tangent_types = [aval(t) for t in carry_t]
    new_cond = _with_unused(cond, nk, tangent_types)
    n_ct = len(carry_t)
    types = [v.type for v in body.invars[:nk]] + tangent_types + [v.type for v in body.invars[nk:]] + \
        [aval(t) for t in bconst_t]

    def step(*flat):
        c, c_t, k, k_t = groups(flat, (nk, n_ct, len(bconsts), len(bconst_t)))
        outs, touts = jvp_graph(closed(body), c + k, spread(c_t, carry_nz) + spread(k_t, body_const_nz))
        return outs + [filled(t, v.type) for t, v, f in zip(touts, body.invars, carry_nz) if f]

    graph = rule_body(step, types, effects, "the jvp of a while_loop body")
    out = bind("while", *carry, *carry_t, *cconsts, *bconsts, *bconst_t, cond=new_cond, body=graph,
               num_carry=nk + n_ct, cond_consts=ncc)
    return out[:nk], spread(out[nk:], carry_nz)


def _while_vjp(ct, wanted, primals, out, **params):
    raise GlueError("while_loop cannot be differentiated in reverse mode (its trip count is only known "
                    "when it runs), as in JAX; use lax.scan, or lax.fori_loop with static bounds "
                    f"{describe_location(current_source())}")


def _while_batch(xs, dims, size, *, cond, body, num_carry, cond_consts):
    nk, ncc = num_carry, cond_consts
    effects = has_effects("while", {"cond": cond, "body": body})
    batched = [d is not None for d in dims]
    carry_b, _ = _fixed_point(body, batched[:nk], batched[nk + ncc:], floats_only=False)
    pred_batched = depends(cond, carry_b + batched[nk:nk + ncc])[0]
    if pred_batched:  # every example carries its own value, which stops changing when it is done
        carry_b = [not (effects and i == 0) for i in range(nk)]
    in_b = carry_b + batched[nk:]
    operands = [move_batch(x, d, 0, size) if b else x for x, d, b in zip(xs, dims, in_b)]
    types = [aval(o) for o in operands]
    carry_dims = [0 if b else None for b in carry_b]
    cond_dims = carry_dims + [0 if b else None for b in in_b[nk:nk + ncc]]
    body_dims = carry_dims + [0 if b else None for b in in_b[nk + ncc:]]
    cond_types, body_types = types[:nk + ncc], types[:nk] + types[nk + ncc:]

    def predicate(args):
        (pred,), (d,) = batch_graph(closed(cond), args, cond_dims, size)
        return pred if d is None else move_batch(pred, d, 0, size)

    def advance(args):
        outs, out_dims = batch_graph(closed(body), args, body_dims, size)
        return [move_batch(o, d, 0, size) if b else o for o, d, b in zip(outs, out_dims, carry_b)]

    if not pred_batched:
        new_cond = rule_body(lambda *a: [predicate(a)], cond_types, False, "a batched while_loop condition")
        new_body = rule_body(lambda *a: advance(a), body_types, effects, "a batched while_loop body")
        out = bind("while", *operands, cond=new_cond, body=new_body, num_carry=nk, cond_consts=ncc)
        return out, carry_dims

    def any_left(*args):
        return [emit("reduce_max", predicate(args), axes=(0,))]

    def guarded(*args):
        carry, cconsts, bconsts = groups(args, (nk, ncc, len(args) - nk - ncc))
        going = predicate(carry + cconsts)
        new = advance(carry + bconsts)
        return [n if effects and i == 0 else
                emit("select", broadcast(going, aval(c).shape, (0,)), n, c)
                for i, (n, c) in enumerate(zip(new, carry))]

    # the body evaluates the predicate too: it takes the condition's constants before its own
    new_cond = rule_body(any_left, cond_types, False, "a batched while_loop condition")
    new_body = rule_body(guarded, types, effects, "a batched while_loop body")
    carry_ops, cond_ops, body_ops = groups(operands, (nk, ncc, len(operands) - nk - ncc))
    out = bind("while", *carry_ops, *cond_ops, *cond_ops, *body_ops, cond=new_cond, body=new_body,
               num_carry=nk, cond_consts=ncc)
    return out, carry_dims


register_rules("while", _while_jvp, None, _while_batch)
VJP["while"] = _while_vjp


# --- cond -----------------------------------------------------------------------------------

def _branch_flags(branches: Sequence[Graph], flags: Sequence[bool], floats_only: bool) -> list[bool]:
    """Output flags over every branch: an output is flagged if it is in any branch."""
    per_branch = [depends(b, flags, floats_only) for b in branches]
    return [any(fs) for fs in zip(*per_branch)]


def _cond_jvp(ts, primals, *, branches):
    ops, index = primals[:-1], primals[-1]
    effects = has_effects("cond", {"branches": branches})
    nz = [t is not None for t in ts[:-1]]
    out_nz = _branch_flags(branches, nz, floats_only=True)
    tangents = [filled(t, aval(p)) for t, p, f in zip(ts, ops, nz) if f]
    types = [aval(p) for p in ops] + [aval(t) for t in tangents]
    out_types = [a.type for a in branches[0].outvars]
    n = len(ops)

    def jvp_of(branch: Graph) -> Callable:
        def fn(*flat):
            outs, touts = jvp_graph(closed(branch), flat[:n], spread(flat[n:], nz))
            return outs + [filled(t, ty) for t, ty, f in zip(touts, out_types, out_nz) if f]
        return fn

    graphs = tuple(rule_body(jvp_of(b), types, effects, "the jvp of a branch") for b in branches)
    out = bind("cond", *ops, *tangents, index, branches=graphs)
    return out[:len(out_types)], spread(out[len(out_types):], out_nz)


def _cond_linearize(primals, active, *, branches):
    ops, index = primals[:-1], primals[-1]
    effects = has_effects("cond", {"branches": branches})
    op_active = list(active[:-1])
    floats = [v.type.dtype.is_float for v in branches[0].invars]
    wanted = [a and f for a, f in zip(op_active, floats)]
    out_act = _branch_flags(branches, op_active, floats_only=True)
    direct = [True] * len(ops)
    splits = [split_vjp(b, op_active, out_act, wanted, direct, "a branch") for b in branches]
    n_out = len(branches[0].outvars)
    saved_types = [[a.type for a in s.fwd.outvars[n_out:]] for s in splits]
    op_types = [aval(p) for p in ops]

    def forward(k: int) -> Callable:
        def fn(*args):
            got = run_body(splits[k].fwd, args)
            mine = iter(got[n_out:])
            saved = [next(mine) if j == k else zeros(t) for j, ts in enumerate(saved_types) for t in ts]
            return got[:n_out] + saved
        return fn

    fwd_graphs = tuple(rule_body(forward(k), op_types, effects, "the forward of a branch")
                       for k in range(len(branches)))
    fwd = bind("cond", *ops, index, branches=fwd_graphs)
    outs, saved = fwd[:n_out], fwd[n_out:]

    def pullback(cts, wanted_now):
        out_types = [a.type for a in branches[0].outvars]
        cts = [filled(c, t) for c, t, a in zip(cts, out_types, out_act) if a]
        sizes = [len(ts) for ts in saved_types]

        def backward(k: int) -> Callable:
            def fn(*args):
                all_saved = groups(args[:sum(sizes)], sizes)
                inputs = dict(enumerate(args[sum(sizes):sum(sizes) + len(ops)]))
                residuals = residual_values(splits[k], inputs, all_saved[k])
                return run_body(splits[k].bwd, residuals + list(args[sum(sizes) + len(ops):]))
            return fn

        types = [aval(s) for s in saved] + op_types + [aval(c) for c in cts]
        bwd_graphs = tuple(rule_body(backward(k), types, False, "the backward of a branch")
                           for k in range(len(branches)))
        grads = bind("cond", *saved, *ops, *cts, index, branches=bwd_graphs)
        return spread(grads, wanted) + [None]

    return outs, pullback


def _cond_batch(xs, dims, size, *, branches):
    ops, index = xs[:-1], xs[-1]
    op_dims, index_dim = dims[:-1], dims[-1]
    effects = has_effects("cond", {"branches": branches})
    if index_dim is not None:
        return _cond_as_select(ops, op_dims, move_batch(index, index_dim, 0, size), size, branches, effects)
    batched = [d is not None for d in op_dims]
    out_b = _branch_flags(branches, batched, floats_only=False)
    operands = [move_batch(x, d, 0, size) if b else x for x, d, b in zip(ops, op_dims, batched)]
    types = [aval(o) for o in operands]

    def batched_branch(branch: Graph) -> Callable:
        def fn(*args):
            outs, out_dims = batch_graph(closed(branch), args, [0 if b else None for b in batched], size)
            return [move_batch(o, d, 0, size) if b else o for o, d, b in zip(outs, out_dims, out_b)]
        return fn

    graphs = tuple(rule_body(batched_branch(b), types, effects, "a batched branch") for b in branches)
    out = bind("cond", *operands, index, branches=graphs)
    return out, [0 if b else None for b in out_b]


def _cond_as_select(ops, op_dims, index, size, branches, effects):
    """Every branch on the whole batch, each example's result chosen by its own index."""
    index = emit("max", emit("min", index, dt.int32.numpy.type(len(branches) - 1)), dt.int32.numpy.type(0))
    results = []
    for branch in branches:
        outs, out_dims = batch_graph(closed(branch), ops, op_dims, size)
        results.append([o if effects and i == 0 else move_batch(o, d, 0, size)
                        for i, (o, d) in enumerate(zip(outs, out_dims))])
    chosen = results[-1]
    for k in reversed(range(len(branches) - 1)):
        take = emit("eq", index, dt.int32.numpy.type(k))
        chosen = [c if effects and i == 0 else emit("select", broadcast(take, aval(c).shape, (0,)), r, c)
                  for i, (r, c) in enumerate(zip(results[k], chosen))]
    return chosen, [None if effects and i == 0 else 0 for i in range(len(chosen))]


register_rules("cond", _cond_jvp, _cond_linearize, _cond_batch)
