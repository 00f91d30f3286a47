"""NumPy interpreter of kernel IR (the scheduler's output): runs a Plan kernel by kernel.

Every expression is evaluated over the whole iteration domain at once (NumPy broadcasting over
a grid of domain indices), so this checks the scheduler's fusion and index maps independently
of any code generator. `run_plan_placed` also keeps every value where the memory plan puts it
(one arena, output and donated buffers) after filling that memory with poison, so a plan that
lets two live values overlap, or a kernel read memory nothing wrote yet, changes the results.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.reference.impls import IMPLS
from glue.scheduler.calls import run_call_kernel
from glue.scheduler.kernel_ir import (Clamp, Const, Dim, Div, Expr, FromValue, InBounds, Index,
                                      IndexValue, Kernel, Load, Mod, Op, RowValue, children, postorder)
from glue.scheduler.plan import Plan

_FOLD = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min,
         "argmax": np.argmax, "argmin": np.argmin}


class _Eval:
    def __init__(self, kernel: Kernel, inputs: Sequence[np.ndarray]):
        self.kernel = kernel
        self.inputs = inputs
        self.rank = kernel.rank
        self.extents = kernel.parallel + kernel.reduce
        self.rows: list[np.ndarray] = []
        self.memo: dict[Any, np.ndarray] = {}

    def dim(self, k: int) -> np.ndarray:
        shape = [1] * self.rank
        shape[k] = self.extents[k]
        return np.arange(self.extents[k]).reshape(shape)

    def index(self, index: Index) -> np.ndarray:
        total: Any = np.int64(index.const)
        for atom, c in index.terms:
            total = total + self.atom(atom) * c
        return np.asarray(total, dtype=np.int64)

    def atom(self, atom) -> np.ndarray:
        if isinstance(atom, Dim):
            return self.dim(atom.k)
        if isinstance(atom, Div):
            return self.index(atom.index) // atom.divisor
        if isinstance(atom, Mod):
            return self.index(atom.index) % atom.divisor
        if isinstance(atom, Clamp):
            return np.clip(self.index(atom.index), 0, atom.size - 1)
        assert isinstance(atom, FromValue)
        return self.expr(atom.value).astype(np.int64)

    def mask(self, mask) -> np.ndarray:
        ok: Any = True
        for index, lo, hi in mask:
            i = self.index(index)
            ok = ok & (i >= lo) & (i < hi)
        return np.asarray(ok)

    def expr(self, e: Expr) -> np.ndarray:
        # What an expression reads is evaluated first, with an explicit stack: expressions are
        # as deep as the programs are long.
        for node in postorder(e, children, self.memo):
            self.memo[node] = self._expr(node)
        return self.memo[e]

    def _expr(self, e: Expr) -> np.ndarray:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=e.dtype.numpy)
        if isinstance(e, RowValue):
            return self.rows[e.k]
        if isinstance(e, IndexValue):
            return self.index(e.index).astype(e.dtype.numpy)
        if isinstance(e, InBounds):
            return self.mask(e.mask)
        if isinstance(e, Load):
            ok = self.mask(e.mask)
            where = tuple(np.where(ok, self.index(i), 0) for i in e.index)
            values = self.inputs[e.input][where] if where else self.inputs[e.input][()]
            return np.where(ok, values, np.asarray(e.other).astype(e.dtype.numpy)) if e.mask else values
        assert isinstance(e, Op)
        return np.asarray(IMPLS[e.primitive](*(self.expr(a) for a in e.args), **dict(e.params)))

    def full(self, value: np.ndarray) -> np.ndarray:
        return np.broadcast_to(value, self.extents)

    def run(self, outputs: list[np.ndarray]) -> None:
        for r in self.kernel.reductions:
            flat = self.full(self.expr(r.value)).reshape(self.kernel.parallel + (-1,))
            if flat.shape[-1] == 0:
                folded = IMPLS[f"reduce_{r.op}"](flat, axes=(flat.ndim - 1,))
            else:
                folded = _FOLD[r.op](flat, axis=-1)
            self.rows.append(np.asarray(folded).astype(r.dtype.numpy).reshape(
                self.kernel.parallel + (1,) * len(self.kernel.reduce)))
        for s in self.kernel.stores:
            value = self.expr(s.value)
            if s.level == "row":
                value = np.broadcast_to(value, self.kernel.parallel + (1,) * len(self.kernel.reduce))
                value = value.reshape(self.kernel.parallel)
                where = tuple(np.broadcast_to(self.index(i), self.extents)[(...,) + (0,) * len(self.kernel.reduce)]
                              for i in s.index)
            else:
                value = self.full(value)
                where = tuple(np.broadcast_to(self.index(i), self.extents) for i in s.index)
            out = outputs[s.output]
            if s.mode == "add":
                ok = np.broadcast_to(self.mask(s.mask), value.shape)
                np.add.at(out, tuple(w[ok] for w in where), value[ok])
            else:
                out[where] = value


def _run_equation(kernel: Kernel, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A kernel that is one equation (a backend's attention kernel), by the reference's rule."""
    eqn = kernel.call
    by_value = {b.value_id: x for b, x in zip(kernel.inputs, inputs)}
    args = [by_value[a.id] if hasattr(a, "id") else np.asarray(a.value, a.type.dtype.numpy) for a in eqn.inputs]
    return [np.asarray(x) for x in IMPLS[eqn.primitive](*args, **eqn.param_dict)]


