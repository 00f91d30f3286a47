"""glue: a JAX/XLA-style tensor compiler in pure Python.

    import glue, glue.numpy as gnp
    f = glue.jit(lambda x, w: gnp.tanh(x @ w).sum(axis=-1))
    print(glue.make_ir(f)(x, w))
"""
from typing import Any as _Any

import glue.array_methods  # noqa: F401  (installs the operators and methods of Array and Tracer)
from glue.backend import available_backends, default_backend_name, runnable_backend
from glue.backend_cuda.runtime.context import devices
from glue.errors import (BackendError, ConcretizationError, GlueError, GlueTypeError, ParseError,
                         VerifyError)
from glue.frontend import jit, make_ir
from glue.frontend.array import Array
from glue.frontend.pytree import tree_flatten, tree_map, tree_unflatten
from glue.frontend.shapes import ShapeDtypeStruct, block_until_ready, eval_shape
from glue.frontend.transforms import (checkpoint, checkpoint_policies, custom_jvp, custom_vjp, grad, hessian,
                                      jacfwd, jacrev, jvp, remat, stop_gradient, value_and_grad, vjp, vmap)
from glue import debug, lax
from glue.lax import Precision, default_matmul_precision
from glue.profiler import profile
from glue.settings import config


def device_put(value: _Any, backend: str | None = None) -> Array:
    """`value` as a `glue.Array` in the memory `backend` (default: the default backend) computes
    in: GPU memory for cuda, host memory otherwise. Inputs that many calls use are worth putting
    there once, as with `jax.device_put`: a NumPy argument is uploaded again at every call. An
    Array already there is returned as it is; anything else is copied in."""
    target = runnable_backend(backend, "glue.device_put")
    if isinstance(value, Array):
        if target.holds(value.buffer):
            return value
        value = value.buffer
    return Array(target.device_put(value))


__all__ = ["Array", "BackendError", "ConcretizationError", "GlueError", "GlueTypeError", "ParseError",
           "Precision", "VerifyError", "available_backends", "config", "default_matmul_precision", "default_backend_name", "device_put", "devices",
           "jit", "make_ir", "profile", "tree_flatten", "tree_map", "tree_unflatten",
           "grad", "jvp", "stop_gradient", "value_and_grad", "vjp", "vmap",
           "ShapeDtypeStruct", "block_until_ready", "checkpoint", "checkpoint_policies", "custom_jvp", "custom_vjp",
           "debug", "eval_shape", "hessian", "jacfwd", "jacrev", "lax", "remat"]
__version__ = "0.1.0"
