"""`import glue.numpy as gnp`: the NumPy-style surface (JAX's `jax.numpy`), in parts:

- `_core`: promotion, elementwise math, creation, shapes and axes, reductions, contractions,
  indexing (its docstring states the conventions every part follows);
- `_dtypes`: dtype names, `finfo` / `iinfo`, `result_type`, `issubdtype`;
- `_arrays`: building and reshaping arrays (stacks, tiles, repeats, rolls, pads, grids, splits);
- `_elementwise`: closeness tests, `nan_to_num`;
- `_scans`: cumulative sums and products, differences;
- `_sorting`: sort, argsort, searchsorted;
- `linalg`: norms;
- `_methods`: the Python operators and methods of arrays, as JAX defines them.
"""
from glue.numpy._core import *  # noqa: F401,F403
from glue.numpy._core import _axis, _fail  # noqa: F401  (glue.nn builds on them)
from glue.numpy._dtypes import *  # noqa: F401,F403
from glue.numpy._arrays import *  # noqa: F401,F403
from glue.numpy._elementwise import *  # noqa: F401,F403
from glue.numpy._scans import *  # noqa: F401,F403
from glue.numpy._sorting import *  # noqa: F401,F403
from glue.numpy import linalg  # noqa: F401
from glue.numpy.linalg import outer, tensordot  # noqa: F401
from glue.frontend.array import Array as _Array
from glue.frontend.tracing import Tracer as _Tracer
from glue.numpy import _methods

_methods.install(_Array, _Tracer)
