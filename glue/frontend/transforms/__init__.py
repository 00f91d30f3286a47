"""Transforms of traced programs: differentiation (grad, value_and_grad, vjp, jvp),
batching (vmap) and stop_gradient. Each works on Graphs and composes with jit and with itself."""
from glue.frontend.transforms.api import TransformError, grad, jvp, value_and_grad, vjp, vmap
from glue.frontend.transforms.stop_gradient import stop_gradient

__all__ = ["TransformError", "grad", "jvp", "stop_gradient", "value_and_grad", "vjp", "vmap"]
