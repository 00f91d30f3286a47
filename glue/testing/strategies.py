"""Hypothesis strategies for testing glue and functions written with it.

`shapes`, `dtypes` and `arrays` draw inputs (finite, of moderate magnitude, never all zeros;
bfloat16 through ml_dtypes), `special_elements` adversarial ones (huge, tiny, subnormal, NaN,
infinite, -0.0, the integer extremes). `programs` draws random well-typed Graphs over every
primitive of the IR, and `graph_inputs` draws inputs for one; the pair agrees with the float64
reference within tolerance by construction (see `glue.testing.numerics`), and shrinks to small
programs. `large_programs` builds programs of thousands of equations from a drawn seed (a
hypothesis example cannot hold that many choices), and `graph_inputs` makes large inputs from
a seed too.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from hypothesis import assume, strategies as st

from glue.errors import GlueError
from glue.ir import PRIMITIVES, Eqn, Graph, Literal, TensorType, Var, infer_type, params_tuple
from glue.ir import dtypes as dt
from glue.ir.core import Atom
from glue.ir.dtypes import DType
from glue.testing.numerics import (FLOAT_BITS, FLOAT_MAX, Facts, derive, input_facts, int_range,
                                   literal_facts, within_tolerance)

# Shrinking moves toward the front of this order; every other dtype glue has follows.
_PREFERRED = (dt.float32, dt.int32, dt.bool_, dt.bfloat16, dt.float16, dt.int64, dt.float64)
_DTYPE_ORDER = _PREFERRED + tuple(d for d in dt.ALL_DTYPES if d not in _PREFERRED)
_KINDS = ("float", "int", "bool")
_MAGNITUDE_LIMIT = 64.0  # no value grows past this: f16 cannot overflow, errors stay small
_GRID_LITERALS = (0.5, 2.0, -1.0, 1.5, -0.25, 3.0)
# Equations `programs` adds around the primitives it is asked for: domain guards (abs, add),
# magnitude taming (tanh, rem), a select's predicate (gt), and indices (iota, gather).
HELPER_PRIMITIVES = frozenset({"abs", "add", "tanh", "rem", "gt", "iota", "gather"})


def shapes(min_rank: int = 0, max_rank: int = 3, min_side: int = 1,
           max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes of `min_rank`..`max_rank` axes, each of `min_side`..`max_side` elements."""
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


def dtypes(kinds: Iterable[str] = _KINDS) -> st.SearchStrategy[DType]:
    """glue dtypes of the given kinds ("float", "int", "bool"); shrinks toward float32."""
    kinds = set(kinds)
    unknown = kinds - set(_KINDS)
    if unknown:
        raise GlueError(f"dtypes(kinds=...): unknown kinds {sorted(unknown)}; use {_KINDS}")
    return st.sampled_from([d for d in _DTYPE_ORDER if d.kind in kinds])


def elements(dtype: Any, exact: bool = False) -> st.SearchStrategy[Any]:
    """Scalars for arrays of `dtype`: moderate and finite. With `exact`, floats are multiples of
    1/8 in [-4, 4] and ints lie in [-2, 5] ([0, 7] if unsigned; what `graph_inputs` uses);
    otherwise floats also take arbitrary values of that range (rounded to `dtype` later) and
    ints lie in [-8, 8] ([0, 16] if unsigned)."""
    dtype = dt.from_numpy(dtype)
    if dtype == dt.bool_:
        return st.booleans()
    if dtype.is_int:
        if exact:
            return st.integers(*int_range(dtype))
        return st.integers(0, 16) if dtype.is_unsigned else st.integers(-8, 8)
    k = int(FLOAT_MAX * 2 ** FLOAT_BITS)
    grid = st.integers(-k, k).map(lambda i: i / 2 ** FLOAT_BITS)
    if exact:
        return grid
    # No subnormals: targets that flush them to zero are not wrong.
    anywhere = st.floats(-FLOAT_MAX, FLOAT_MAX, width=32).map(lambda v: 0.0 if abs(v) < 2 ** -10 else v)
    return st.one_of(grid, anywhere)


_elements_of = elements


def arrays(dtype: Any, shape: Any, elements: st.SearchStrategy[Any] | None = None,
           exact: bool = False) -> st.SearchStrategy[np.ndarray]:
    """NumPy arrays of `dtype` and `shape` (each a value or a strategy), never all zeros; the
    elements are `elements`, or by default those of `glue.testing.elements(dtype, exact)`."""
    @st.composite
    def draw_array(draw) -> np.ndarray:
        d = dt.from_numpy(draw(dtype) if isinstance(dtype, st.SearchStrategy) else dtype)
        s = tuple(draw(shape) if isinstance(shape, st.SearchStrategy) else shape)
        each = _elements_of(d, exact) if elements is None else elements
        values = draw(st.lists(each, min_size=math.prod(s), max_size=math.prod(s)))
        array = np.array(values, dtype=np.float64 if d.is_float else d.numpy).astype(d.numpy).reshape(s)
        if array.size and not array.any():
            assume(elements is None)  # custom elements: draw again rather than invent a value
            array.flat[0] = 1
        return array

    return draw_array()


