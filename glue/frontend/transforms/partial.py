"""Splitting a body's reverse mode into a forward that saves residuals and a backward that uses
them (JAX's partial evaluation, for the bodies of scan and cond).

`split_vjp` traces one program computing the body's outputs *and* its input cotangents from
the inputs and the output cotangents, then cuts it in two: the equations that do not depend
on any cotangent (the forward, plus whatever the backward derives from forward values alone)
form `fwd`, the others `bwd`. The values `bwd` reads from the forward side are the residuals:
a body input the caller can pass to the backward directly, or an extra output of `fwd` that
the caller stores (a scan stacks them along its iterations). Equations that read no variable
(an iota, a splat of zeros) are recomputed in `bwd` rather than saved.

`depends` is the static data flow the control-flow rules decide by before tracing anything:
which outputs of a body depend on a set of its inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from glue.errors import GlueError
from glue.frontend.tracing import new_trace
from glue.frontend.transforms.autodiff import Linearized
from glue.frontend.transforms.core import zeros
from glue.ir import ClosedGraph, Eqn, Graph, Var
from glue.ir.core import Atom
from glue.ir.primitives import has_effects


def depends(graph: Graph, flags: Sequence[bool], floats_only: bool = False) -> list[bool]:
    """For each output of `graph`, whether it depends on an input whose flag is set (through
    floating-point values only, when `floats_only`: what derivatives flow through)."""
    marked = {v.id for v, f in zip(graph.invars, flags) if f and (not floats_only or v.type.dtype.is_float)}

    def mark(inputs: Sequence[Atom], outvars: Sequence[Var]) -> None:
        if any(isinstance(a, Var) and a.id in marked for a in inputs):
            marked.update(v.id for v in outvars if not floats_only or v.type.dtype.is_float)

    for eqn in graph.eqns:
        if has_effects(eqn.primitive, eqn.params):  # the token carries no data
            mark(eqn.inputs[:1], eqn.outvars[:1])
            mark(eqn.inputs[1:], eqn.outvars[1:])
        else:
            mark(eqn.inputs, eqn.outvars)
    return [isinstance(a, Var) and a.id in marked for a in graph.outvars]


@dataclass(frozen=True)
class Split:
    """A body's VJP in two halves.

    fwd: the body's inputs -> its outputs, then `saved` (the residuals it must hand over).
    bwd: the residuals (`residuals`, in order), then one cotangent per output flagged in
        `ct_outputs` -> one cotangent per input flagged in `wanted` (zeros where none flows).
    Each residual is a body input (`from_input[k]` its position) or the fwd output
    `len(outputs) + from_saved[k]`.
    """

    fwd: Graph
    bwd: Graph
    residuals: tuple[Var, ...]
    from_input: tuple[int | None, ...]
    from_saved: tuple[int | None, ...]

    @property
    def n_saved(self) -> int:
        return sum(k is not None for k in self.from_saved)


def split_vjp(body: Graph, active: Sequence[bool], ct_outputs: Sequence[bool], wanted: Sequence[bool],
              direct: Sequence[bool], name: str) -> Split:
    """Split the VJP of `body` (inputs flagged `active` are differentiated). Inputs flagged
    `direct` may be residuals as they are; any other input the backward needs is saved by fwd."""
    effects = any(has_effects(e.primitive, e.params) for e in body.eqns)
    with new_trace(f"the vjp of {name}") as trace:
        primals = [trace.new_arg(v.type) for v in body.invars]
        if effects:
            trace.token = primals[0].atom
        lin = Linearized(ClosedGraph(body, ()), primals, active)
        cts = [trace.new_arg(a.type) if flag else None for a, flag in zip(body.outvars, ct_outputs)]
        in_cts = lin.transpose(cts)
        grads = [zeros(v.type) if ct is None else ct for ct, v, w in zip(in_cts, body.invars, wanted) if w]
        joint = trace.finish(list(lin.outs) + grads)
    if joint.consts:  # a closed body differentiates into a closed program
        raise AssertionError(f"the vjp of {name} captured {len(joint.consts)} constants")
    graph = joint.graph
    n_in, n_out = len(body.invars), len(body.outvars)
    return _cut(graph, n_in, n_out, direct, name)


def _cut(graph: Graph, n_in: int, n_out: int, direct: Sequence[bool], name: str) -> Split:
    """Cut the joint program (inputs: primals then cotangents; outputs: body outputs then
    input cotangents) where the cotangents start to matter."""
    primal_vars, ct_vars = graph.invars[:n_in], graph.invars[n_in:]
    unknown = {v.id for v in ct_vars}
    known_eqns: list[Eqn] = []
    unknown_eqns: list[Eqn] = []
    for eqn in graph.eqns:
        if any(isinstance(a, Var) and a.id in unknown for a in eqn.inputs):
            if has_effects(eqn.primitive, eqn.params):
                raise GlueError(f"{name}: a print (glue.debug.print) in the backward pass of a loop or "
                                "branch body is not supported")
            unknown_eqns.append(eqn)
            unknown.update(v.id for v in eqn.outvars)
        else:
            known_eqns.append(eqn)
    producers = {v.id: e for e in known_eqns for v in e.outvars}
    grads = graph.outvars[n_out:]
    recomputed: list[Eqn] = []
    residuals: list[Var] = []
    seen: set[int] = set()
    for atom in [a for e in unknown_eqns for a in e.inputs] + list(grads):
        if not isinstance(atom, Var) or atom.id in unknown or atom.id in seen:
            continue
        seen.add(atom.id)
        producer = producers.get(atom.id)
        if producer is not None and not any(isinstance(a, Var) for a in producer.inputs):
            recomputed.append(producer)
        else:
            residuals.append(atom)
    position = {v.id: i for i, v in enumerate(primal_vars)}
    from_input = tuple(position[r.id] if r.id in position and direct[position[r.id]] else None for r in residuals)
    saved = [r for r, k in zip(residuals, from_input) if k is None]
    from_saved, k = [], 0
    for origin in from_input:
        from_saved.append(k if origin is None else None)
        k += origin is None
    fwd = _dce(Graph((), primal_vars, tuple(known_eqns), graph.outvars[:n_out] + tuple(saved)))
    bwd = _dce(Graph((), tuple(residuals) + ct_vars, tuple(recomputed + unknown_eqns), grads))
    return Split(fwd, bwd, tuple(residuals), from_input, tuple(from_saved))


def _dce(graph: Graph) -> Graph:
    """`graph` without equations that neither feed its outputs nor have effects."""
    live = {a.id for a in graph.outvars if isinstance(a, Var)}
    kept: list[Eqn] = []
    for eqn in reversed(graph.eqns):
        if any(v.id in live for v in eqn.outvars) or has_effects(eqn.primitive, eqn.params):
            kept.append(eqn)
            live.update(a.id for a in eqn.inputs if isinstance(a, Var))
    return Graph((), graph.invars, tuple(reversed(kept)), graph.outvars)


def residual_values(split: Split, inputs: Sequence[Atom | object], saved: Sequence[object]) -> list[object]:
    """The values of `split`'s residuals, from the body's inputs and fwd's saved outputs."""
    return [inputs[i] if i is not None else saved[k] for i, k in zip(split.from_input, split.from_saved)]
