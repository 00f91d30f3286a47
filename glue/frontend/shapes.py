"""`glue.ShapeDtypeStruct`, `glue.eval_shape` and `glue.block_until_ready`, as in JAX.

A ShapeDtypeStruct is a shape and a dtype standing in for an array: `eval_shape` traces a
function on such stand-ins (or on arrays) and says what it would return without computing
anything, and `jit(f).lower(...)` takes them in place of arguments.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from glue.frontend.pytree import PyTreeDef, tree_flatten, tree_unflatten
from glue.frontend.tracing import trace_flat, type_of
from glue.ir import TensorType
from glue.ir import dtypes as dt


class ShapeDtypeStruct:
    """The shape and dtype of an array, without its values."""

    __slots__ = ("shape", "dtype", "aval")

    def __init__(self, shape: Any, dtype: Any):
        self.shape = tuple(int(n) for n in shape)
        glue_dtype = dt.from_numpy(dtype)
        self.dtype = glue_dtype.numpy
        self.aval = TensorType(self.shape, glue_dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self) -> str:
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShapeDtypeStruct) and self.aval == other.aval

    def __hash__(self) -> int:
        return hash(self.aval)


def eval_shape(fun: Callable, *args: Any, **kwargs: Any) -> Any:
    """The ShapeDtypeStructs of what `fun(*args, **kwargs)` returns (a pytree like its output),
    found by tracing it: nothing is computed. Arguments are arrays or ShapeDtypeStructs."""
    leaves, tree = tree_flatten((args, kwargs))
    out_trees: list[PyTreeDef] = []

    def flat(*xs: Any) -> list[Any]:
        call_args, call_kwargs = tree_unflatten(tree, list(xs))
        outs, out_tree = tree_flatten(fun(*call_args, **call_kwargs))
        out_trees.append(out_tree)
        return outs

    closed = trace_flat(flat, [type_of(x) for x in leaves], f"eval_shape({getattr(fun, '__name__', 'fun')})")
    return tree_unflatten(out_trees[0], [ShapeDtypeStruct(t.shape, t.dtype) for t in closed.graph.out_types])


def block_until_ready(tree: Any) -> Any:
    """Wait until every array in `tree` has its values (results on a GPU are queued); `tree`."""
    for leaf in tree_flatten(tree)[0]:
        wait = getattr(leaf, "block_until_ready", None)
        if wait is not None:
            wait()
    return tree