def special_elements(dtype: Any) -> st.SearchStrategy[Any]:
    """Adversarial scalars for arrays of `dtype`: for floats the largest and smallest normal
    values, subnormals, NaN, both infinities, -0.0 and ordinary numbers; for integers the
    extremes of the dtype and their neighbours; for bool both values."""
    dtype = dt.from_numpy(dtype)
    if dtype == dt.bool_:
        return st.booleans()
    if dtype.is_int:
        info = np.iinfo(dtype.numpy)
        edges = [info.min, info.min + 1, info.max - 1, info.max, -1, 0, 1]
        return st.one_of(st.sampled_from([v for v in edges if info.min <= v <= info.max]),
                         st.integers(info.min, info.max))
    info = np.finfo(dtype.numpy)
    big, tiny, smallest = float(info.max), float(info.tiny), float(info.smallest_subnormal)
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, big, -big, tiny, -tiny, smallest, -smallest,
                tiny / 2, float(info.eps), 1.0, -1.0]
    width = 32 if dtype == dt.bfloat16 else dtype.bits  # bfloat16 values are rounded from float32 ones
    return st.one_of(st.sampled_from(specials), st.floats(-big, big, width=width))


# --- random programs ------------------------------------------------------------------------

_integers = functools.lru_cache(maxsize=None)(st.integers)  # building strategies costs more than drawing


@functools.lru_cache(maxsize=None)
def _permutations(n: int) -> st.SearchStrategy[list[int]]:
    return st.permutations(range(n))


class _Drawn:
    """The builder's random choices, drawn by hypothesis (so that examples shrink)."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(_integers(lo, hi))

    def subset(self, n: int) -> list[int]:
        """A non-empty subset of range(n), sorted."""
        return sorted(self.draw(st.sets(st.sampled_from(range(n)), min_size=1)))

    def permutation(self, n: int) -> list[int]:
        return list(self.draw(_permutations(n)))

    def some_of(self, items: Sequence[Any]) -> list[Any]:
        """Distinct items of `items`, any number, in any order."""
        return self.draw(st.lists(st.sampled_from(items), unique=True)) if items else []

    def sizes(self, count: int | tuple[int, int], lo: int, hi: int) -> tuple[int, ...]:
        """`count` (or min..max many) integers in [lo, hi]."""
        least, most = count if isinstance(count, tuple) else (count, count)
        return tuple(self.draw(st.lists(st.integers(lo, hi), min_size=least, max_size=most)))

    def shape(self, min_rank: int, max_rank: int, max_side: int) -> tuple[int, ...]:
        return self.draw(shapes(min_rank, max_rank, 1, max_side))

    def boolean(self) -> bool:
        return self.draw(st.booleans())

    def sample(self, items: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(items))

    def go_on(self) -> bool:
        """One "go on?" choice before each step lets the shrinker delete any step on its own."""
        return self.draw(_integers(0, 19)) != 0


class _Seeded:
    """The same choices from a seeded generator: for programs too large for one hypothesis
    example; they are reproduced from the seed rather than shrunk."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def subset(self, n: int) -> list[int]:
        return sorted(self.rng.sample(range(n), self.rng.randint(1, n)))

    def permutation(self, n: int) -> list[int]:
        return self.rng.sample(range(n), n)

    def some_of(self, items: Sequence[Any]) -> list[Any]:
        return self.rng.sample(list(items), self.rng.randint(0, len(items)))

    def sizes(self, count: int | tuple[int, int], lo: int, hi: int) -> tuple[int, ...]:
        n = self.rng.randint(*count) if isinstance(count, tuple) else count
        return tuple(self.rng.randint(lo, hi) for _ in range(n))

    def shape(self, min_rank: int, max_rank: int, max_side: int) -> tuple[int, ...]:
        return self.sizes((min_rank, max_rank), 1, max_side)

    def boolean(self) -> bool:
        return self.rng.random() < 0.5

    def sample(self, items: Sequence[Any]) -> Any:
        return self.rng.choice(items)

    def go_on(self) -> bool:
        return True


class _Refused(Exception):
    """The step would make an ill-typed, too large or ill-conditioned program; undo it."""


class _TooLarge(_Refused):
    """The result's magnitude bound passes `_MAGNITUDE_LIMIT`; taming operands may help."""


