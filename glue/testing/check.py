"""Differential checks: run a function (or a Graph) on glue's backends and compare every output
with the NumPy reference interpreter, within the tolerance of the dtypes involved.

    glue.testing.check(lambda x, w: gnp.tanh(x @ w), x, w)     # raises AssertionError on a mismatch
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from glue.backend import available_backends, get_backend
from glue.frontend.jit import Jitted, jit
from glue.frontend.pytree import leaf_paths, tree_flatten
from glue.ir import Graph, Var
from glue.ir.dtypes import DType
from glue.reference import run_graph
from glue.reference.compare import mismatch, tolerance_dtypes


def _default_backends(backends: Sequence[str] | None) -> list[str]:
    if backends is not None:
        return list(backends)
    return [b for b in available_backends() if b != "reference"] or ["reference"]


def _compare(label: str, paths: Sequence[str], actual: Sequence[Any], expected: Sequence[np.ndarray],
             dtypes: Sequence[DType], scale: float, context: str = "") -> None:
    if len(actual) != len(expected):
        raise AssertionError(f"{label}: {len(actual)} outputs, the reference gives {len(expected)}")
    for path, got, want, dtype in zip(paths, actual, expected, dtypes):
        got = np.asarray(got)
        problem = mismatch(got, want, dtype, scale)
        if problem is None:
            continue
        detail = ""
        if got.shape == want.shape and got.size:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            rel = diff / np.maximum(np.abs(want.astype(np.float64)), np.finfo(np.float64).tiny)
            detail = f"; max abs error {np.nanmax(diff):.3g}, max rel error {np.nanmax(rel):.3g}"
        raise AssertionError(f"{label}: output {path} ({got.dtype}{list(got.shape)}, compared at "
                             f"{dtype} tolerance) disagrees with the reference: {problem}{detail}{context}")


def check(f: Callable[..., Any], *args: Any, backends: Sequence[str] | None = None,
          float64_reference: bool = True, static_argnums: Sequence[int] | int = (),
          static_argnames: Sequence[str] | str = (), scale: float = 1.0, **kwargs: Any) -> None:
    """Jit `f` on each backend in `backends` (default: every available one but the reference,
    or the reference alone when it is the only one), call it on `args` / `kwargs` and compare
    every output with the reference interpreter run in float64 (or in the program's own dtypes
    with `float64_reference=False`); tolerances are `glue.reference.compare`'s, times `scale`.
    Raises AssertionError naming the backend, the output, the errors and the first mismatch."""
    if isinstance(f, Jitted):  # check the function it wraps, with its static arguments
        static_argnums = static_argnums or tuple(f.spec.static_nums)
        static_argnames = static_argnames or tuple(f.spec.static_names)
    fn = f.fn if isinstance(f, Jitted) else f
    name = getattr(fn, "__name__", "fn")
    traced = jit(fn, backend="reference", static_argnums=static_argnums, static_argnames=static_argnames)
    closed, out_tree, _, leaves = traced.trace(*args, **kwargs)
    graph = closed.graph
    inputs = [np.asarray(x) for x in tuple(closed.consts) + tuple(leaves)]
    expected = run_graph(graph, inputs, float64=float64_reference)
    paths = leaf_paths(out_tree, "out")
    for backend in _default_backends(backends):
        compiled = jit(fn, backend=backend, static_argnums=static_argnums, static_argnames=static_argnames)
        try:
            outs, _ = tree_flatten(compiled(*args, **kwargs))
        except Exception as err:
            err.add_note(f"glue.testing.check: while running {name} on the {backend} backend")
            raise
        dtypes = tolerance_dtypes(graph, tf32=get_backend(backend).rounds_to_tf32)
        _compare(f"{name} on the {backend} backend", paths, outs, expected, dtypes, scale)


def check_graph(graph: Graph, inputs: Sequence[Any], backends: Sequence[str] | None = None,
                float64_reference: bool = True, scale: float = 1.0) -> None:
    """Compile `graph` on each backend (default as in `check`), run it on `inputs` (constvars'
    values, then invars') and compare every output with the reference interpreter."""
    inputs = [np.asarray(x) for x in inputs]
    expected = run_graph(graph, inputs, float64=float64_reference)
    paths = [str(i) for i in range(len(graph.outvars))]
    for backend in _default_backends(backends):
        try:
            outs = get_backend(backend).lower(graph).compile()(*inputs)
        except Exception as err:
            err.add_note(f"glue.testing.check_graph: while running on the {backend} backend:\n{graph}")
            raise
        dtypes = tolerance_dtypes(graph, tf32=get_backend(backend).rounds_to_tf32)
        _compare(f"graph on the {backend} backend", paths, outs, expected, dtypes, scale, f"\n{graph}")
