"""Call kernels: how an equation of an opaque primitive (scan, while, cond, a custom-derivative
call or checkpoint left in a program, optimization_barrier, debug_print) becomes a kernel, and
what running one means in terms of memory, for every backend to follow.

`lower_call(eqn)` makes the Kernel: kind "call", the equation's variable operands as inputs,
its results as outputs, the equation itself in `Kernel.call`. A backend compiles each body
Graph once as a program of its own and runs the kernel through `CallPlan`:

- operands and results are `Ref`s: a kernel input or output buffer, a scratch buffer the
  backend allocates for this call (scan's second carry, while's carries and predicate), or a
  constant buffer holding a literal operand; each with a byte offset, so a scan iteration reads
  its slice of xs and writes its slice of ys in place, without copies;
- a scan with a static trip count is a fixed list of body invocations (`scan_invocations`):
  carries alternate between the kernel's output and a scratch buffer, arranged so that the
  last iteration writes the output (a backend can replay the whole list, as the cuda backend
  does inside one CUDA graph);
- everything else runs through `run_call` with a `Runner` that invokes bodies, copies, and
  reads scalars (a while's predicate, a cond's index) or arrays (a print's operands) on the
  host: data-dependent control flow needs that read;
- a compiled body's results come back as its program's plan says (`body_layout`): most are
  written in place, a body that returns an input or a literal gets a copy or a fill.

The NumPy meaning of every one of these is in `glue.reference.control`; `run_call_kernel` runs
a call kernel with NumPy for the scheduler's kernel-IR interpreter.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

import numpy as np

from glue.ir import Eqn, Graph, Literal, TensorType, Var
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Buffer, Kernel

# primitive -> how its kernel runs
KINDS = {"scan": "scan", "while": "while", "cond": "cond", "custom_jvp_call": "body",
         "custom_vjp_call": "body", "checkpoint": "body", "optimization_barrier": "copy",
         "debug_print": "print"}


# Opaque primitives a backend runs as one kernel of its own (kind "attention"), not by a rule here.
OWN_KERNELS = frozenset({"attention", "attention_bwd"})


def lower_call(eqn: Eqn, name: str = "") -> Kernel:
    """The call kernel of one opaque equation (kind "call"; an attention equation a backend
    keeps whole is kind "attention": its own kernel, which `call_plan` does not describe)."""
    inputs = tuple(Buffer(v.id, v.type) for v in dict.fromkeys(a for a in eqn.inputs if isinstance(a, Var)))
    outputs = tuple(Buffer(v.id, v.type) for v in eqn.outvars)
    kind = "attention" if eqn.primitive in OWN_KERNELS else "call"
    return Kernel(f"{eqn.primitive}_{name}" if name else eqn.primitive, kind, (), (), inputs, outputs, (), (),
                  (eqn.primitive,), source=(eqn.source,) if eqn.source else (), call=eqn)


@dataclass(frozen=True)
class Ref:
    """A place relative to a call kernel's memory: kind is input | output (a kernel buffer, by
    position), scratch (a buffer the backend allocates for the call, by position in
    `CallPlan.scratch`) or literal (a constant buffer the backend fills once with
    `CallPlan.literals[index]`); `offset` in bytes."""

    kind: str
    index: int
    offset: int = 0


@dataclass(frozen=True)
class Invocation:
    """Run body `body` on `args` writing `results`; body None copies each arg to its result."""

    body: int | None
    args: tuple[Ref, ...]
    results: tuple[Ref, ...]
    types: tuple[TensorType, ...] = ()  # for copies: what each moves


@dataclass(frozen=True)
class CallPlan:
    """How to run one call kernel."""

    kind: str                            # scan | while | cond | body | copy | print
    eqn: Eqn
    bodies: tuple[Graph, ...]            # for while: (cond, body); for cond: the branches
    operands: tuple[Ref, ...]            # one per operand of the equation
    results: tuple[Ref, ...]             # one per result
    scratch: tuple[TensorType, ...]      # buffers the backend allocates for the call
    literals: tuple[Literal, ...]        # constant operands, each in a buffer of its own
    invocations: tuple["Invocation", ...] = ()  # a scan's iterations (`scan_invocations`)

    @property
    def params(self) -> dict[str, Any]:
        return self.eqn.param_dict


def call_plan(kernel: Kernel) -> CallPlan:
    eqn: Eqn = kernel.call
    slot = {b.value_id: k for k, b in enumerate(kernel.inputs)}
    literals: list[Literal] = []
    operands = []
    for a in eqn.inputs:
        if isinstance(a, Var):
            operands.append(Ref("input", slot[a.id]))
        else:
            operands.append(Ref("literal", len(literals)))
            literals.append(a)
    kind = KINDS[eqn.primitive]
    params = eqn.param_dict
    out_types = tuple(v.type for v in eqn.outvars)
    bodies: tuple[Graph, ...] = ()
    scratch: tuple[TensorType, ...] = ()
    if kind == "scan":
        bodies = (params["body"],)
        scratch = out_types[:params["num_carry"]] if params["length"] > 1 else ()
    elif kind == "while":
        bodies = (params["cond"], params["body"])
        scratch = out_types + (TensorType((), dt.bool_),)
    elif kind == "cond":
        bodies = tuple(params["branches"])
    elif kind == "body":
        bodies = (params["body"],)
    plan = CallPlan(kind, eqn, bodies, tuple(operands), tuple(Ref("output", j) for j in range(len(out_types))),
                    scratch, tuple(literals))
    return replace(plan, invocations=_scan_invocations(plan)) if kind == "scan" else plan


def body_operands(plan: CallPlan) -> tuple[Ref, ...]:
    """The operands a "body" call (custom_jvp_call, custom_vjp_call, checkpoint) runs its body on."""
    return plan.operands[:len(plan.bodies[0].invars)]


def scan_invocations(plan: CallPlan) -> tuple[Invocation, ...]:
    """The body invocations of a scan, in order: iteration t reads slice t of each x and writes
    slice t of each y where they are (reverse: from the last slice down). Worked out once, when
    the plan is made: a backend runs them on every call."""
    return plan.invocations


def _scan_invocations(plan: CallPlan) -> tuple[Invocation, ...]:
    p = plan.params
    length, nk, nc = p["length"], p["num_carry"], p["num_consts"]
    eqn = plan.eqn
    carry_types = [v.type for v in eqn.outvars[:nk]]
    x_types = [a.type for a in eqn.inputs[nk + nc:]]
    y_types = [v.type for v in eqn.outvars[nk:]]
    consts = plan.operands[nk:nk + nc]
    if length == 0:
        return (Invocation(None, plan.operands[:nk], plan.results[:nk], tuple(carry_types)),)
    out = []
    carry = plan.operands[:nk]
    for step in range(length):
        t = length - 1 - step if p["reverse"] else step
        # the last iteration writes the kernel's own carry outputs; earlier ones alternate
        to_output = (length - 1 - step) % 2 == 0
        written = plan.results[:nk] if to_output else tuple(Ref("scratch", j) for j in range(nk))
        xs = tuple(Ref(r.kind, r.index, r.offset + t * _slice_bytes(x)) for r, x in zip(plan.operands[nk + nc:], x_types))
        ys = tuple(Ref(r.kind, r.index, r.offset + t * _slice_bytes(y)) for r, y in zip(plan.results[nk:], y_types))
        out.append(Invocation(0, tuple(carry) + tuple(consts) + xs, written + ys))
        carry = written
    return tuple(out)


def _slice_bytes(stacked: TensorType) -> int:
    return stacked.nbytes // stacked.shape[0] if stacked.shape[0] else 0


@dataclass(frozen=True)
class BodyLayout:
    """Where a compiled body's outputs go, from its plan's results: output buffer `s` of the
    body's program is the body's result `slot_result[s]`; then each copy (source, result) runs,
    the source an argument ("argument", i) or an earlier result ("result", r); each fill
    (result, value) sets a result to a literal everywhere."""

    slot_result: tuple[int, ...]
    copies: tuple[tuple[tuple[str, int], int], ...]
    fills: tuple[tuple[int, Any], ...]


def body_layout(results: Sequence[Any]) -> BodyLayout:
    """The layout of a body whose program gives `results` (its plan's `Result`s)."""
    slot_result: dict[int, int] = {}
    copies, fills = [], []
    for r, res in enumerate(results):
        if res.kind == "output":
            if res.slot in slot_result:
                copies.append((("result", slot_result[res.slot]), r))
            else:
                slot_result[res.slot] = r
        elif res.kind == "argument":
            copies.append((("argument", res.slot), r))
        elif res.kind == "literal":
            fills.append((r, res.value))
        else:
            raise ValueError(f"a body has no donated arguments, but result {r} is {res.kind}")
    return BodyLayout(tuple(slot_result[s] for s in range(len(slot_result))), tuple(copies), tuple(fills))


class Runner(Protocol):
    """What `run_call` needs from a backend."""

    def invoke(self, body: int, args: Sequence[Ref], results: Sequence[Ref]) -> None:
        """Run compiled body `body` on `args`, writing `results`."""

    def copy(self, source: Ref, target: Ref, type_: TensorType) -> None: ...

    def read(self, ref: Ref, type_: TensorType) -> np.ndarray:
        """The values at `ref` (waiting for them where they are still being computed)."""


def run_call(plan: CallPlan, runner: Runner) -> None:
    """Run a call kernel through `runner`."""
    eqn = plan.eqn
    if plan.kind == "scan":
        for inv in scan_invocations(plan):
            _perform(inv, runner)
    elif plan.kind == "while":
        _run_while(plan, runner)
    elif plan.kind == "cond":
        index = int(runner.read(plan.operands[-1], eqn.inputs[-1].type))
        branch = min(max(index, 0), len(plan.bodies) - 1)
        runner.invoke(branch, plan.operands[:-1], plan.results)
    elif plan.kind == "body":
        runner.invoke(0, body_operands(plan), plan.results)
    elif plan.kind == "copy":
        for source, target, v in zip(plan.operands, plan.results, eqn.outvars):
            runner.copy(source, target, v.type)
    else:
        print(print_text(plan, runner), flush=True)


def print_text(plan: CallPlan, runner: Runner) -> str:
    """What a debug_print kernel prints: its operands read back and formatted."""
    from glue.reference.control import format_print

    eqn = plan.eqn
    values = [runner.read(r, a.type) for r, a in zip(plan.operands[1:], eqn.inputs[1:])]
    return format_print(eqn.param_dict["fmt"], eqn.param_dict["names"], values)


def _perform(inv: Invocation, runner: Runner) -> None:
    if inv.body is None:
        for source, target, t in zip(inv.args, inv.results, inv.types):
            runner.copy(source, target, t)
    else:
        runner.invoke(inv.body, inv.args, inv.results)


def _run_while(plan: CallPlan, runner: Runner) -> None:
    """Check, step, check, ...: the carries alternate between the outputs and scratch, and end
    in the outputs."""
    p = plan.params
    nk, ncc = p["num_carry"], p["cond_consts"]
    carry_types = [v.type for v in plan.eqn.outvars]
    cond_consts = plan.operands[nk:nk + ncc]
    body_consts = plan.operands[nk + ncc:]
    pred = Ref("scratch", nk)
    places = (plan.results[:nk], tuple(Ref("scratch", j) for j in range(nk)))
    carry, turn = plan.operands[:nk], 0
    while True:
        runner.invoke(0, tuple(carry) + tuple(cond_consts), (pred,))
        if not bool(runner.read(pred, TensorType((), dt.bool_))):
            break
        written = places[turn]
        runner.invoke(1, tuple(carry) + tuple(body_consts), written)
        carry, turn = written, 1 - turn
    if tuple(carry) != plan.results[:nk]:
        for source, target, t in zip(carry, plan.results[:nk], carry_types):
            runner.copy(source, target, t)


class NumpyRunner:
    """A Runner over NumPy arrays: the kernel's inputs and outputs, scratch and literals as
    arrays, bodies run by the reference (used by the kernel-IR interpreter)."""

    def __init__(self, plan: CallPlan, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]):
        from glue.reference import run_graph

        self.plan, self._run_graph = plan, run_graph
        self.memory = {"input": [np.ascontiguousarray(x) for x in inputs], "output": list(outputs),
                       "scratch": [np.zeros(t.shape, t.dtype.numpy) for t in plan.scratch],
                       "literal": [np.full((), a.value, a.type.dtype.numpy) for a in plan.literals]}

    def _view(self, ref: Ref, type_: TensorType) -> np.ndarray:
        base = self.memory[ref.kind][ref.index].reshape(-1).view(np.uint8)
        return base[ref.offset:ref.offset + type_.nbytes].view(type_.dtype.numpy).reshape(type_.shape)

    def invoke(self, body: int, args: Sequence[Ref], results: Sequence[Ref]) -> None:
        graph = self.plan.bodies[body]
        values = [self._view(r, v.type).copy() for r, v in zip(args, graph.invars)]
        for r, value, a in zip(results, self._run_graph(graph, values), graph.outvars):
            self._view(r, a.type)[...] = value

    def copy(self, source: Ref, target: Ref, type_: TensorType) -> None:
        self._view(target, type_)[...] = self._view(source, type_)

    def read(self, ref: Ref, type_: TensorType) -> np.ndarray:
        return self._view(ref, type_).copy()


def run_call_kernel(kernel: Kernel, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A call kernel's outputs on NumPy inputs."""
    outputs = [np.zeros(b.type.shape, b.type.dtype.numpy) for b in kernel.outputs]
    plan = call_plan(kernel)
    run_call(plan, NumpyRunner(plan, inputs, outputs))
    return outputs
