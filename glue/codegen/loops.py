"""Counted loops in LLVM IR, in the shape LLVM's loop passes expect.

`loop` emits `for i in [lo, hi)` as a guarded, rotated loop (preheader, one header with the
induction variable and the loop-carried values as phis, a latch that tests the next index),
which LLVM recognises, vectorises and unrolls. Constant bounds need no guard.
"""
from __future__ import annotations

from typing import Callable, Sequence

from llvmlite import ir

from glue.codegen.types import I1, I64

Body = Callable[[ir.IRBuilder, ir.Value, list[ir.Value]], Sequence[ir.Value]]


def _const(v: ir.Value) -> int | None:
    return v.constant if isinstance(v, ir.Constant) and isinstance(v.constant, int) else None


def loop(b: ir.IRBuilder, lo: ir.Value | int, hi: ir.Value | int, body: Body,
         carried: Sequence[ir.Value] = (), name: str = "i", vectorize: bool = True,
         interleave: int = 0, unroll: int | None = None, vector_width: int = 0) -> list[ir.Value]:
    """Run `body(b, i, values)` for i in [lo, hi), threading `carried` values through it (the
    body returns their next values); the builder ends after the loop, and the result is the
    carried values after the last iteration (the initial ones when the loop runs no times).
    `vectorize=False` tells LLVM not to vectorise this loop (an outer loop whose inner loops
    are the ones to vectorise); `interleave` asks it to keep that many vector iterations in
    flight (long dependency chains, as in math functions, leave the units idle otherwise);
    `unroll` caps how many copies of the body LLVM's unroller may make (1: none), where all
    copies of a body of wide loads would be scheduled ahead and outgrow a GPU thread's registers;
    `vector_width` names the vectoriser's width (lanes) instead of letting it cost each one."""
    lo = ir.Constant(I64, lo) if isinstance(lo, int) else lo
    hi = ir.Constant(I64, hi) if isinstance(hi, int) else hi
    first, last = _const(lo), _const(hi)
    static = first is not None and last is not None
    if static and first >= last:
        return list(carried)
    fn = b.function
    pre = b.block
    head = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    if static:
        b.branch(head)
    else:
        b.cbranch(b.icmp_signed("<", lo, hi), head, done)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    phis = []
    for v in carried:
        phi = b.phi(v.type)
        phi.add_incoming(v, pre)
        phis.append(phi)
    new = list(body(b, i, phis))
    following = b.add(i, ir.Constant(I64, 1), flags=("nuw", "nsw"))
    latch = b.block
    i.add_incoming(following, latch)
    for phi, v in zip(phis, new):
        phi.add_incoming(v, latch)
    branch = b.cbranch(b.icmp_signed("<", following, hi), head, done)
    hints = [("llvm.loop.vectorize.enable", ir.Constant(I1, 0))] if not vectorize else \
        [("llvm.loop.interleave.count", ir.Constant(ir.IntType(32), interleave))] if interleave else []
    if vectorize and vector_width:
        hints.append(("llvm.loop.vectorize.width", ir.Constant(ir.IntType(32), vector_width)))
    if unroll is not None:
        hints.append(("llvm.loop.unroll.count", ir.Constant(ir.IntType(32), unroll)))
    if hints:
        branch.set_metadata("llvm.loop", _loop_id(b.module, hints))
    b.position_at_end(done)
    if static:
        return new
    out = []
    for v, start in zip(new, carried):
        phi = b.phi(v.type)
        phi.add_incoming(start, pre)
        phi.add_incoming(v, latch)
        out.append(phi)
    return out


def _loop_id(module: ir.Module, hints: Sequence[tuple[str, ir.Constant]]) -> ir.MDValue:
    """A fresh loop ID carrying `hints` (loop IDs refer to themselves and must be unique)."""
    nodes = [module.add_metadata([ir.MetaDataString(module, name), value]) for name, value in hints]
    unique = module.add_metadata([ir.MetaDataString(module, "glue.loop"), ir.Constant(I64, len(module.metadata))])
    loop_id = module.add_metadata(nodes + [unique])
    loop_id.operands = (loop_id,) + loop_id.operands
    return loop_id


NestBody = Callable[[ir.IRBuilder, list[ir.Value], list[ir.Value]], Sequence[ir.Value]]


def nest(b: ir.IRBuilder, extents: Sequence[int], body: NestBody, carried: Sequence[ir.Value] = (),
         name: str = "r", interleave: int = 0) -> list[ir.Value]:
    """Nested loops over [0, n) for each extent, outermost first; `body(b, indices, values)`;
    `interleave` applies to the innermost loop."""
    def level(k: int, outer: list[ir.Value], values: list[ir.Value]) -> list[ir.Value]:
        if k == len(extents):
            return list(body(b, outer, values))
        return loop(b, 0, extents[k], lambda b, i, vs: level(k + 1, outer + [i], vs), values, f"{name}{k}",
                    interleave=interleave if k == len(extents) - 1 else 0)
    return level(0, [], list(carried))


def unflatten(b: ir.IRBuilder, flat: ir.Value, extents: Sequence[int | ir.Value]) -> list[ir.Value]:
    """Row-major coordinates of a flat index over `extents`: constants, or values the code
    reads when it runs (a division by a constant is a few multiplications, by a value a
    division instruction). The first extent is never read: the outermost coordinate is what
    the divisions leave."""
    coords: list[ir.Value] = []
    rest = flat
    for k, n in reversed(list(enumerate(extents))):
        if k == 0:
            coords.append(rest)
        elif isinstance(n, int) and n == 1:
            coords.append(ir.Constant(I64, 0))
        else:
            divisor = ir.Constant(I64, n) if isinstance(n, int) else n
            coords.append(b.urem(rest, divisor))
            rest = b.udiv(rest, divisor)
    return coords[::-1]
