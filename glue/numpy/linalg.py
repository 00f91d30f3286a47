"""`gnp.linalg`: norms, and the contractions NumPy's linalg shares with the top level
(`outer`, `tensordot`).

Norms that need a decomposition (the matrix 2-norm, nuclear norm) raise a GlueError: glue has
no SVD.
"""
from __future__ import annotations

import builtins
from typing import Any, Sequence

from glue.frontend.tracing import bind, type_of
from glue.ir import dtypes as dt
from glue.numpy._core import (_axes, _dtype_of, _fail, _promote, _shape, abs, astype, max, min,
                              multiply, not_equal, power, ravel, reshape, sqrt, sum)


def _floating(x: Any) -> Any:
    x = _promote([x])[0]
    return x if _dtype_of(x).is_float else astype(x, dt.DEFAULT_FLOAT)


def _vector_norm(x: Any, ord: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    if ord is None or ord == 2:
        return sqrt(sum(multiply(x, x), axes, keepdims=keepdims))
    if ord == float("inf"):
        return max(abs(x), axes, keepdims=keepdims)
    if ord == float("-inf"):
        return min(abs(x), axes, keepdims=keepdims)
    if ord == 0:
        return sum(astype(not_equal(x, 0), _dtype_of(x)), axes, keepdims=keepdims)
    if ord == 1:
        return sum(abs(x), axes, keepdims=keepdims)
    if isinstance(ord, str):
        raise _fail("linalg.norm", f"ord={ord!r} is a matrix norm; a vector has none", x)
    return power(sum(power(abs(x), ord), axes, keepdims=keepdims), 1.0 / ord)


def _matrix_norm(x: Any, ord: Any, axes: tuple[int, int], keepdims: bool) -> Any:
    rows, cols = axes
    if ord in (None, "fro"):
        return sqrt(sum(multiply(x, x), axes, keepdims=keepdims))
    if ord in (1, -1, float("inf"), float("-inf")):
        # 1 and -1: the largest / smallest column sum; inf and -inf: the same over rows.
        summed, kept = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = sum(abs(x), summed, keepdims=True)
        pick = max if ord in (1, float("inf")) else min
        out = pick(sums, kept, keepdims=True)
        if keepdims:
            return out
        return reshape(out, tuple(n for i, n in enumerate(_shape(out)) if i not in axes))
    raise _fail("linalg.norm", f"the matrix norm ord={ord!r} needs a decomposition glue does not "
                               "have; supported: None, 'fro', 1, -1, inf, -inf", x)


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """NumPy's norm: of the flattened array (ord None), a vector axis, or a pair of matrix axes."""
    x = _floating(x)
    if axis is None:
        if ord is not None and type_of(x).ndim == 2:
            return _matrix_norm(x, ord, (0, 1), keepdims)
        out = _vector_norm(ravel(x), ord, (0,), False)
        return reshape(out, (1,) * type_of(x).ndim) if keepdims else out
    axes = _axes("linalg.norm", x, axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axes, keepdims)
    raise _fail("linalg.norm", f"axis must name one or two axes, not {axis}", x)


def outer(a: Any, b: Any) -> Any:
    """out[i, j] = a[i] * b[j] of the flattened operands."""
    a, b = _promote([a, b])
    a, b = ravel(a), ravel(b)
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """Sum over the last `axes` axes of a and the first of b (an int), or over the given axis
    lists of each (a pair); a's free axes, then b's."""
    a, b = _promote([a, b])
    ra, rb = type_of(a).ndim, type_of(b).ndim
    if isinstance(axes, int):
        if not 0 <= axes <= builtins.min(ra, rb):
            raise _fail("tensordot", f"axes={axes} is more than the operands' ranks", a, b)
        pair: tuple[Sequence[int], Sequence[int]] = (range(ra - axes, ra), range(axes))
    elif isinstance(axes, (tuple, list)) and len(axes) == 2:
        pair = tuple([n] if isinstance(n, int) else list(n) for n in axes)  # type: ignore[assignment]
    else:
        raise _fail("tensordot", f"axes must be an int or a pair of axis lists, not {axes!r}", a, b)
    left, right = _axes("tensordot", a, list(pair[0])), _axes("tensordot", b, list(pair[1]))
    if len(left) != len(right):
        raise _fail("tensordot", f"axes {axes} name {len(left)} and {len(right)} axes", a, b)
    for i, j in zip(left, right):
        if _shape(a)[i] != _shape(b)[j]:
            raise _fail("tensordot", f"axis {i} of a (size {_shape(a)[i]}) does not match axis {j} "
                                     f"of b (size {_shape(b)[j]})", a, b)
    return bind("dot_general", a, b, dimension_numbers=((left, right), ((), ())))
