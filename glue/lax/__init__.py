"""`glue.lax`: JAX's lax, the primitives glue.numpy does not spell the NumPy way: structured
control flow (`control.py`), elementwise, reduction, shape and contraction operations on exact
types (`ops.py`), data-dependent slicing, top_k and cumulative reductions (`slicing.py`) and
special functions (`special.py`)."""
from glue.lax.control import cond, fori_loop, map, scan, switch, while_loop
from glue.lax.ops import *  # noqa: F403  (every name of ops.__all__)
from glue.lax.ops import __all__ as _ops
from glue.lax.slicing import *  # noqa: F403
from glue.lax.slicing import __all__ as _slicing
from glue.lax.special import erf_inv

__all__ = sorted(["cond", "erf_inv", "fori_loop", "map", "scan", "switch", "while_loop", *_ops, *_slicing])
