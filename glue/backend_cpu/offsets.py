"""Constant offsets of a kernel's reads moved into its operands' places, so that kernels reading
different slices of their inputs the same way share one compiled code.

A kernel's key is its structure, index constants included (`glue.backend.kernel_key`). The
tiled attention (`glue.scheduler.attention`) reads query tile t as q[..., d + 128 t, ...]: in the
GPT-2-width bf16 step, 12 of the 78 distinct kernels are copies of 4 others but for that
constant, and LLVM's time is per distinct kernel.

`lift` finds, per input, the least element each axis of its reads reaches over the kernel's
domain (a masked read only where its mask holds, since backends never touch memory where it
fails) and moves it into the input's place: every read then indexes `index - least` and the
place moves on by `least · strides` elements, which the launch adds to the operand's byte offset
(where operands live is not compiled in). What the code computes is unchanged, and every index
it reads at stays at or above zero, so the moved base stays within the buffer. Inputs stay where
they are when:
- an output shares their place (an output written in place: the code's pointers would then
  differ while their memory overlaps);
- a data-dependent index reads them (a gather's indices), whose rewriting is not worth having;
- the kernel's kind reads memory other than through its loads' indices (a scatter copies its
  `init` input whole).
"""
from __future__ import annotations

import math
from dataclasses import replace

from glue.ir.core import strides
from glue.scheduler.kernel_ir import (Expr, Index, Kernel, Load, bounds_in, dim_ranges, index_values, indices_of,
                                      loads_under, narrowed, rewrite_values, subexpressions)

MOVABLE_KINDS = frozenset({"pointwise", "reduction", "contraction"})


def _read_inside_indices(kernel: Kernel) -> set[int]:
    """The inputs some data-dependent index reads."""
    values = [v for e in subexpressions(kernel.roots) for v in index_values(indices_of(e))]
    return {load.input for load in loads_under(values)}


def _least_reached(loads: list[Load], extents: tuple[int, ...], rank: int) -> list[float]:
    """Per axis of an input, the least index its `loads` read at over the domain (inf where
    none reads; -inf where an index is data-dependent)."""
    everywhere = dim_ranges(extents)
    least = [math.inf] * rank
    for load in loads:
        ranges = narrowed(everywhere, load.mask) if load.mask else everywhere
        if ranges is None:  # a read whose mask never holds
            continue
        for axis, index in enumerate(load.index):
            least[axis] = min(least[axis], bounds_in(index, ranges)[0])
    return least


def lift(kernel: Kernel, fixed: frozenset[int]) -> tuple[Kernel, tuple[int, ...]] | None:
    """The kernel reading each input (but the `fixed` ones) from the least element it reaches,
    and per input the bytes its place moves on; None when no input moves."""
    if kernel.kind not in MOVABLE_KINDS:
        return None
    skipped = fixed | _read_inside_indices(kernel)
    loads_of: dict[int, list[Load]] = {}
    for load in loads_under(kernel.roots):
        loads_of.setdefault(load.input, []).append(load)
    extents = kernel.parallel + kernel.reduce
    shifts: dict[int, tuple[int, ...]] = {}
    moves = [0] * len(kernel.inputs)
    for i, loads in loads_of.items():
        if i in skipped:
            continue
        shape = kernel.inputs[i].type.shape
        least = _least_reached(loads, extents, len(shape))
        shift = tuple(min(int(lo), n - 1) if math.isfinite(lo) and lo >= 1 and n > 1 else 0
                      for lo, n in zip(least, shape))
        if any(shift):
            shifts[i] = shift
            moves[i] = sum(s * st for s, st in zip(shift, strides(shape))) * kernel.inputs[i].type.dtype.itemsize
    if not shifts:
        return None

    def moved(e: Expr) -> Expr:
        if isinstance(e, Load) and e.input in shifts:
            return replace(e, index=tuple(Index(ix.terms, ix.const - s) for ix, s in zip(e.index, shifts[e.input])))
        return e

    return rewrite_values(kernel, moved), tuple(moves)


__all__ = ["MOVABLE_KINDS", "lift"]
