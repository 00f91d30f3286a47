"""Kernel IR: one fused kernel as an iteration domain and scalar expressions over it.

A kernel iterates over `parallel` dims (a "row" is one point of them) and, for reduction and
contraction kernels, over `reduce` dims inside each row. Values live at two levels:

- element level: indexed by all domain dims `(i0.., r0..)`,
- row level: indexed by the parallel dims only; reductions produce row-level values.

Each reduction folds an element-level expression over the reduce dims; later reductions and
stores may use earlier reductions' results (`RowValue`). Stores write element- or row-level
expressions to output buffers. Loads read input buffers through index maps: affine
expressions over the domain dims (broadcast = dim absent, transposes, slices, reshapes that
split or merge dims), plus floor-div/mod where a reshape does not line up, clamps and
data-dependent indices (gather). Backends choose how to map the domain onto loops, threads
and blocks; the scheduler never decides that. `children`, `subexpressions`, `loads_under` and
`postorder` walk expressions, for the scheduler and for both backends, all with explicit stacks:
a long program makes deep expressions, and nothing that walks them may recurse on their depth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from operator import attrgetter
from typing import Any, Callable, Container, Iterable, Iterator, Sequence, Union

from glue.ir import TensorType
from glue.ir.dtypes import DType


class _Node:
    """Kernel IR nodes (index and scalar expressions) are DAGs whose nodes are shared, and long
    programs make them deep. A node hashes its fields once, when it is made (its children's
    hashes are already known, so hashing never recurses), and equality walks both DAGs with an
    explicit stack, comparing each pair of shared nodes once. Both go by `identity`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((type(self).__name__,) + self.identity()))

    def identity(self) -> tuple:
        """What the node is hashed and compared by: its fields (`Const` adds a float's sign)."""
        return _values(self)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or self._hash != other._hash:
            return False
        if type(self) in _LEAVES:  # nothing below: compare the fields themselves
            return self.identity() == other.identity()
        return _same(self, other)

    def __reduce__(self):
        # The cached hash depends on the process's string hashing: rebuild it on unpickling.
        return type(self), _values(self)


_GETTERS: dict[type, Callable[[_Node], tuple]] = {}


def _values(node: _Node) -> tuple:
    """The node's fields, in order."""
    get = _GETTERS.get(type(node))
    if get is None:
        names = [f.name for f in fields(node)]
        get = _GETTERS[type(node)] = attrgetter(*names) if len(names) > 1 else \
            (lambda n, name=names[0]: (getattr(n, name),))
    return get(node)


def _same(a: object, b: object) -> bool:
    """Structural equality of two values that may hold kernel IR nodes, without recursion."""
    stack, compared = [(a, b)], set()
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if isinstance(x, tuple) and isinstance(y, tuple):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, _Node) or isinstance(y, _Node):
            if type(x) is not type(y) or x._hash != y._hash:
                return False
            if (id(x), id(y)) not in compared:
                compared.add((id(x), id(y)))
                stack.extend(zip(x.identity(), y.identity()))
        elif x != y:
            return False
    return True


# --- index expressions ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Dim(_Node):
    """The domain index `k` (parallel dims first, then reduce dims)."""

    k: int


@dataclass(frozen=True, eq=False)
class Div(_Node):
    """floor(index / divisor), for a reshape whose dims do not line up."""

    index: "Index"
    divisor: int


@dataclass(frozen=True, eq=False)
class Mod(_Node):
    index: "Index"
    divisor: int


@dataclass(frozen=True, eq=False)
class Clamp(_Node):
    """An index forced into [0, size): how gather treats out-of-range indices."""

    index: "Index"
    size: int


@dataclass(frozen=True, eq=False)
class FromValue(_Node):
    """A data-dependent index: the integer value of a scalar expression (gather's indices)."""

    value: "Expr"


IndexAtom = Union[Dim, Div, Mod, Clamp, FromValue]


