"""glue: a JAX/XLA-style tensor compiler in pure Python.

    import glue, glue.numpy as gnp
    f = glue.jit(lambda x, w: gnp.tanh(x @ w).sum(axis=-1))
    print(glue.make_ir(f)(x, w))
"""
from glue.frontend.array import Array
from glue.backends import available_backends, default_backend_name
from glue.errors import (BackendError, ConcretizationError, GlueError, GlueTypeError, ParseError,
                         VerifyError)
from glue.frontend import jit, make_ir
from glue.frontend.pytree import tree_flatten, tree_map, tree_unflatten

__all__ = ["Array", "BackendError", "ConcretizationError", "GlueError", "GlueTypeError", "ParseError",
           "VerifyError", "available_backends", "default_backend_name", "jit", "make_ir",
           "tree_flatten", "tree_map", "tree_unflatten"]
__version__ = "0.1.0"
