"""Float literals read from memory, so that kernels differing only in them share one compiled code.

A kernel's key is its structure, literal values included (`glue.backend.kernel_key`): kernels that
are the same but for the numbers they add or multiply by compile once each. A chain of 10,000
`tanh(x * 1.0001 + 0.01 * (i % 7))` is 40 kernels, 23 of them distinct only by where the
period of its constants falls, and LLVM's time is per distinct kernel.

`lift` takes such a kernel's float literals out: each operand of an add, subtract, multiply, max
or min that is a literal becomes a load of an entry of a float64 literal buffer (one more input,
last), converted to its dtype; the kernel keeps its structure and the values go to the launch.
The load is loop-invariant, so LLVM reads it once per call of the kernel, before its loops. Only
pointwise kernels with MIN_LITERALS distinct such values or more are lifted (of the small
training step's 129 kernels, one: an AdamW update, which runs as fast), and not the values whose
being known makes code better: 1, -1 and other powers of two (a multiplication by 2 becomes an
add) or non-finite ones; literals under other operations (a power's exponent, a comparison, a
division, a select) stay in the code. Zero is lifted: x + 0.0 and x * 0.0 are not x and 0.0 in
IEEE arithmetic (-0.0, infinities, NaN), so nothing folds them, and where a chain's literals
include a zero now and then, leaving it would make kernels differ by where it falls.
"""
from __future__ import annotations

import math
from dataclasses import replace

from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Buffer, Const, Expr, Index, Kernel, Load, Op

LIFTED_OPS = frozenset({"add", "sub", "mul", "max", "min"})
MIN_LITERALS = 4  # distinct liftable values from which a kernel's literals are lifted
LITERALS_VALUE_ID = -1  # the literal buffer's `Buffer.value_id` (it holds no Graph value)


def _liftable(e: Expr) -> bool:
    if not (isinstance(e, Const) and e.dtype.is_float):
        return False
    value = float(e.value)
    return math.isfinite(value) and math.frexp(abs(value))[0] != 0.5  # not a power of two (1 included)


def _slot_key(c: Const) -> tuple[float, float, dt.DType]:
    """Literals share a slot where they are the same number of one dtype: 0.0 and -0.0 do not
    (x + -0.0 keeps a -0.0 that x + 0.0 makes 0.0), though Python finds them equal."""
    value = float(c.value)
    return value, math.copysign(1.0, value), c.dtype


def _lifted_args(e: Expr) -> list[Expr]:
    """The operands of `e` that `lift` would read from memory."""
    return [a for a in e.args if _liftable(a)] if isinstance(e, Op) and e.primitive in LIFTED_OPS else []


def _ops_postorder(kernel: Kernel) -> list[Op]:
    """The kernel's Op nodes, each once, operands before users (iterative: chains are deep).
    Loads' indices are not entered: a literal there stays."""
    order, seen = [], set()
    stack: list[tuple[Expr, bool]] = [(r, False) for r in reversed(kernel.roots)]
    while stack:
        e, expanded = stack.pop()
        if not isinstance(e, Op) or (id(e) in seen and not expanded):
            continue
        if expanded:
            order.append(e)
            continue
        seen.add(id(e))
        stack.append((e, True))
        stack.extend((a, False) for a in reversed(e.args) if isinstance(a, Op) and id(a) not in seen)
    return order


def lift(kernel: Kernel) -> tuple[Kernel, tuple[float, ...]] | None:
    """The kernel with its liftable float literals read from a literal buffer (its last input)
    and the buffer's values, slot by slot in the order a walk of the kernel meets them; None
    where it has fewer than MIN_LITERALS distinct ones."""
    if kernel.kind != "pointwise":
        return None
    ops = _ops_postorder(kernel)
    slots: dict[tuple[float, float, dt.DType], int] = {}
    for op in ops:
        for a in _lifted_args(op):
            slots.setdefault(_slot_key(a), len(slots))
    if len(slots) < MIN_LITERALS:
        return None
    at = len(kernel.inputs)
    rebuilt: dict[int, Expr] = {}

    def read(c: Const) -> Expr:
        load = Load(at, (Index(const=slots[_slot_key(c)]),), dt.float64)
        return load if c.dtype == dt.float64 else \
            Op("convert_element_type", (load,), c.dtype, (("new_dtype", c.dtype),))

    for op in ops:
        lifted = {id(a) for a in _lifted_args(op)}
        args = tuple(read(a) if id(a) in lifted else rebuilt.get(id(a), a) for a in op.args)
        changed = any(new is not old for new, old in zip(args, op.args))
        rebuilt[id(op)] = replace(op, args=args) if changed else op

    def new(e: Expr) -> Expr:
        return rebuilt.get(id(e), e)

    literals = Buffer(LITERALS_VALUE_ID, TensorType((len(slots),), dt.float64))
    return (replace(kernel, inputs=kernel.inputs + (literals,),
                    reductions=tuple(replace(r, value=new(r.value)) for r in kernel.reductions),
                    stores=tuple(replace(s, value=new(s.value)) for s in kernel.stores)),
            tuple(value for value, _, _ in slots))


__all__ = ["LITERALS_VALUE_ID", "MIN_LITERALS", "lift"]
