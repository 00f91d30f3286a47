"""NumPy meanings of control flow and calls: each runs its bodies with `run_graph`.

scan, while and cond loop and branch in Python; the custom-derivative calls and checkpoint
just run their body (their other graphs only matter to differentiation); debug_print formats
its operands with `str.format` and prints them. A cond's index is clamped into range, as
`switch` clamps it. Bodies compute in float64 when their operands come widened (run_graph's
float64 mode).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.ir import Graph
from glue.reference.impls import IMPLS
from glue.reference.interpreter import run_graph


def _run(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`body` on `args`, in float64 when the arguments were widened to it."""
    wide = any(np.asarray(a).dtype == np.float64 and v.type.dtype.is_float and v.type.dtype.bits < 64
               for a, v in zip(args, body.invars))
    return run_graph(body, args, float64=wide)


@IMPLS.register("scan")
def _scan(*operands, body, length, reverse, num_carry, num_consts):
    carry = list(operands[:num_carry])
    consts = list(operands[num_carry:num_carry + num_consts])
    xs = operands[num_carry + num_consts:]
    n_ys = len(body.outvars) - num_carry
    ys: list[list[np.ndarray]] = [[None] * length for _ in range(n_ys)]
    for t in (reversed(range(length)) if reverse else range(length)):
        outs = _run(body, carry + consts + [x[t] for x in xs])
        carry = outs[:num_carry]
        for k, y in enumerate(outs[num_carry:]):
            ys[k][t] = y
    stacked = [np.stack(y) if length else np.zeros((0,) + a.type.shape, a.type.dtype.numpy)
               for y, a in zip(ys, body.outvars[num_carry:])]
    return tuple(carry) + tuple(stacked)


@IMPLS.register("while")
def _while(*operands, cond, body, num_carry, cond_consts):
    carry = list(operands[:num_carry])
    cond_args = list(operands[num_carry:num_carry + cond_consts])
    body_args = list(operands[num_carry + cond_consts:])
    while bool(_run(cond, carry + cond_args)[0]):
        carry = _run(body, carry + body_args)
    return tuple(carry)


def branch_index(index: Any, n: int) -> int:
    """The branch a cond takes: its index clamped into [0, n)."""
    return int(np.clip(np.asarray(index).item(), 0, n - 1))


@IMPLS.register("cond")
def _cond(*operands, branches):
    return tuple(_run(branches[branch_index(operands[-1], len(branches))], operands[:-1]))


@IMPLS.register("custom_jvp_call", "checkpoint")
def _call(*operands, body, **params):
    return tuple(_run(body, operands))


@IMPLS.register("custom_vjp_call")
def _custom_vjp_call(*operands, body, fwd, bwd, num_consts):
    n_args = len(operands) - sum(num_consts)
    return tuple(_run(body, operands[:n_args + num_consts[0]]))


@IMPLS.register("optimization_barrier")
def _optimization_barrier(*operands):
    return tuple(operands)


def format_print(fmt: str, names: Sequence[str], values: Sequence[np.ndarray]) -> str:
    """The text debug_print prints: `fmt` formatted with the positional values, then the named."""
    positional = len(values) - len(names)
    return fmt.format(*values[:positional], **dict(zip(names, values[positional:])))


@IMPLS.register("debug_print")
def _debug_print(token, *operands, fmt, names):
    print(format_print(fmt, names, [np.asarray(v) for v in operands]), flush=True)
    return (np.zeros((), np.int32),)