@dataclass(frozen=True)
class _Config:
    dtypes: tuple[DType, ...]
    primitives: frozenset[str]
    max_eqns: int
    max_rank: int
    max_side: int
    math_ulps: float
    scale: float
    max_size: int
    window: int | None = None  # operands come from the last `window` values (None: any value)


class _Builder:
    """A program under construction: the values defined so far and what is known about them."""

    def __init__(self, choices: _Drawn | _Seeded, cfg: _Config):
        self.choices = choices
        self.cfg = cfg
        self.invars: list[Var] = []
        self.eqns: list[Eqn] = []
        self.values: list[Var] = []
        self.facts: dict[int, Facts] = {}

    def add_input(self, type_: TensorType) -> None:
        var = Var(type_)
        self.invars.append(var)
        self.values.append(var)
        self.facts[var.id] = input_facts(type_.dtype)

    def facts_of(self, atom: Atom) -> Facts:
        return literal_facts(atom.value) if isinstance(atom, Literal) else self.facts[atom.id]

    def exact(self, atom: Atom) -> bool:
        return self.facts_of(atom).exact

    def op(self, primitive: str, *inputs: Atom, tame: Sequence[int] = (), **params: Any) -> Var:
        """Append `primitive[params] inputs`; if the result could grow too large, retry once
        with the operands at positions `tame` shrunk to magnitude 1."""
        try:
            return self._emit(primitive, inputs, params)
        except _TooLarge:
            if not tame:
                raise
            return self._emit(primitive, tuple(self.tame(a) if i in tame else a for i, a in enumerate(inputs)),
                              params)

    def _emit(self, primitive: str, inputs: tuple[Atom, ...], params: dict[str, Any]) -> Var:
        types = tuple(a.type for a in inputs)
        out = infer_type(primitive, types, params)
        if out.size > self.cfg.max_size:
            raise _Refused
        facts = derive(primitive, [self.facts_of(a) for a in inputs], types, out, params, self.cfg.math_ulps)
        if facts.mag > _MAGNITUDE_LIMIT:
            raise _TooLarge
        if not within_tolerance(facts, self.cfg.scale):
            raise _Refused
        var = Var(out)
        self.eqns.append(Eqn(primitive, inputs, params_tuple(params), (var,)))
        self.values.append(var)
        self.facts[var.id] = facts
        return var

    def tame(self, x: Atom) -> Atom:
        """`x` brought to magnitude <= 1 (floats through tanh, ints through `rem 2`)."""
        if isinstance(x, Literal) or x.type.dtype == dt.bool_ or self.facts_of(x).mag <= 1:
            return x
        if x.type.dtype.is_float:
            return self._emit("tanh", (x,), {})
        return self._emit("rem", (x, Literal(2, TensorType((), x.type.dtype))), {})

    @property
    def pool(self) -> list[Var]:
        """The values later operations take their operands from."""
        return self.values[-self.cfg.window:] if self.cfg.window else self.values

    def integer(self, lo: int, hi: int) -> int:
        return self.choices.integer(lo, hi)

    def choose(self, candidates: Sequence[Any]) -> Any:
        if not candidates:
            raise _Refused
        return candidates[self.integer(0, len(candidates) - 1)]

    def literal(self, dtype: DType) -> Literal:
        if dtype == dt.bool_:
            value: Any = bool(self.integer(0, 1))
        elif dtype.is_int:
            value = self.integer(*int_range(dtype))
        else:
            value = self.choose(_GRID_LITERALS)
        return Literal(value, TensorType((), dtype))

    def partner(self, x: Atom, ok: Callable[[Atom], bool] = lambda v: True) -> Atom:
        """A second elementwise operand for `x`: a value of its dtype and shape, a rank-0
        value of its dtype, or a literal (the last choice)."""
        cands = [v for v in self.pool if v.type.dtype == x.type.dtype and ok(v)
                 and (v.type.shape == x.type.shape or v.type.ndim == 0 or x.type.ndim == 0)]
        i = self.integer(0, len(cands))
        return cands[i] if i < len(cands) else self.literal(x.type.dtype)

    def graph(self) -> Graph:
        used = {a.id for e in self.eqns for a in e.inputs if isinstance(a, Var)}
        sinks = tuple(e.outvars[0] for e in self.eqns if e.outvars[0].id not in used)
        return Graph((), tuple(self.invars), tuple(self.eqns), sinks or (self.invars[0],))


# Operand predicates: what a primitive's first operand must be.
def _is_any(b: _Builder, v: Var) -> bool:
    return True


def _is_float(b: _Builder, v: Var) -> bool:
    return v.type.dtype.is_float


def _is_numeric(b: _Builder, v: Var) -> bool:
    return v.type.dtype != dt.bool_


