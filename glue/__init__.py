"""glue: a JAX/XLA-style tensor compiler in pure Python.

    import glue, glue.numpy as gnp
    f = glue.jit(lambda x, w: gnp.tanh(x @ w).sum(axis=-1))
    print(glue.make_ir(f)(x, w))
"""
from typing import Any as _Any

import glue.numpy  # noqa: F401  (installs the operators and methods of Array and Tracer)
from glue import debug, lax, random  # noqa: F401
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


__all__ = ["Array", "BackendError", "ConcretizationError", "GlueError", "GlueTypeError", "ParseError", "Precision",
           "ShapeDtypeStruct", "VerifyError", "available_backends", "block_until_ready", "checkpoint",
           "checkpoint_policies", "config", "custom_jvp", "custom_vjp", "debug", "default_backend_name",
           "default_matmul_precision", "device_put", "devices", "eval_shape", "grad", "hessian", "jacfwd", "jacrev",
           "jit", "jvp", "lax", "make_ir", "profile", "random", "remat", "stop_gradient", "tree_flatten", "tree_map",
           "tree_unflatten", "value_and_grad", "vjp", "vmap"]
__version__ = "0.1.0"

# The JAX-style surface: glue.nn, glue.scipy.special, glue.tree_util / glue.tree, DLPack exchange.
from glue import dlpack, nn, scipy, tree, tree_util  # noqa: E402,F401
from glue.dlpack import from_dlpack  # noqa: E402,F401

__all__ += ["dlpack", "from_dlpack", "nn", "scipy", "tree", "tree_util"]

# Where there is a GPU, cuBLASLt's bindings (nvmath-python: over half a second to import) come
# with glue rather than inside its first compile. Here, not in glue.backend_cuda: compile
# workers import that package to emit kernels (without this file: llvm_jobs.bare_glue_package),
# and paid a second and a half of start-up for it on the H100's host.
from glue.backend_cuda import cublaslt as _cublaslt  # noqa: E402
from glue.backend_cuda.runtime import driver as _driver  # noqa: E402

if _driver.available():
    _cublaslt.available()
