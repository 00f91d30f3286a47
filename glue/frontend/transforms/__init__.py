"""Transforms of traced programs: differentiation (grad, value_and_grad, vjp, jvp, the
Jacobians), batching (vmap), stop_gradient, custom derivatives and checkpointing, and the rules
of control flow and calls. Each works on Graphs and composes with jit and with itself."""
from glue.frontend.transforms.api import (TransformError, grad, hessian, jacfwd, jacrev, jvp, value_and_grad,
                                          vjp, vmap)
from glue.frontend.transforms import attention, calls, control  # noqa: F401  (their rules fill the tables)
from glue.frontend.transforms.custom import checkpoint, checkpoint_policies, custom_jvp, custom_vjp, remat
from glue.frontend.transforms.stop_gradient import stop_gradient

__all__ = ["TransformError", "checkpoint", "checkpoint_policies", "custom_jvp", "custom_vjp", "grad", "hessian",
           "jacfwd", "jacrev", "jvp", "remat", "stop_gradient", "value_and_grad", "vjp", "vmap"]