def _is_exact(b: _Builder, v: Var) -> bool:
    return b.exact(v)


def _is_exact_float(b: _Builder, v: Var) -> bool:
    return v.type.dtype.is_float and b.exact(v)


def _is_exact_numeric(b: _Builder, v: Var) -> bool:
    return v.type.dtype != dt.bool_ and b.exact(v)


def _is_logical(b: _Builder, v: Var) -> bool:
    return not v.type.dtype.is_float


def _is_integer(b: _Builder, v: Var) -> bool:
    return v.type.dtype.is_int


def _has_axes(b: _Builder, v: Var) -> bool:
    return v.type.ndim >= 1


def _both(*preds: Callable[[_Builder, Var], bool]) -> Callable[[_Builder, Var], bool]:
    return lambda b, v: all(p(b, v) for p in preds)


# Guards keep operands inside the domain where a primitive is defined and well conditioned.
def _positive(b: _Builder, x: Atom) -> Atom:
    """|x| + 0.5: for log, rsqrt, divisors and bases of pow."""
    if isinstance(x, Literal):
        return Literal(abs(x.value) + 0.5, x.type)
    return b.op("add", b.op("abs", x), Literal(0.5, TensorType((), x.type.dtype)), tame=(0,))


def _nonnegative(b: _Builder, x: Atom) -> Atom:
    return b.op("abs", x)


def _at_most(limit: float) -> Callable[[_Builder, Atom], Atom]:
    def guard(b: _Builder, x: Atom) -> Atom:
        return b.tame(x) if b.facts_of(x).mag > limit else x
    return guard


def _unary(primitive: str, guard: Callable[[_Builder, Atom], Atom] | None = None):
    def build(b: _Builder, x: Var) -> Var:
        return b.op(primitive, guard(b, x) if guard else x)
    return build


def _binary(primitive: str, exact: bool = False):
    def build(b: _Builder, x: Var) -> Var:
        y = b.partner(x, (lambda v: b.exact(v)) if exact else (lambda v: True))
        return b.op(primitive, x, y, tame=(0, 1))
    return build


def _division(primitive: str):
    """div and rem: float divisors are guarded away from zero; integer ones may be zero (defined)."""
    def build(b: _Builder, x: Var) -> Var:
        is_rem = primitive == "rem"
        y = b.partner(x, lambda v: b.exact(v) or not is_rem)
        if x.type.dtype.is_float:
            y = _positive(b, y)
        if is_rem and not b.exact(y):  # fmod jumps where a rounded divisor would cross a multiple
            raise _Refused
        return b.op(primitive, x, y, tame=() if is_rem else (0,))
    return build


def _pow(b: _Builder, x: Var) -> Var:
    if x.type.dtype.is_float:
        base = _positive(b, _at_most(4.0)(b, x))
        exponent = _at_most(2.0)(b, b.partner(x))
    else:
        base = x
        exponent = Literal(b.integer(0 if x.type.dtype.is_unsigned else -1, 3), TensorType((), x.type.dtype))
    return b.op("pow", base, exponent, tame=(0,))


def _select(b: _Builder, x: Var) -> Var:
    y = b.partner(x)
    shape = x.type.shape or y.type.shape

    def fits(v: Atom) -> bool:
        return v.type.shape in (shape, ())

    preds = [v for v in b.pool if v.type.dtype == dt.bool_ and fits(v)]
    i = b.integer(0, len(preds))
    if i < len(preds):
        pred: Atom = preds[i]
    else:
        z = next((v for v in (x, y) if isinstance(v, Var) and b.exact(v) and v.type.dtype != dt.bool_), None)
        zero = None if z is None else Literal(0 if z.type.dtype.is_int else 0.0, TensorType((), z.type.dtype))
        pred = b.literal(dt.bool_) if z is None else b.op("gt", z, zero)
    return b.op("select", pred, x, y)


def _convert(b: _Builder, x: Var) -> Var:
    # Casting a rounded float to an integer or bool would magnify its rounding error.
    exact = b.exact(x)
    targets = [d for d in b.cfg.dtypes if d != x.type.dtype and (exact or d.is_float)]
    return b.op("convert_element_type", x, new_dtype=b.choose(targets))


def _bitcast(b: _Builder, x: Var) -> Var:
    """Between integers of one width: a float's bits, read as an integer (or the reverse), are
    no moderate value (the bit patterns of floats are tested on their own); a negative value
    read as unsigned would wrap, so it is made nonnegative first."""
    target = b.choose([d for d in b.cfg.dtypes if d.is_int and d.bits == x.type.dtype.bits and d != x.type.dtype])
    operand = _nonnegative(b, x) if target.is_unsigned and not b.facts_of(x).nonneg else x
    return b.op("bitcast_convert_type", operand, new_dtype=target)