@dataclass(frozen=True, eq=False)
class Index(_Node):
    """An affine combination `sum(coeff * atom) + const` of index atoms."""

    terms: tuple[tuple[IndexAtom, int], ...] = ()
    const: int = 0

    @staticmethod
    def dim(k: int) -> "Index":
        found = _DIM_INDICES.get(k)
        if found is None:
            found = _DIM_INDICES[k] = Index(((Dim(k), 1),))
        return found

    @staticmethod
    def zero() -> "Index":
        """The constant index 0 (a broadcast dimension's), one object as `dim` makes."""
        return _ZERO_INDEX

    @staticmethod
    def of(atom: IndexAtom) -> "Index":
        return Index(((atom, 1),))

    def __add__(self, other: "Index | int") -> "Index":
        if isinstance(other, int):
            return Index(self.terms, self.const + other)
        coeffs: dict[IndexAtom, int] = dict(self.terms)
        for atom, c in other.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Index(tuple((a, c) for a, c in coeffs.items() if c), self.const + other.const)

    def __mul__(self, factor: int) -> "Index":
        if factor == 0:
            return Index.zero()
        return Index(tuple((a, c * factor) for a, c in self.terms), self.const * factor)

    @property
    def is_const(self) -> bool:
        return not self.terms


# Index.dim(k) is made everywhere; one object per k makes comparing indices mostly identity checks.
_DIM_INDICES: dict[int, Index] = {}
_ZERO_INDEX = Index()


Ranges = tuple[tuple[int, int], ...]  # inclusive (lo, hi) per domain dim


@lru_cache(maxsize=1 << 10)
def dim_ranges(extents: tuple[int, ...]) -> Ranges:
    """The inclusive range of each domain dim over a domain of `extents`."""
    return tuple((0, n - 1) for n in extents)


def index_bounds(index: Index, extents: tuple[int, ...]) -> tuple[float, float]:
    """Inclusive bounds of `index` over a domain of `extents` (infinite where data-dependent)."""
    return bounds_in(index, dim_ranges(extents))


def bounds_in(index: Index, ranges: Ranges) -> tuple[float, float]:
    """Inclusive bounds of `index` where each dim k lies in `ranges[k]`."""
    lo = hi = float(index.const)
    for atom, c in index.terms:
        a, b = _atom_bounds(atom, ranges)
        lo, hi = lo + min(a * c, b * c), hi + max(a * c, b * c)
    return lo, hi


def _atom_bounds(atom: IndexAtom, ranges: Ranges) -> tuple[float, float]:
    if isinstance(atom, Dim):
        return ranges[atom.k]
    if isinstance(atom, Clamp):
        return 0, atom.size - 1
    if isinstance(atom, Div):
        lo, hi = bounds_in(atom.index, ranges)
        return _floor_div(lo, atom.divisor), _floor_div(hi, atom.divisor)
    if isinstance(atom, Mod):
        lo, hi = bounds_in(atom.index, ranges)
        # within one period the modulus is the index shifted; else it may take any residue
        if _period(lo, hi, atom.divisor) is not None:
            return lo % atom.divisor, hi % atom.divisor
        return 0, atom.divisor - 1
    return float("-inf"), float("inf")


def _floor_div(bound: float, divisor: int) -> float:
    """A bound divided and floored; an infinite one stays infinite (Python's floor division
    makes it NaN, which no comparison would catch)."""
    return bound if math.isinf(bound) else bound // divisor


