"""Tracing Python functions into Graphs: Tracers, pytrees, `jit` with its signature cache."""
from glue.frontend.jit import Compiled, Jitted, Lowered, jit, make_ir
from glue.frontend.tracing import Tracer, bind

__all__ = ["Compiled", "Jitted", "Lowered", "Tracer", "bind", "jit", "make_ir"]