def _axes(b: _Builder, x: Var) -> tuple[int, ...]:
    if not x.type.ndim:
        return ()
    return tuple(b.choices.subset(x.type.ndim))


def _reduce(primitive: str):
    def build(b: _Builder, x: Var) -> Var:
        return b.op(primitive, x, axes=_axes(b, x), tame=(0,))
    return build


def _arg_reduce(primitive: str):
    def build(b: _Builder, x: Var) -> Var:
        index_dtype = b.choose([d for d in b.cfg.dtypes if d.is_int] or [dt.int32])
        return b.op(primitive, x, axis=b.integer(0, x.type.ndim - 1), index_dtype=index_dtype)
    return build


def _broadcast_in_dim(b: _Builder, x: Var) -> Var:
    have = x.type.shape
    rank = b.integer(len(have), max(len(have), b.cfg.max_rank))
    dims = tuple(sorted(b.choices.permutation(rank)[:len(have)]))
    shape = [b.integer(1, b.cfg.max_side) for _ in range(rank)]
    for n, d in zip(have, dims):
        shape[d] = n if n != 1 else shape[d]
    return b.op("broadcast_in_dim", x, shape=tuple(shape), dims=dims)


def _reshape(b: _Builder, x: Var) -> Var:
    factors, n = [], x.type.size
    for p in range(2, n + 1):
        while n % p == 0:
            factors.append(p)
            n //= p
    rank = b.integer(1 if factors else 0, b.cfg.max_rank)
    shape = [1] * rank
    for p in factors:
        shape[b.integer(0, rank - 1)] *= p
    return b.op("reshape", x, shape=tuple(shape))


def _transpose(b: _Builder, x: Var) -> Var:
    return b.op("transpose", x, permutation=tuple(b.choices.permutation(x.type.ndim)))


def _slice(b: _Builder, x: Var) -> Var:
    start, limit, strides = [], [], []
    for n in x.type.shape:
        lo = b.integer(0, n - 1)
        start.append(lo)
        limit.append(b.integer(lo + 1, n))
        strides.append(b.integer(1, 3))
    return b.op("slice", x, start=tuple(start), limit=tuple(limit), strides=tuple(strides))


def _pad(b: _Builder, x: Var) -> Var:
    low, high = b.choices.sizes(x.type.ndim, 0, 2), b.choices.sizes(x.type.ndim, 0, 2)
    return b.op("pad", x, low=low, high=high, value=b.literal(x.type.dtype).value)


def _concatenate(b: _Builder, x: Var) -> Var:
    d = b.integer(0, x.type.ndim - 1)
    same = [v for v in b.pool if v.type.dtype == x.type.dtype and v.type.ndim == x.type.ndim
            and all(m == n for i, (m, n) in enumerate(zip(v.type.shape, x.type.shape)) if i != d)]
    others = [b.choose(same) for _ in range(b.integer(1, 2))]
    return b.op("concatenate", x, *others, dimension=d)


def _iota(b: _Builder, _: None) -> Var:
    known = [v.type.shape for v in b.pool if v.type.ndim]
    if known and b.integer(0, 1) == 0:
        shape = b.choose(known)
    else:
        shape = b.choices.shape(1, b.cfg.max_rank, b.cfg.max_side)
    dtype = b.choose([d for d in b.cfg.dtypes if d != dt.bool_])
    return b.op("iota", dtype=dtype, shape=shape, dimension=b.integer(0, len(shape) - 1))


def _dot_general(b: _Builder, x: Var) -> Var:
    xs = x.type.shape
    y = b.choose([v for v in b.pool if v.type.dtype == x.type.dtype and set(v.type.shape) & set(xs)])
    ys = y.type.shape
    pairs = [(i, j) for i in range(len(xs)) for j in range(len(ys)) if xs[i] == ys[j]]
    lc, rc, lb, rb = [], [], [], []
    for i, j in b.choices.some_of(pairs):
        if i not in lc + lb and j not in rc + rb:
            target_l, target_r = (lb, rb) if b.integer(0, 1) else (lc, rc)
            target_l.append(i)
            target_r.append(j)
    for i, j in pairs:  # contract more until the result's rank fits
        if len(xs) + len(ys) - 2 * len(lc) - len(lb) <= b.cfg.max_rank:
            break
        if i not in lc + lb and j not in rc + rb:
            lc.append(i)
            rc.append(j)
    if len(xs) + len(ys) - 2 * len(lc) - len(lb) > b.cfg.max_rank:
        raise _Refused
    numbers = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
    return b.op("dot_general", x, y, dimension_numbers=numbers, tame=(0, 1))


