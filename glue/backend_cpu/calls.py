"""Call kernels on the CPU: control flow, calls and prints, run from the executor's step list.

Each body of a call kernel is compiled once, as a program of its own, by this backend (and
cached: the same body in another program or kernel is the same compiled code). A call step
runs the scheduler's `CallPlan` (glue.scheduler.calls) with a Runner over raw addresses: a
kernel operand is its buffer-table entry plus its byte offset, so a scan's body reads slice t
of xs and writes slice t of ys where they lie in the parent program's buffers, with no copy;
scratch buffers (a scan's second carry, a while's carries and predicate) are allocated per
call; literal operands live in small arrays filled once. Predicates and indices are read
directly from memory, since every kernel before the call has finished when it runs.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from glue.ir import TensorType
from glue.scheduler.calls import CallPlan, Ref, run_call
from glue.scheduler.kernel_ir import Kernel

if TYPE_CHECKING:  # program.py builds call sites, so it imports this module
    from glue.backend_cpu.program import Operand


@dataclass
class CallSite:
    """A call kernel of a program: its plan and where its operands and results live."""

    kernel: Kernel
    plan: CallPlan
    inputs: list[Operand]
    outputs: list[Operand]

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def kind(self) -> str:
        return self.kernel.kind


def array_at(address: int, type_: TensorType) -> np.ndarray:
    """A NumPy view of the `type_` array at `address`."""
    if not type_.nbytes:
        return np.zeros(type_.shape, type_.dtype.numpy)
    raw = (ctypes.c_char * type_.nbytes).from_address(address)
    return np.frombuffer(raw, dtype=type_.dtype.numpy).reshape(type_.shape)


def address_of(x: np.ndarray) -> int:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(x))
    except (TypeError, ValueError):
        return x.ctypes.data


class CallStep:
    """A call site with the executables of its bodies: what the executor runs."""

    def __init__(self, site: CallSite, bodies: Sequence[Any]):
        self.site = site
        self.bodies = list(bodies)
        self.literals = [np.full((), a.value, a.type.dtype.numpy) for a in site.plan.literals]

    def run(self, table: Any) -> None:
        run_call(self.site.plan, _Runner(self, table))


class _Runner:
    """The scheduler's Runner over this call's addresses."""

    def __init__(self, step: CallStep, table: Any):
        self.step = step
        site = step.site
        self.scratch = [np.empty(t.shape, t.dtype.numpy) for t in site.plan.scratch]
        self.bases = {"input": [(table[o.slot] or 0) + o.offset for o in site.inputs],
                      "output": [(table[o.slot] or 0) + o.offset for o in site.outputs],
                      "scratch": [address_of(x) for x in self.scratch],
                      "literal": [address_of(x) for x in step.literals]}

    def address(self, ref: Ref) -> int:
        return self.bases[ref.kind][ref.index] + ref.offset

    def invoke(self, body: int, args: Sequence[Ref], results: Sequence[Ref]) -> None:
        self.step.bodies[body].run_at([self.address(r) for r in args], [self.address(r) for r in results])

    def copy(self, source: Ref, target: Ref, type_: TensorType) -> None:
        if type_.nbytes:
            ctypes.memmove(self.address(target), self.address(source), type_.nbytes)

    def read(self, ref: Ref, type_: TensorType) -> np.ndarray:
        return array_at(self.address(ref), type_).copy()
