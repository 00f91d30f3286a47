"""Constant folding through the reference implementations, so folded values are exactly what
the program would have computed.

A Graph holds only scalar literals, so a folded value stays in the graph only when it is a
scalar (a literal) or a splat (every element the same bits: a broadcast literal). Other
constants (an iota, a small constant input) are not materialised; their values are still
known, so what is computed from them can fold further (a sum of an iota is a scalar).
Elementwise operations on splats fold at any size, by evaluating them once on the scalars;
everything else folds only up to FOLD_LIMIT elements.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.errors import GlueError
from glue.ir import PRIMITIVES, Eqn, Graph, Literal, TensorType, Var, params_tuple
from glue.ir.core import Atom
from glue.reference import evaluate_eqn
from glue.scheduler.passes.rewrite import Replacement, Sweep, fill, literal, splat, sweep

FOLD_LIMIT = 1 << 12  # elements; bigger constants cost compile time and are rarely worth it


def _evaluate(eqn: Eqn, values: Sequence[np.ndarray]) -> np.ndarray | None:
    """The equation's output as the reference interpreter stores it, or None if it fails."""
    with np.errstate(all="ignore"):
        try:
            out = evaluate_eqn(eqn.primitive, values, eqn.param_dict)
        except (ArithmeticError, ValueError, IndexError, TypeError):
            return None
        return np.asarray(out).astype(eqn.outvars[0].type.dtype.numpy, copy=False)


def _read(lit: Literal) -> np.ndarray:
    return np.asarray(lit.value, dtype=lit.type.dtype.numpy)


def _splat_value(array: np.ndarray) -> Any:
    """The element of `array` if all its elements have the same bits (0 when it is empty)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.size == 0:
        return 0
    raw = flat.view(np.uint8).reshape(flat.size, -1)
    return flat[0] if (raw == raw[0]).all() else None


def _concrete(value: Any, type_: TensorType) -> np.ndarray | None:
    """A constant input's value as the reference reads it; None when it is unknown (a tracer
    of an enclosing trace) or too large to fold."""
    if type_.size > FOLD_LIMIT:
        return None
    try:
        array = np.asarray(value)
    except GlueError:
        return None
    return array.astype(type_.dtype.numpy) if array.shape == type_.shape else None


def _literal_inputs(graph: Graph, known: dict[int, np.ndarray]) -> tuple[dict[int, Atom], list[Eqn]]:
    """Splat constant inputs as literals (scalars) or broadcast literals, for the ones used."""
    if not known:  # no constant's value is known (the scheduler's passes): nothing to splat
        return {}, []
    used = {a.id for e in graph.eqns for a in e.inputs if isinstance(a, Var)}
    used.update(a.id for a in graph.outvars if isinstance(a, Var))
    subst: dict[int, Atom] = {}
    prologue: list[Eqn] = []
    for var in graph.constvars:
        value = _splat_value(known[var.id]) if var.id in known and var.id in used else None
        if value is None:
            continue
        lit = literal(value, var.type.dtype)
        if var.type.ndim == 0:
            subst[var.id] = lit
        else:
            new = Var(var.type)
            prologue.append(Eqn("broadcast_in_dim", (lit,),
                                params_tuple({"shape": var.type.shape, "dims": ()}), (new,)))
            subst[var.id] = new
    return subst, prologue


def fold(graph: Graph, consts: Sequence[Any] | None = None) -> Graph:
    """`graph` with computations on constants replaced by their (scalar or splat) results;
    `consts` are the constvars' values, when known."""
    known: dict[int, np.ndarray] = {}
    for var, value in zip(graph.constvars, consts or ()):
        array = _concrete(value, var.type)
        if array is not None:
            known[var.id] = array

    def value_of(atom: Atom, lit: Literal | None) -> np.ndarray:
        """The value of `atom`, known: `lit` is its splat, if it is one."""
        if lit is not None:  # a literal, or a broadcast one: the view the reference makes
            return np.broadcast_to(_read(lit), atom.type.shape)
        return known[atom.id]

    def rule(eqn: Eqn, ctx: Sweep) -> Replacement:
        prim = PRIMITIVES[eqn.primitive]
        if len(eqn.outvars) > 1 or prim.opaque:
            return None
        out = eqn.outvars[0]
        if eqn.primitive == "broadcast_in_dim" and isinstance(eqn.inputs[0], Literal):
            return None  # already the cheapest form of a splat
        if out.type.size == 0:
            return fill(0, eqn)
        if prim.kind == "elementwise" and all(splat(a, ctx) is not None for a in eqn.inputs):
            result = _evaluate(eqn, [_read(splat(a, ctx)) for a in eqn.inputs])
            return None if result is None else fill(result[()], eqn)
        if out.type.size > FOLD_LIMIT or any(a.type.size > FOLD_LIMIT for a in eqn.inputs):
            return None
        splats = [splat(a, ctx) for a in eqn.inputs]
        if any(lit is None and a.id not in known for a, lit in zip(eqn.inputs, splats)):
            return None
        result = _evaluate(eqn, [value_of(a, lit) for a, lit in zip(eqn.inputs, splats)])
        if result is None:
            return None
        known[out.id] = result
        value = _splat_value(result)
        return None if value is None else fill(value, eqn)

    subst, prologue = _literal_inputs(graph, known)
    return sweep(graph, rule, subst, prologue)
