"""Runs a Graph with NumPy, equation by equation; optionally with every float in float64."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from glue.errors import GlueError, describe_location
from glue.ir import PRIMITIVES, Graph, Literal, primitive
from glue.ir import dtypes as dt
from glue.reference.impls import IMPLS


def evaluate_eqn(primitive: str, values: Sequence[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    """One primitive on NumPy values."""
    return IMPLS[primitive](*values, **params)


def _widen(dtype: dt.DType, float64: bool) -> np.dtype:
    return np.dtype(np.float64) if float64 and dtype.is_float else dtype.numpy


def _widen_params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: (dt.float64 if isinstance(v, dt.DType) and v.is_float else v) for k, v in params.items()}


def run_graph(graph: Graph, args: Sequence[Any], float64: bool = False) -> list[np.ndarray]:
    """The outputs of `graph` on `args` (its constvars' values first, then its invars').

    With `float64`, every floating-point value is computed in float64: the tolerance-free
    ground truth that lower-precision backends are compared against.
    """
    params_in = graph.constvars + graph.invars
    if len(args) != len(params_in):
        raise GlueError(f"run_graph: the graph takes {len(graph.constvars)} constants and "
                        f"{len(graph.invars)} arguments ({len(params_in)} values), but got {len(args)}")
    env: dict[int, np.ndarray] = {}
    for var, value in zip(params_in, args):
        env[var.id] = np.asarray(value).astype(_widen(var.type.dtype, float64))

    def read(atom) -> np.ndarray:
        if isinstance(atom, Literal):
            return np.asarray(atom.value, dtype=_widen(atom.type.dtype, float64))
        return env[atom.id]

    for eqn in graph.eqns:
        params, inputs = eqn.param_dict, [read(a) for a in eqn.inputs]
        if float64 and primitive(eqn.primitive).bitwise:  # bits exist only at the declared widths
            inputs = [x.astype(a.type.dtype.numpy) for x, a in zip(inputs, eqn.inputs)]
        elif float64:
            params = _widen_params(params)
        try:
            out = evaluate_eqn(eqn.primitive, inputs, params)
        except (ValueError, IndexError, TypeError) as err:
            raise GlueError(f"reference evaluation of {eqn.primitive} failed: {err} "
                            f"{describe_location(eqn.source)}") from err
        results = out if PRIMITIVES[eqn.primitive].multiple_results else (out,)
        for var, value in zip(eqn.outvars, results):
            # Values are stored C-contiguous: NumPy's summation order depends on memory layout,
            # and the reference must give the same bits for the same logical program.
            env[var.id] = np.ascontiguousarray(np.asarray(value).astype(_widen(var.type.dtype, float64), copy=False)
                                               ).reshape(var.type.shape)
    # ascontiguousarray alone would turn a 0-d result into shape (1,)
    return [np.ascontiguousarray(read(a)).reshape(a.type.shape) for a in graph.outvars]
