"""Structural keys of kernels: what makes two kernels the same compiled code.

Two plan kernels get the same key when a backend would generate the same code for both: the same
kernel IR up to the Graph values its buffers hold (inputs and outputs are numbered by position,
expressions by their place in a walk of the kernel), the same shapes and dtypes, the same
pattern of operands sharing memory (`aliases`: an output written in place over an input is one
pointer, which codegen depends on), and whatever the backend adds (target, options, settings its
codegen reads). Names (the kernel's, its fused ops, the user's source lines) are left out, so
the layers of a model, or the same layer in two programs, share one compiled kernel.

The walk is iterative (kernels of 10,000-op chains are deep DAGs) and numbers each shared node
once, so a key costs time linear in the kernel's size; equal nodes get one number whether or not
they are one object.

A backend whose code reads a kernel's sizes when it runs (the cpu backend's blocked
contractions) keys it without them (`sizes=False`: extents and shapes become ranks), adding
whatever sizes its code still compiles in to the context.
"""
from __future__ import annotations

import hashlib
from dataclasses import fields, is_dataclass
from operator import attrgetter
from typing import Any, Callable, Hashable, Sequence

from glue.ir import TensorType
from glue.ir.dtypes import DType
from glue.scheduler.kernel_ir import Kernel

# Atoms print as their repr; everything else that is a dataclass or a tuple is walked.
_ATOMS = (DType, TensorType, str, int, float, bool, type(None))
_WALKED: dict[type, bool] = {}
_GETTERS: dict[type, Callable[[Any], tuple]] = {}


def _walked(value: Any) -> bool:
    cls = type(value)
    walked = _WALKED.get(cls)
    if walked is None:
        walked = _WALKED[cls] = not issubclass(cls, _ATOMS) and (issubclass(cls, tuple) or is_dataclass(cls))
    return walked


def _parts(value: Any) -> tuple:
    if isinstance(value, tuple):
        return value
    get = _GETTERS.get(type(value))
    if get is None:
        names = [f.name for f in fields(value)]
        get = _GETTERS[type(value)] = attrgetter(*names) if len(names) > 1 else \
            (lambda node, name=names[0]: (getattr(node, name),))
    return get(value)


def _label(value: Any) -> str:
    return "tuple" if isinstance(value, tuple) else type(value).__name__


def structure_text(roots: Sequence[Any]) -> list[str]:
    """`roots` as lines, one per distinct node (dataclass or tuple) in post-order: its type and
    its parts, a node part written `#n` (the n-th line), an atom as its repr. Equal nodes are one
    line whether or not they are one object (a Plan read back from the disk cache shares fewer
    objects than the one it was built as), so the text depends only on the values."""
    number: dict[int, int] = {}
    seen: dict[str, int] = {}
    lines: list[str] = []
    stack: list[tuple[Any, tuple | None]] = [(r, None) for r in reversed(roots) if _walked(r)]
    while stack:
        node, parts = stack.pop()
        if id(node) in number:
            continue
        if parts is None:
            parts = _parts(node)
            stack.append((node, parts))
            stack.extend((p, None) for p in reversed(parts) if _walked(p) and id(p) not in number)
            continue
        refs = [f"#{number[id(p)]}" if _walked(p) else repr(p) for p in parts]
        line = f"{_label(node)}({','.join(refs)})"
        at = seen.get(line)
        if at is None:
            at = seen[line] = len(lines)
            lines.append(line)
        number[id(node)] = at
    return lines


def kernel_structure(kernel: Kernel, sizes: bool = True) -> list[str]:
    """The kernel as text without its names: kind, domain, operand types, reductions, stores;
    without `sizes`, the domain and the operand types are only their ranks (and dtypes)."""
    def typed(t: TensorType) -> str:
        return str(t) if sizes else f"{t.dtype.name}[{','.join('?' * len(t.shape))}]"
    domain = f"parallel={kernel.parallel} reduce={kernel.reduce}" if sizes else \
        f"parallel rank={len(kernel.parallel)} reduce rank={len(kernel.reduce)}"
    head = [f"{kernel.kind} {domain} init={kernel.init} precision={kernel.precision}",
            "in " + " ".join(typed(b.type) for b in kernel.inputs),
            "out " + " ".join(typed(b.type) for b in kernel.outputs)]
    return head + structure_text([kernel.reductions, kernel.stores])


def aliases(places: Sequence[Hashable]) -> tuple[int, ...]:
    """Per operand (inputs then outputs), the position of the first operand at the same place:
    the memory-sharing pattern codegen sees, without the places themselves."""
    first: dict[Hashable, int] = {}
    return tuple(first.setdefault(p, i) for i, p in enumerate(places))


def kernel_key(kernel: Kernel, operand_aliases: Sequence[int], *context: str, sizes: bool = True) -> bytes:
    """The SHA-256 key of a kernel's code: its structure (with its sizes or without), its
    aliasing, and `context` (what the backend's code also depends on)."""
    h = hashlib.sha256()
    for part in (*context, repr(tuple(operand_aliases)), *kernel_structure(kernel, sizes)):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class ByStructure:
    """A memo of what is computed from a kernel's structure alone, for the kernels of one
    program. Fusion gives the copies of one lowered group (a model's layers) the very
    expression objects of the first (`glue.scheduler.lowering.GroupLowering`), so kernels with
    the same reductions and stores objects, the same head (kind, domain, operand types) and
    the same `extra` (what else the value depends on) share one entry, without their structure
    being walked again. The memo holds those objects, so their ids name them while it lives."""

    def __init__(self) -> None:
        self._found: dict[tuple, tuple[Any, tuple, tuple]] = {}

    def get(self, kernel: Kernel, compute: Callable[[], Any], *extra: Hashable) -> Any:
        """`compute()`'s value for `kernel` (and `extra`), computed once per structure."""
        head = (kernel.kind, kernel.parallel, kernel.reduce, kernel.init, kernel.precision,
                tuple(b.type for b in kernel.inputs), tuple(b.type for b in kernel.outputs))
        memo = (id(kernel.reductions), id(kernel.stores), head, extra)
        found = self._found.get(memo)
        if found is None:
            found = self._found[memo] = (compute(), kernel.reductions, kernel.stores)
        return found[0]


class KernelKeys:
    """`kernel_key` for the kernels of one program, each distinct structure hashed once
    (`ByStructure`)."""

    def __init__(self) -> None:
        self._keys = ByStructure()

    def __call__(self, kernel: Kernel, operand_aliases: Sequence[int], *context: str, sizes: bool = True) -> bytes:
        return self._keys.get(kernel, lambda: kernel_key(kernel, operand_aliases, *context, sizes=sizes),
                              tuple(operand_aliases), context, sizes)


__all__ = ["ByStructure", "KernelKeys", "aliases", "kernel_key", "kernel_structure", "structure_text"]