def _period(lo: float, hi: float, divisor: int) -> int | None:
    """k where every value in [lo, hi] lies in [k * divisor, (k + 1) * divisor), else None."""
    if math.isinf(lo) or math.isinf(hi) or lo // divisor != hi // divisor:
        return None
    return int(lo // divisor)


def _split(index: Index, divisor: int) -> tuple[Index, Index]:
    """index = quotient * divisor + rest, taking every term divisible by `divisor` into quotient."""
    q_const, r_const = divmod(index.const, divisor)
    quotient = Index(tuple((a, c // divisor) for a, c in index.terms if c % divisor == 0), q_const)
    rest = Index(tuple((a, c) for a, c in index.terms if c % divisor), r_const)
    return quotient, rest


def _lone_atom(index: Index, kind: type) -> IndexAtom | None:
    """The atom of `index` if it is exactly one atom of type `kind` (coefficient 1, no constant)."""
    if index.const == 0 and len(index.terms) == 1 and index.terms[0][1] == 1 and type(index.terms[0][0]) is kind:
        return index.terms[0][0]
    return None


def floordiv(index: Index, divisor: int, extents: tuple[int, ...], ranges: Ranges | None = None) -> Index:
    """index // divisor over a domain of `extents` (dims within `ranges` where given, which may
    be narrower). The terms divisible by the divisor leave the division (floor((q*d + r) / d)
    is q + floor(r / d) for any integer q); what is left divides to a constant where it stays
    within one multiple of the divisor, and a division of a division is one division."""
    if divisor == 1:
        return index
    quotient, rest = _split(index, divisor)
    k = _period(*bounds_in(rest, ranges or dim_ranges(extents)), divisor)
    if k is not None:
        return quotient + k
    inner = _lone_atom(rest, Div)
    atom = Div(inner.index, inner.divisor * divisor) if inner is not None else Div(rest, divisor)
    return quotient + Index.of(atom)


def mod(index: Index, divisor: int, extents: tuple[int, ...], ranges: Ranges | None = None) -> Index:
    """index % divisor, simplified the same way: the terms divisible by the divisor drop out,
    what is left within one multiple of the divisor is that multiple subtracted, and a modulus
    of a modulus by a multiple of the divisor is one modulus."""
    _, rest = _split(index, divisor)
    k = _period(*bounds_in(rest, ranges or dim_ranges(extents)), divisor)
    if k is not None:
        return rest + -k * divisor
    inner = _lone_atom(rest, Mod)
    if inner is not None and inner.divisor % divisor == 0:
        return mod(inner.index, divisor, extents, ranges)
    return Index.of(Mod(rest, divisor))


Bound = tuple[Index, int, int]  # lo <= index < hi


def narrowed(ranges: Ranges, mask: Sequence[Bound]) -> Ranges | None:
    """The dims' ranges where every bound of `mask` holds: each bound narrows the range of each
    of its dims from the others' ranges (twice over, so a bound narrowed by another passes it
    on). None where the bounds cannot all hold."""
    found = list(ranges)
    for _ in range(2):
        for index, lo, hi in mask:
            for k, (atom, c) in enumerate(index.terms):
                if not isinstance(atom, Dim):
                    continue
                others_lo, others_hi = bounds_in(Index(index.terms[:k] + index.terms[k + 1:], index.const), found)
                if math.isinf(others_lo) or math.isinf(others_hi):
                    continue
                # lo <= c * x + others <= hi - 1, for the others' extremes
                a, b = lo - int(others_hi), hi - 1 - int(others_lo)
                x_lo, x_hi = (-(-a // c), b // c) if c > 0 else (-(-b // c), a // c)
                x_lo, x_hi = max(found[atom.k][0], x_lo), min(found[atom.k][1], x_hi)
                if x_lo > x_hi:
                    return None
                found[atom.k] = (x_lo, x_hi)
    return tuple(found)


def simplified(index: Index, extents: tuple[int, ...], ranges: Ranges) -> Index:
    """`index` rebuilt for dims within `ranges` (narrower than the domain of `extents`, as under
    a mask): a dim held to one value becomes that value, and every division and modulus is
    simplified again with the narrower ranges. Equal to `index` wherever the dims lie in
    `ranges`."""
    out = Index((), index.const)
    for atom, c in index.terms:
        if isinstance(atom, Dim):
            lo, hi = ranges[atom.k]
            term = Index((), lo) if lo == hi else Index.of(atom)
        elif isinstance(atom, Div):
            term = floordiv(simplified(atom.index, extents, ranges), atom.divisor, extents, ranges)
        elif isinstance(atom, Mod):
            term = mod(simplified(atom.index, extents, ranges), atom.divisor, extents, ranges)
        elif isinstance(atom, Clamp):
            inner = simplified(atom.index, extents, ranges)
            lo, hi = bounds_in(inner, ranges)
            term = inner if 0 <= lo and hi < atom.size else Index.of(Clamp(inner, atom.size))
        else:
            term = Index.of(atom)
        out = out + term * c
    return out


def simplified_bound(bound: Bound, ranges: Ranges) -> Bound | None:
    """An equivalent bound over fewer dims where the index steps in multiples: lo <= d*q + r < hi
    with r always in [0, d) and lo, hi multiples of d holds exactly where lo/d <= q < hi/d (a
    concatenation's piece test on a reshaped dim becomes a test of the outer dim alone), and a
    bound on a division a bound on what is divided. None where the bound always holds."""
    index, lo, hi = bound
    while True:
        low, high = bounds_in(index, ranges)
        if lo <= low and high < hi:
            return None
        inner = _lone_atom(Index(index.terms), Div)
        if inner is not None:  # lo <= x // d + c < hi exactly where d * (lo - c) <= x < d * (hi - c)
            d = inner.divisor
            index, lo, hi = inner.index, d * (lo - index.const), d * (hi - index.const)
            continue
        for d in sorted({abs(c) for _, c in index.terms if abs(c) > 1}, reverse=True):
            if lo % d or hi % d:
                continue
            quotient, rest = _split(index, d)
            if _period(*bounds_in(rest, ranges), d) == 0:
                index, lo, hi = quotient, lo // d, hi // d
                break
        else:
            return index, lo, hi


# --- scalar expressions ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Load(_Node):
    """Element `index` of input buffer `input`; where `mask` fails, the value `other` instead.

    `mask` lists (index, lo, hi) bounds that must all hold (pad, concatenate); backends must not
    touch memory when they fail.
    """

    input: int
    index: tuple[Index, ...]
    dtype: DType
    mask: tuple[tuple[Index, int, int], ...] = ()
    other: Any = 0


@dataclass(frozen=True, eq=False)
class Const(_Node):
    value: Any
    dtype: DType

    def identity(self) -> tuple:
        """Its fields and, for a float, its sign: Python finds 0.0 and -0.0 equal, but x * 0.0
        and x * -0.0 are not the same value (compared by fields alone, lowering gave both the
        first one's expression)."""
        if self.dtype.is_float:
            return self.value, self.dtype, math.copysign(1.0, float(self.value))
        return self.value, self.dtype


@dataclass(frozen=True, eq=False)
class Op(_Node):
    """An elementwise IR primitive applied to scalar expressions."""

    primitive: str
    args: tuple["Expr", ...]
    dtype: DType
    params: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, eq=False)
class IndexValue(_Node):
    """An index expression used as a value (iota)."""

    index: Index
    dtype: DType


@dataclass(frozen=True, eq=False)
class InBounds(_Node):
    """True where every (index, lo, hi) bound holds: selects between pad/concatenate pieces."""

    mask: tuple[tuple[Index, int, int], ...]
    dtype: DType


@dataclass(frozen=True, eq=False)
class RowValue(_Node):
    """The result of reduction `k` for the current row."""

    k: int
    dtype: DType


Expr = Union[Load, Const, Op, IndexValue, InBounds, RowValue]

_LEAVES = frozenset({Dim, Const, RowValue})  # nodes whose fields hold no other nodes


# --- kernels --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    """Folds `value` (element level) over the reduce dims with `op` in dtype `dtype`.

    op is sum | prod | max | min | argmax | argmin; arg-reductions produce the position along
    the single reduce dim.
    """

    op: str
    value: Expr
    dtype: DType


@dataclass(frozen=True)
class Store:
    """Write `value` to output `output` at `index`; `level` is "element" or "row".

    mode "set" writes; mode "add" accumulates (scatter_add), skipping points where `mask` fails.
    """

    output: int
    value: Expr
    level: str
    index: tuple[Index, ...]
    mode: str = "set"
    mask: tuple[tuple[Index, int, int], ...] = ()


@dataclass(frozen=True)
class Buffer:
    """A kernel operand: the Graph value it holds and its type."""

    value_id: int
    type: TensorType


@dataclass(frozen=True)
class Kernel:
    """One fused kernel. `kind` is pointwise | reduction | contraction | data | call | attention.

    `init` names an input whose contents output 0 starts from before the stores run (scatter).
    `ops` lists the fused primitives, for names and dumps. `precision` is a contraction's
    ("default" | "high" | "highest": whether a backend may round float32 operands to TF32).
    A "call" kernel is one equation of an opaque primitive (control flow, a print), held in
    `call`, which the backend runs by its rule (`glue.scheduler.calls`); it has no domain,
    reductions or stores. An "attention" kernel is the same for an attention or attention_bwd
    equation that a backend runs as a kernel of its own (FlashAttention's).
    """

    name: str
    kind: str
    parallel: tuple[int, ...]
    reduce: tuple[int, ...]
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    reductions: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    ops: tuple[str, ...]
    init: int | None = None
    source: tuple[str, ...] = field(default=())
    precision: str | None = None
    call: Any = None

    @property
    def allows_tf32(self) -> bool:
        """Whether a backend may round this contraction's float32 operands to TF32: any precision
        but "highest"; one that records none is exact, as an attention equation's is."""
        return self.precision not in (None, "highest")

    @property
    def rank(self) -> int:
        return len(self.parallel) + len(self.reduce)

    @property
    def roots(self) -> list[Expr]:
        """What the kernel computes: its reductions' values and its stores' values."""
        return [r.value for r in self.reductions] + [s.value for s in self.stores]

    def __str__(self) -> str:
        from glue.scheduler.kernel_text import kernel_text

        return kernel_text(self)


# --- walking expressions ---------------------------------------------------------------------

def indices_of(e: Expr) -> list[Index]:
    """The index expressions `e` reads at (a load's index and mask, a bound's, an iota's)."""
    if isinstance(e, Load):
        return list(e.index) + [i for i, _, _ in e.mask]
    if isinstance(e, InBounds):
        return [i for i, _, _ in e.mask]
    if isinstance(e, IndexValue):
        return [e.index]
    return []


def children(e: Expr) -> list[Expr]:
    """The expressions `e` computes from: operands, and data-dependent indices."""
    out = list(e.args) if isinstance(e, Op) else []
    stack = indices_of(e)
    while stack:
        for atom, _ in stack.pop().terms:
            if isinstance(atom, FromValue):
                out.append(atom.value)
            elif isinstance(atom, (Div, Mod, Clamp)):
                stack.append(atom.index)
    return out


def subexpressions(exprs: Iterable[Expr], found: set[Expr] | None = None) -> Iterator[Expr]:
    """Every expression `exprs` compute from, themselves included, each once; skips (and adds
    to `found`) expressions already visited."""
    found = set() if found is None else found
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e in found:
            continue
        found.add(e)
        yield e
        stack.extend(children(e))


def loads_under(exprs: Iterable[Expr], found: set[Expr] | None = None) -> list[Load]:
    """The loads `exprs` read, skipping (and adding to `found`) expressions already visited."""
    return [e for e in subexpressions(exprs, found) if isinstance(e, Load)]


def index_values(indices: Iterable[Index]) -> list[Expr]:
    """The data-dependent values `indices` read, left to right (the order their text and their
    code name them in)."""
    found: list[Expr] = []
    stack: list[Any] = list(indices)[::-1]
    while stack:
        item = stack.pop()
        if isinstance(item, Index):
            stack.extend(atom for atom, _ in reversed(item.terms))
        elif isinstance(item, FromValue):
            found.append(item.value)
        elif isinstance(item, (Div, Mod, Clamp)):
            stack.append(item.index)
    return found


def operands(e: Expr) -> list[Expr]:
    """What `e` is computed from, in the order a recursive evaluator reaches them: an op's
    arguments, or the values a load, bound or iota index reads."""
    return list(e.args) if isinstance(e, Op) else index_values(indices_of(e))


def rewrite_values(kernel: Kernel, rule: Callable[[Expr], Expr]) -> Kernel:
    """The kernel with every expression its reductions and stores compute through op operands
    rebuilt bottom-up: an op whose operands were rewritten is made again from them, then
    `rule` gives what each node becomes (itself, to keep it). Expressions inside indices (a
    gather's) are left as they are."""
    memo: dict[Expr, Expr] = {}

    def value(root: Expr) -> Expr:
        for node in postorder(root, lambda n: n.args if isinstance(n, Op) else (), memo):
            made = node
            if isinstance(node, Op):
                args = tuple(memo[a] for a in node.args)
                if any(new is not old for new, old in zip(args, node.args)):
                    made = replace(node, args=args)
            memo[node] = rule(made)
        return memo[root]

    return replace(kernel, reductions=tuple(replace(r, value=value(r.value)) for r in kernel.reductions),
                   stores=tuple(replace(st, value=value(st.value)) for st in kernel.stores))


def postorder(root: Any, needs: Callable[[Any], Sequence[Any]], done: Container[Any]) -> Iterator[Any]:
    """The nodes below `root` (itself last) that are not in `done`, each after what it `needs`,
    in the order a recursive walk would finish them, but with an explicit stack. The caller puts
    each node it is given into `done` before asking for the next."""
    if root in done:
        return
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if node in done:
            continue
        if expanded:
            yield node
            continue
        stack.append((node, True))
        stack.extend((n, False) for n in reversed(needs(node)) if n not in done)
