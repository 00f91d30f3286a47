"""Checks that a Graph is well formed: SSA, definitions before uses, and types that agree with
each primitive's rule."""
from __future__ import annotations

from glue.errors import GlueTypeError, VerifyError
from glue.ir.core import Graph, Literal, Var, literal_problem, shape_problem
from glue.ir.primitives import infer_types


def verify(graph: Graph) -> None:
    """Raise VerifyError naming the first problem found in `graph`."""
    defined: set[int] = set()

    def define(v: Var, where: str) -> None:
        if v.id in defined:
            raise VerifyError(f"{v} is defined twice ({where})")
        problem = shape_problem(v.type.shape, v.type.dtype)
        if problem:
            raise VerifyError(f"{v} cannot be an array: {problem} ({where})")
        defined.add(v.id)

    def check_use(atom, where: str) -> None:
        if isinstance(atom, Var) and atom.id not in defined:
            raise VerifyError(f"{atom} is used before it is defined ({where})")
        if isinstance(atom, Literal) and atom.type.ndim:
            raise VerifyError(f"literal {atom} is not a scalar ({where})")
        if isinstance(atom, Literal) and literal_problem(atom.value, atom.type.dtype):
            raise VerifyError(f"literal {atom}: {literal_problem(atom.value, atom.type.dtype)} ({where})")

    for v in graph.constvars + graph.invars:
        define(v, "graph inputs")
    for i, eqn in enumerate(graph.eqns):
        where = f"equation {i}: {eqn.primitive}"
        for atom in eqn.inputs:
            check_use(atom, where)
        try:
            out_types = infer_types(eqn.primitive, tuple(a.type for a in eqn.inputs),
                                    eqn.param_dict, eqn.source)
        except GlueTypeError as err:
            raise VerifyError(f"{where}: {err}") from None
        if tuple(v.type for v in eqn.outvars) != out_types:
            raise VerifyError(f"{where}: declares {[str(v.type) for v in eqn.outvars]}, "
                              f"but the rule gives {' '.join(map(str, out_types))}")
        for key, value in eqn.params:
            for k, body in enumerate(_graphs_in(value)):
                _verify_body(body, f"{where}, param {key}" + (f"[{k}]" if isinstance(value, tuple) else ""))
        for v in eqn.outvars:
            define(v, where)
    for atom in graph.outvars:
        check_use(atom, "graph outputs")


def _graphs_in(value) -> list[Graph]:
    """The graphs a param holds: itself, or those of a tuple (a cond's branches)."""
    if isinstance(value, Graph):
        return [value]
    return [v for v in value if isinstance(v, Graph)] if isinstance(value, tuple) else []


def _verify_body(body: Graph, where: str) -> None:
    """A graph-valued param (a loop body, a branch) is closed: every value it uses is an input."""
    if body.constvars:
        raise VerifyError(f"{where}: a graph param must take its constants as inputs, not constvars")
    try:
        verify(body)
    except VerifyError as err:
        raise VerifyError(f"{where}: {err}") from None