def run_kernel(kernel: Kernel, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of one kernel on NumPy inputs."""
    if kernel.kind == "attention":
        return _run_equation(kernel, inputs)
    if kernel.call is not None:
        return run_call_kernel(kernel, inputs)
    outputs = [np.empty(b.type.shape, b.type.dtype.numpy) for b in kernel.outputs]
    if kernel.init is not None:
        outputs[0][...] = inputs[kernel.init]
    _Eval(kernel, inputs).run(outputs)
    return outputs


def run_plan(plan: Plan, args: Sequence[Any]) -> list[np.ndarray]:
    """Run a Plan's kernels in order on NumPy arguments (constvars' values, then invars')."""
    graph = plan.graph
    env: dict[int, np.ndarray] = {}
    for v, a in zip(graph.constvars + graph.invars, args):
        env[v.id] = np.asarray(a, dtype=v.type.dtype.numpy)
    for kernel in plan.kernels:
        outs = run_kernel(kernel, [env[b.value_id] for b in kernel.inputs])
        env.update({b.value_id: o for b, o in zip(kernel.outputs, outs)})
    return [np.asarray(a.value, dtype=a.type.dtype.numpy) if not hasattr(a, "id") else env[a.id]
            for a in graph.outvars]


def run_plan_placed(plan: Plan, args: Sequence[Any], poison: int = 0xFF) -> list[np.ndarray]:
    """`run_plan`, with each value kept at its placement in memory filled with the byte
    `poison` first (0xFF: NaN in every float type, -1 in every integer type). A kernel's
    outputs are computed from its inputs before they are stored, as a kernel writing in place
    reads each element before writing it."""
    graph, memory = plan.graph, plan.memory
    buffers = [np.array(a, dtype=v.type.dtype.numpy) for v, a in zip(graph.constvars + graph.invars, args)]
    arena = np.full(memory.arena_bytes, poison, np.uint8)
    outputs = [np.full(t.nbytes, poison, np.uint8) for t in plan.output_types]

    def where(vid: int) -> np.ndarray:
        p = memory.placements[vid]
        if p.kind == "argument":
            return buffers[p.slot]
        raw = arena[p.slot:p.slot + p.type.nbytes] if p.kind == "arena" else \
            outputs[p.slot] if p.kind == "output" else buffers[p.slot].reshape(-1).view(np.uint8)
        return raw.view(p.type.dtype.numpy).reshape(p.type.shape)

    for kernel in plan.kernels:
        outs = run_kernel(kernel, [where(b.value_id).copy() for b in kernel.inputs])
        for b, o in zip(kernel.outputs, outs):
            where(b.value_id)[...] = o
    results = []
    for r, a in zip(plan.results(), graph.outvars):
        if r.kind == "literal":
            results.append(np.asarray(r.value, dtype=r.type.dtype.numpy))
        else:
            results.append(where(a.id).copy())
    return results
