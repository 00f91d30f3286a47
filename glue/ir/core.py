"""The tensor IR's data structures: TensorType, Var, Literal, Eqn and Graph (jaxpr-shaped).

A Graph lists its constant inputs (`constvars`, bound to captured arrays), its arguments
(`invars`), equations in topological order and the output atoms. Vars are compared by
identity; two Graphs are equal when they are the same program up to renaming of variables.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from glue.ir.dtypes import DType


class _kept:
    """A property worked out on first use and kept in the instance's dict, where later reads
    find it first: functools.cached_property without the lock Python 3.11 takes each time
    (what is worked out here is the same in every thread)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class TensorType:
    """A static shape and an element type."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        # Hashed once: types key the jit cache on every call, and every compiler table.
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is TensorType and self._hash == other._hash
                                 and self.dtype is other.dtype and self.shape == other.shape)

    def __reduce__(self):
        # The hash (and the sizes kept below) are this process's: made again on unpickling.
        return TensorType, (self.shape, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # The passes, fusion and memory planning ask every value's size many times.
    @_kept
    def size(self) -> int:
        return math.prod(self.shape)

    @_kept
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


# The largest array glue accepts: 1 TiB. No backend can hold a larger buffer (the largest GPU has
# 141 GB; the cpu backend plans every value of a program into one address space), and below it
# every byte offset a kernel computes (indices times strides, in i64) stays far from overflow.
# A shape past it is a GlueTypeError where it is made, naming the op and the user's line,
# rather than a MemoryError at call time.
MAX_ARRAY_BYTES = 2 ** 40


def shape_problem(shape: Any, dtype: DType) -> str | None:
    """Why `shape` cannot be the shape of an array of `dtype` (not a tuple of non-negative
    ints, or more than MAX_ARRAY_BYTES), or None when it can."""
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return f"a shape is a tuple of ints, not {shape!r}"
    if any(n < 0 for n in shape):
        return f"shape {shape} has a negative dimension"
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_ARRAY_BYTES:
        return (f"shape {shape} of {dtype} would take {nbytes:.3g} bytes, more than the "
                f"{MAX_ARRAY_BYTES:.3g} (1 TiB) an array may have")
    return None


def literal_problem(value: Any, dtype: DType) -> str | None:
    """Why `value` cannot be a literal of `dtype` (an int outside the dtype's range, a float
    for an integer dtype, a Python int too large for a float), or None when it can."""
    if isinstance(value, np.generic):
        value = value.item()
    if dtype.kind == "bool":
        return None if isinstance(value, bool) or value in (0, 1) else f"{value!r} is not a bool"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number"
    if dtype.is_int:
        if not isinstance(value, int):
            return f"{value!r} is not an integer"
        info = np.iinfo(dtype.numpy)
        if not info.min <= value <= info.max:
            return f"{_shown_int(value)} does not fit in {dtype} ([{info.min}, {info.max}])"
        return None
    try:
        float(value)
    except OverflowError:
        return f"{_shown_int(value)} is too large for any float"
    return None


def _shown_int(value: int) -> str:
    digits = str(value)
    return digits if len(digits) <= 30 else f"{digits[:12]}...{digits[-4:]} ({len(digits.lstrip('-'))} digits)"


def strides(shape: tuple[int, ...] | list[int]) -> list[int]:
    """Element strides of a row-major (C-contiguous) array of `shape`."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


_var_ids = itertools.count()


def var_id_bound() -> int:
    """An id above every Var made so far in this process."""
    return next(_var_ids)


def reserve_var_ids(bound: int) -> None:
    """Vars made from now on get ids of at least `bound`: a Graph read back from another process
    (a cached Plan) holds that process's ids, which new Vars must not repeat."""
    global _var_ids
    _var_ids = itertools.count(max(next(_var_ids), bound))


@dataclass(frozen=True, eq=False)
class Var:
    """A value defined once in a Graph; identity is what distinguishes two Vars."""

    type: TensorType
    id: int = field(default_factory=lambda: next(_var_ids))

    def __repr__(self) -> str:
        return f"Var#{self.id}:{self.type}"


@dataclass(frozen=True)
class Literal:
    """A scalar constant used directly as an operand."""

    value: Any  # a Python bool, int or float
    type: TensorType

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, float) and not math.isfinite(value):
            text = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        else:
            text = repr(value)
        return f"{text}:{self.type.dtype.name}"


Atom = Union[Var, Literal]


@dataclass(frozen=True, eq=False)
class Eqn:
    """`outvars = primitive[params] inputs`, with the user's source line that created it."""

    primitive: str
    inputs: tuple[Atom, ...]
    params: tuple[tuple[str, Any], ...]
    outvars: tuple[Var, ...]
    source: str | None = None

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True, eq=False)
class Graph:
    """A traced program: `{ lambda constvars ; invars . let eqns in outvars }`."""

    constvars: tuple[Var, ...]
    invars: tuple[Var, ...]
    eqns: tuple[Eqn, ...]
    outvars: tuple[Atom, ...]

    @property
    def in_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.invars)

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        return tuple(a.type for a in self.outvars)

    def __str__(self) -> str:
        from glue.ir.printer import print_graph

        return print_graph(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and _alpha_equal(self, other)

    def __hash__(self) -> int:
        return hash((len(self.invars), len(self.eqns), self.out_types))


@dataclass(frozen=True, eq=False)
class ClosedGraph:
    """A Graph with values for its constvars (arrays, or tracers of an enclosing trace)."""

    graph: Graph
    consts: tuple[Any, ...]

    def __str__(self) -> str:
        return str(self.graph)


def params_tuple(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Params in the canonical (sorted, hashable) form that Eqns store."""
    return tuple(sorted(params.items()))


def _alpha_equal(a: Graph, b: Graph) -> bool:
    mapping: dict[int, int] = {}

    def bind(xs, ys) -> bool:
        if len(xs) != len(ys):
            return False
        for x, y in zip(xs, ys):
            if x.type != y.type:
                return False
            mapping[x.id] = y.id
        return True

    def same_atom(x: Atom, y: Atom) -> bool:
        if isinstance(x, Var) and isinstance(y, Var):
            return mapping.get(x.id) == y.id
        return isinstance(x, Literal) and isinstance(y, Literal) and _same_literal(x, y)

    if not (bind(a.constvars, b.constvars) and bind(a.invars, b.invars)):
        return False
    if len(a.eqns) != len(b.eqns):
        return False
    for ea, eb in zip(a.eqns, b.eqns):
        if (ea.primitive, ea.params, ea.source) != (eb.primitive, eb.params, eb.source):
            return False
        if len(ea.inputs) != len(eb.inputs) or not all(map(same_atom, ea.inputs, eb.inputs)):
            return False
        if not bind(ea.outvars, eb.outvars):
            return False
    return len(a.outvars) == len(b.outvars) and all(map(same_atom, a.outvars, b.outvars))


def _same_literal(x: Literal, y: Literal) -> bool:
    if x.type != y.type:
        return False
    if isinstance(x.value, float) and isinstance(y.value, float) and math.isnan(x.value):
        return math.isnan(y.value)
    return x.value == y.value and type(x.value) is type(y.value)