def _index(b: _Builder, x: Var) -> tuple[Atom, int, int]:
    """An index operand for gather/scatter_add into `x`: a literal, an integer value of a
    fitting shape, or an iota; indices out of range are allowed (gather clamps, scatter drops)."""
    axis = b.integer(0, x.type.ndim - 1)
    batch = b.integer(0, axis)
    prefix = x.type.shape[:batch]
    room = b.cfg.max_rank - x.type.ndim + 1  # index axes the result has room for
    cands = [v for v in b.pool if v.type.dtype.is_int and v.type.shape[:batch] == prefix
             and 0 <= v.type.ndim - batch <= room]
    options = (["literal"] if batch == 0 else []) + cands + ["iota"]
    choice = b.choose(options)
    if choice == "literal":
        return Literal(b.integer(-1, x.type.shape[axis]), TensorType((), dt.int32)), axis, batch
    if choice != "iota":
        return choice, axis, batch
    extra = b.choices.sizes((0 if batch else 1, max(room, 0 if batch else 1)), 1, b.cfg.max_side)
    shape = prefix + extra
    dtype = b.choose([d for d in b.cfg.dtypes if d.is_int] or [dt.int32])
    iota = b.op("iota", dtype=dtype, shape=shape, dimension=b.integer(0, len(shape) - 1))
    return iota, axis, batch


def _gather(b: _Builder, x: Var) -> Var:
    idx, axis, batch = _index(b, x)
    return b.op("gather", x, idx, axis=axis, batch_dims=batch)


def _scatter_add(b: _Builder, x: Var) -> Var:
    idx, axis, batch = _index(b, x)
    want = infer_type("gather", (x.type, idx.type), {"axis": axis, "batch_dims": batch})
    cands = [v for v in b.pool if v.type == want]
    i = b.integer(0, len(cands))
    updates = cands[i] if i < len(cands) else b.op("gather", x, idx, axis=axis, batch_dims=batch)
    return b.op("scatter_add", x, idx, updates, axis=axis, batch_dims=batch, tame=(0, 2))


@dataclass(frozen=True)
class _OpSpec:
    operand: Callable[[_Builder, Var], bool] | None  # None: takes no operand (iota)
    build: Callable[[_Builder, Any], Var]


_bounded_exp = _at_most(4.0)
_OPS: dict[str, _OpSpec] = {
    "add": _OpSpec(_is_numeric, _binary("add")),
    "neg": _OpSpec(_is_numeric, _unary("neg")),
    "mul": _OpSpec(_is_numeric, _binary("mul")),
    "sub": _OpSpec(_is_numeric, _binary("sub")),
    "abs": _OpSpec(_is_numeric, _unary("abs")),
    "exp": _OpSpec(_is_float, _unary("exp", _bounded_exp)),
    "exp2": _OpSpec(_is_float, _unary("exp2", _bounded_exp)),
    "expm1": _OpSpec(_is_float, _unary("expm1", _bounded_exp)),
    "log": _OpSpec(_is_float, _unary("log", _positive)),
    "log2": _OpSpec(_is_float, _unary("log2", _positive)),
    "log1p": _OpSpec(_is_float, _unary("log1p", _nonnegative)),
    "sqrt": _OpSpec(_is_float, _unary("sqrt", _nonnegative)),
    "rsqrt": _OpSpec(_is_float, _unary("rsqrt", _positive)),
    "tanh": _OpSpec(_is_float, _unary("tanh")),
    "logistic": _OpSpec(_is_float, _unary("logistic")),
    "sin": _OpSpec(_is_float, _unary("sin")),
    "cos": _OpSpec(_is_float, _unary("cos")),
    "erf": _OpSpec(_is_float, _unary("erf")),
    "erfc": _OpSpec(_is_float, _unary("erfc")),
    "floor": _OpSpec(_is_exact_float, _unary("floor")),
    "ceil": _OpSpec(_is_exact_float, _unary("ceil")),
    "round": _OpSpec(_is_exact_float, _unary("round")),
    "sign": _OpSpec(_is_exact_numeric, _unary("sign")),
    "not": _OpSpec(_is_logical, _unary("not")),
    "div": _OpSpec(_is_numeric, _division("div")),
    "rem": _OpSpec(_is_exact_numeric, _division("rem")),
    "pow": _OpSpec(_is_numeric, _pow),
    "max": _OpSpec(_is_any, _binary("max")),
    "min": _OpSpec(_is_any, _binary("min")),
    "and": _OpSpec(_is_logical, _binary("and")),
    "or": _OpSpec(_is_logical, _binary("or")),
    "xor": _OpSpec(_is_logical, _binary("xor")),
    "shift_left": _OpSpec(_is_integer, _binary("shift_left")),
    "shift_right_logical": _OpSpec(_is_integer, _binary("shift_right_logical")),
    "shift_right_arithmetic": _OpSpec(_is_integer, _binary("shift_right_arithmetic")),
    "population_count": _OpSpec(_is_integer, _unary("population_count")),
    "bitcast_convert_type": _OpSpec(_is_integer, _bitcast),
    **{c: _OpSpec(_is_exact, _binary(c, exact=True)) for c in ("eq", "ne", "lt", "le", "gt", "ge")},
    "select": _OpSpec(_is_any, _select),
    "convert_element_type": _OpSpec(_is_any, _convert),
    "reduce_sum": _OpSpec(_is_numeric, _reduce("reduce_sum")),
    "reduce_prod": _OpSpec(_is_numeric, _reduce("reduce_prod")),
    "reduce_max": _OpSpec(_is_any, _reduce("reduce_max")),
    "reduce_min": _OpSpec(_is_any, _reduce("reduce_min")),
    "argmax": _OpSpec(_both(_is_exact, _has_axes), _arg_reduce("argmax")),
    "argmin": _OpSpec(_both(_is_exact, _has_axes), _arg_reduce("argmin")),
    "broadcast_in_dim": _OpSpec(_is_any, _broadcast_in_dim),
    "reshape": _OpSpec(_is_any, _reshape),
    "transpose": _OpSpec(lambda b, v: v.type.ndim >= 2, _transpose),
    "slice": _OpSpec(_has_axes, _slice),
    "pad": _OpSpec(_has_axes, _pad),
    "concatenate": _OpSpec(_has_axes, _concatenate),
    "iota": _OpSpec(None, _iota),
    "dot_general": _OpSpec(_both(_is_numeric, _has_axes), _dot_general),
    "gather": _OpSpec(_has_axes, _gather),
    "scatter_add": _OpSpec(_both(_is_numeric, _has_axes), _scatter_add),
}


