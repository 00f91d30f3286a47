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


def plain_outputs(results: Sequence[Result]) -> list[int] | None:
    """The output slots in result order when every result is a fresh output (the usual case,
    which then needs no case analysis per call), else None."""
    return [r.slot for r in results] if all(r.kind == "output" for r in results) else None


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
