"""`glue.debug.print`: printing values from inside jitted (and transformed) code, as
jax.debug.print does.

A print is an equation of its own (debug_print) that the backends run on the host once its
operands are ready; the effect token orders it after the program's earlier prints and keeps it
alive although nothing reads its result. Eagerly it prints at once.
"""
from __future__ import annotations

from typing import Any

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.pytree import tree_flatten
from glue.frontend.tracing import bind
from glue.ir.primitives import TOKEN


def print(fmt: str, *args: Any, ordered: bool = False, **kwargs: Any) -> None:  # noqa: A001 (JAX's name)
    """Print `fmt.format(*args, **kwargs)` with the values the arguments have when the program
    runs (every iteration of a loop, under jit, grad and vmap: once per example). `ordered` is
    accepted for JAX's signature: glue keeps every program's prints in program order."""
    if not isinstance(fmt, str):
        raise GlueTypeError(f"debug.print: the format must be a string, not {type(fmt).__name__} "
                            f"{describe_location(user_frame_location())}")
    values = list(args) + list(kwargs.values())
    for v in values:
        leaves, tree = tree_flatten(v)
        if tree.kind != "leaf":
            raise GlueTypeError(f"debug.print: each argument must be an array or a scalar, not a "
                                f"{tree}; pass its leaves {describe_location(user_frame_location())}")
    bind("debug_print", TOKEN.dtype.numpy.type(0), *values, fmt=fmt, names=tuple(kwargs))


__all__ = ["print"]