def _step(b: _Builder) -> None:
    """Append one randomly chosen operation (with its guards) to the program, or nothing."""
    usable = [(name, spec) for name, spec in _OPS.items() if name in b.cfg.primitives
              and (spec.operand is None or any(spec.operand(b, v) for v in b.pool))]
    if not usable:
        return
    name, spec = b.choose(usable)
    operand = None if spec.operand is None else b.choose([v for v in b.pool if spec.operand(b, v)])
    n_eqns, n_values = len(b.eqns), len(b.values)
    try:
        spec.build(b, operand)
        if len(b.eqns) > b.cfg.max_eqns:
            raise _Refused
    except _Refused:
        del b.eqns[n_eqns:], b.values[n_values:]


def _config(fn: str, min_inputs: int, dtypes: Sequence[Any], primitives: Iterable[str] | None, max_eqns: int,
            max_rank: int, max_side: int, math_ulps: float, scale: float, max_size: int | None,
            window: int | None = None) -> _Config:
    if min_inputs < 1:
        raise GlueError(f"{fn}(min_inputs={min_inputs}): a program needs at least one input")
    # Opaque primitives (control flow, calls, prints) have tests of their own.
    chosen = frozenset((n for n, p in PRIMITIVES.items() if not p.opaque) if primitives is None else primitives)
    unknown = chosen - set(_OPS)
    if unknown:
        raise GlueError(f"{fn}(primitives=...): unknown primitives {sorted(unknown)}")
    order = {d: i for i, d in enumerate(_DTYPE_ORDER)}
    return _Config(tuple(sorted({dt.from_numpy(d) for d in dtypes}, key=order.__getitem__)), chosen,
                   max_eqns, max_rank, max_side, math_ulps, scale,
                   max_side ** max_rank if max_size is None else max_size, window)


def _build(choices: _Drawn | _Seeded, cfg: _Config, min_inputs: int, max_inputs: int) -> Graph:
    b = _Builder(choices, cfg)
    first = TensorType(choices.shape(0, cfg.max_rank, cfg.max_side),
                       next((d for d in cfg.dtypes if d.is_float), cfg.dtypes[0]))
    for _ in range(choices.integer(min_inputs, max_inputs)):
        b.add_input(first if not choices.boolean() else
                    TensorType(choices.shape(0, cfg.max_rank, cfg.max_side), choices.sample(cfg.dtypes)))
    _step(b)
    attempts = 1
    # A step may be refused and add nothing, so a build stops after enough attempts; until one
    # step is taken it goes on without asking (a program has at least one equation).
    while len(b.eqns) < cfg.max_eqns and attempts < 20 * cfg.max_eqns and (not b.eqns or choices.go_on()):
        _step(b)
        attempts += 1
    return b.graph()


