"""glue: a JAX/XLA-style tensor compiler in pure Python.

    import glue, glue.numpy as gnp
    f = glue.jit(lambda x, w: gnp.tanh(x @ w).sum(axis=-1))
    print(glue.make_ir(f)(x, w))
"""
from glue.frontend.array import Array
from glue.backends import available_backends, default_backend_name, device_put
from glue.backend_cuda.runtime.context import devices
from glue.errors import (BackendError, ConcretizationError, GlueError, GlueTypeError, ParseError,
                         VerifyError)
from glue.frontend import jit, make_ir
from glue.frontend.pytree import tree_flatten, tree_map, tree_unflatten
from glue.profiler import profile
from glue.frontend.transforms import grad, jvp, stop_gradient, value_and_grad, vjp, vmap

__all__ = ["Array", "BackendError", "ConcretizationError", "GlueError", "GlueTypeError", "ParseError",
           "VerifyError", "available_backends", "default_backend_name", "device_put", "devices", "jit", "make_ir", "profile",
           "tree_flatten", "tree_map", "tree_unflatten",
           "grad", "jvp", "stop_gradient", "value_and_grad", "vjp", "vmap"]
__version__ = "0.1.0"

# The JAX-style surface: glue.numpy (which installs the array operators and methods), glue.nn,
# glue.scipy.special, glue.tree_util / glue.tree, DLPack exchange.
import glue.numpy  # noqa: E402,F401
from glue import dlpack, nn, scipy, tree, tree_util  # noqa: E402,F401
from glue.dlpack import from_dlpack  # noqa: E402,F401

__all__ += ["dlpack", "from_dlpack", "nn", "scipy", "tree", "tree_util"]
