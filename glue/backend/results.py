"""A call's results from the buffers it produced, by the Plan's `Result` of each graph output:
one rule for every backend, which supplies the few memory operations it needs."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from glue.ir import TensorType
from glue.scheduler.plan import Result


class Memory(Protocol):
    """What assembling results needs from a backend's buffers."""

    def copy(self, buffer: Any, type_: TensorType) -> Any:
        """A fresh buffer holding `buffer`'s values (an argument the program returns)."""

    def full(self, type_: TensorType, value: Any) -> Any:
        """A buffer of `type_` with `value` everywhere (a literal output)."""

    def reuse(self, buffer: Any, type_: TensorType) -> Any:
        """A donated argument's buffer, which the kernels wrote, as an output of `type_`."""


def direct_picks(results: Sequence[Result], arg_types: Sequence[TensorType]
                 ) -> tuple[list[int], list[int]] | None:
    """When every result is a fresh output or a donated argument of the result's own type (the
    usual cases, which then need no case analysis per call): each result's index into
    `[*arguments, *outputs]`, and the slots of the donated arguments among them (the kernels
    wrote those buffers); else None."""
    n_args = len(arg_types)
    picks, donated = [], []
    for r in results:
        if r.kind == "output":
            picks.append(n_args + r.slot)
        elif r.kind == "donated" and arg_types[r.slot] == r.type:
            picks.append(r.slot)
            donated.append(r.slot)
        else:
            return None
    return picks, donated


def assemble(results: Sequence[Result], outputs: Sequence[Any], arguments: Sequence[Any],
             memory: Memory) -> list[Any]:
    """The call's results: fresh `outputs` by slot, copies or donated buffers of `arguments`,
    literals filled in."""
    out = []
    for r in results:
        if r.kind == "output":
            out.append(outputs[r.slot])
        elif r.kind == "literal":
            out.append(memory.full(r.type, r.value))
        elif r.kind == "donated":
            out.append(memory.reuse(arguments[r.slot], r.type))
        else:
            out.append(memory.copy(arguments[r.slot], r.type))
    return out