def programs(*, min_inputs: int = 1, max_inputs: int = 3, max_eqns: int = 8,
             dtypes: Sequence[Any] = (dt.float32, dt.int32, dt.bool_), primitives: Iterable[str] | None = None,
             max_rank: int = 3, max_side: int = 4, math_ulps: float = 2.0,
             scale: float = 1.0, max_size: int | None = None) -> st.SearchStrategy[Graph]:
    """Random well-typed Graphs: DAGs of 1 to `max_eqns` equations over `primitives` (default:
    every primitive but the opaque ones, control flow and calls, which have tests of their own) on `min_inputs`..`max_inputs` inputs of `dtypes`; every unused result is an output.

    Run them on inputs from `graph_inputs`: then no domain error occurs (log, sqrt, rsqrt, pow and
    float division see operands guarded into their domains, exp sees bounded ones), nothing
    overflows, and every output of a native evaluation agrees with a float64 one within
    `scale` times its tolerance (`glue.testing.check.tolerance_dtypes`), assuming library math
    functions err by at most `math_ulps` units in the last place. Equations of
    `HELPER_PRIMITIVES` may appear beyond `primitives`; comparisons and argmax yield bool and
    integer values whatever `dtypes` says. Shapes have at most `max_rank` axes of `max_side`
    elements, and at most `max_size` elements (default `max_side ** max_rank`).
    """
    cfg = _config("programs", min_inputs, dtypes, primitives, max_eqns, max_rank, max_side, math_ulps, scale,
                  max_size)

    @st.composite
    def draw_program(draw) -> Graph:
        return _build(_Drawn(draw), cfg, min_inputs, max_inputs)

    return draw_program()


def large_programs(*, min_eqns: int = 100, max_eqns: int = 2000, min_inputs: int = 1, max_inputs: int = 6,
                   dtypes: Sequence[Any] = (dt.float32, dt.int32, dt.bool_), primitives: Iterable[str] | None = None,
                   max_rank: int = 3, max_side: int = 4, math_ulps: float = 2.0, scale: float = 1.0,
                   max_size: int | None = None, window: int = 64) -> st.SearchStrategy[Graph]:
    """Graphs like those of `programs` with `min_eqns`..`max_eqns` equations (fewer when steps
    keep being refused), built from a drawn seed: a failing example is reproduced by its seed,
    not shrunk. Operands come from the last `window` values, which keeps building linear in
    the program's length."""
    cfg = _config("large_programs", min_inputs, dtypes, primitives, max_eqns, max_rank, max_side, math_ulps,
                  scale, max_size, window)

    def build(spec: tuple[int, int]) -> Graph:
        length, seed = spec
        return _build(_Seeded(seed), replace(cfg, max_eqns=length), min_inputs, max_inputs)

    return st.tuples(st.integers(min_eqns, max_eqns), st.integers(0, 2 ** 32 - 1)).map(build)


# Inputs with more elements than this (all together) are made from a drawn seed, not drawn one by
# one: hypothesis cannot hold millions of choices in one example.
DRAWN_ELEMENTS = 4096


def seeded_inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Values for `graph`'s constvars then invars on the grids `programs` assumes (floats:
    multiples of 1/8 in [-4, 4]; ints in `int_range`), from a seeded generator, never all zeros."""
    rng = np.random.default_rng(seed)
    values = []
    for v in graph.constvars + graph.invars:
        shape, dtype = v.type.shape, v.type.dtype
        if dtype == dt.bool_:
            x = rng.random(shape) < 0.5
        elif dtype.is_int:
            lo, hi = int_range(dtype)
            x = rng.integers(lo, hi + 1, shape)
        else:
            k = int(FLOAT_MAX * 2 ** FLOAT_BITS)
            x = rng.integers(-k, k + 1, shape) / 2 ** FLOAT_BITS
        x = np.asarray(x).astype(dtype.numpy)
        if x.size and not x.any():
            x.flat[0] = 1
        values.append(x)
    return values


def graph_inputs(graph: Graph) -> st.SearchStrategy[list[np.ndarray]]:
    """Values for `graph`'s constvars then invars, drawn as `programs` assumes (exact grids);
    for large inputs, made from a drawn seed (`seeded_inputs`)."""
    args = graph.constvars + graph.invars
    if sum(v.type.size for v in args) > DRAWN_ELEMENTS:
        return st.integers(0, 2 ** 32 - 1).map(lambda seed: seeded_inputs(graph, seed))
    parts = [arrays(v.type.dtype, v.type.shape, exact=True) for v in args]
    return st.tuples(*parts).map(list)


@st.composite
def programs_and_inputs(draw, **kwargs: Any) -> tuple[Graph, list[np.ndarray]]:
    """A program from `programs(**kwargs)` with inputs from `graph_inputs`."""
    graph = draw(programs(**kwargs))
    return graph, draw(graph_inputs(graph))
