"""`glue.lax`: JAX's lax, the primitives glue.numpy does not spell the NumPy way: structured
control flow (`control.py`), contractions with their precisions and the elementwise and shape
operations on exact types (`ops.py`)."""
from glue.lax.control import cond, fori_loop, map, scan, switch, while_loop
from glue.lax.ops import Precision, default_matmul_precision, dot_general

__all__ = ["Precision", "cond", "default_matmul_precision", "dot_general", "fori_loop", "map", "scan",
           "switch", "while_loop"]
