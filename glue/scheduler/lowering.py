"""Lowering a fusion group (a set of Graph equations) into one Kernel.

The group's domain comes from what it holds: a dot_general's output and contracting dims, the
rows and reduced dims shared by its reductions, a scatter's updates, or else its outputs' shape.
Each value is then expressed at a domain index by walking back through the equations with
per-primitive index rules (`INDEX_RULES`). A rule has two halves:

- `reads`: the cheap half, which says at which index (and under which mask) each operand is read
  when the equation's value is needed at a given index: elementwise ops read their operands at
  the same index, layout ops rewrite the index, gather reads through a data-dependent index;
- `build`: the expression of the value, from the expressions of those reads.

`SiteWalk` follows only the `reads` halves: which values a group evaluates at which indices and
which it reads from memory. The fuser decides legality with it without building expressions
(`glue.scheduler.fusion`); `lower_group` builds the Kernel of a final group with both halves.
A group that cannot be expressed raises `FusionRefused` with the reason, from the same checks in
both. Both walk with explicit stacks, so a chain of any length lowers without recursion.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from glue.ir import PRIMITIVES, Eqn, Literal, RuleTable, TensorType, Var, primitive
from glue.ir.core import Atom, strides
from glue.ir.printer import format_param
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import (Buffer, Clamp, Const, Dim, Div, Expr, FromValue, InBounds, Index,
                                      IndexValue, Kernel, Load, Mod, Op, Reduction, RowValue, Store,
                                      dim_ranges, floordiv, index_bounds, mod, narrowed, simplified,
                                      simplified_bound)

Mask = tuple[tuple[Index, int, int], ...]
Place = tuple[tuple[Index, ...], Mask]  # an index and the mask it is read under
Read = tuple[Atom, tuple[Index, ...], Mask]  # an operand read at a place
Key = tuple[int, tuple[Index, ...], Mask]  # a value at a place: what a walk visits once

# Data-dependent indices and reshapes that do not line up nest index expressions; deeper
# nesting than this is refused (every walk over an index is bounded by it).
MAX_INDEX_DEPTH = 24


class FusionRefused(Exception):
    """These equations cannot form one kernel; the message says why."""


def accumulator(dtype: dt.DType) -> dt.DType:
    """The dtype sums and products run in: float32 for 16-bit floats."""
    return dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype


def reduced_axes(eqn: Eqn) -> tuple[int, ...]:
    params = eqn.param_dict
    return tuple(sorted(params["axes"])) if "axes" in params else (params["axis"],)


def row_signature(eqn: Eqn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What reductions fused into one kernel must share: the reduced shape and axes."""
    return eqn.inputs[0].type.shape, reduced_axes(eqn)


@dataclass(frozen=True)
class Domain:
    kind: str
    parallel: tuple[int, ...]
    reduce: tuple[int, ...]
    element_shape: tuple[int, ...] | None  # shape of element-level values, if the kernel has them
    element_index: tuple[Index, ...] = ()  # where element-level values sit in the domain
    reduced_axes: tuple[int, ...] = ()  # axes of element_shape that the reductions fold

    @property
    def row_index(self) -> tuple[Index, ...]:
        return tuple(Index.dim(k) for k in range(len(self.parallel)))

    @property
    def extents(self) -> tuple[int, ...]:
        return self.parallel + self.reduce


CONTENTS_REFUSAL = "a kernel holds one contraction, one scatter, or reductions over one row shape"


def check_contents(dots: int, scatters: int, reductions: int) -> None:
    if dots + scatters + bool(reductions) > 1 or dots > 1 or scatters > 1:
        raise FusionRefused(CONTENTS_REFUSAL)


def kernel_domain(dot: Eqn | None, scatter: Eqn | None, reduction: Eqn | None,
                  output_shapes: Iterable[tuple[int, ...]]) -> Domain:
    """The domain of a kernel holding `dot`, `scatter` or reductions like `reduction` (at most
    one of them; see `check_contents`) and writing outputs of `output_shapes`."""
    if dot is not None:
        (lhs, _), ((lc, _), _) = dot.inputs, dot.param_dict["dimension_numbers"]
        return Domain("contraction", dot.outvars[0].type.shape, tuple(lhs.type.shape[a] for a in lc), None)
    if scatter is not None:
        return _element_domain("data", scatter.inputs[2].type.shape)
    if reduction is not None:
        return _reduction_domain(*row_signature(reduction))
    shapes = set(output_shapes)
    if len(shapes) != 1:
        raise FusionRefused(f"outputs of different shapes {sorted(shapes)}")
    return _element_domain("pointwise", shapes.pop())


# Fusion asks for the domain of every group it tries an equation in, mostly of a few shapes.
@functools.lru_cache(maxsize=1 << 10)
def _element_domain(kind: str, shape: tuple[int, ...]) -> Domain:
    return Domain(kind, shape, (), shape, tuple(Index.dim(k) for k in range(len(shape))))


@functools.lru_cache(maxsize=1 << 10)
def _reduction_domain(shape: tuple[int, ...], axes: tuple[int, ...]) -> Domain:
    kept = [a for a in range(len(shape)) if a not in axes]
    where = {a: Index.dim(i) for i, a in enumerate(kept)}
    where.update({a: Index.dim(len(kept) + i) for i, a in enumerate(axes)})
    return Domain("reduction", tuple(shape[a] for a in kept), tuple(shape[a] for a in axes),
                  shape, tuple(where[a] for a in range(len(shape))), axes)


def _domain(eqns: Sequence[Eqn], outputs: Sequence[Var]) -> Domain:
    dots = [e for e in eqns if e.primitive == "dot_general"]
    reductions = [e for e in eqns if primitive(e.primitive).fold]
    scatters = [e for e in eqns if e.primitive == "scatter_add"]
    check_contents(len(dots), len(scatters), len(reductions))
    for r in reductions[1:]:
        if row_signature(r) != row_signature(reductions[0]):
            raise FusionRefused("reductions over different rows")
    return kernel_domain(dots[0] if dots else None, scatters[0] if scatters else None,
                         reductions[0] if reductions else None, (v.type.shape for v in outputs))


# --- indices ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Picked:
    """Stands, inside `FromValue`, for the value of `atom` read at `index` under `mask`: what a
    gather's index operand picks. A walk that builds expressions replaces it by that value's
    expression (`Lowerer.resolve`); a walk that only follows reads keeps it."""

    atom: Atom
    index: tuple[Index, ...]
    mask: Mask


def key_of(atom: Var, index: tuple[Index, ...], mask: Mask) -> Key:
    """The place a walk visits `atom` at: a scalar is the same value at every index."""
    return atom.id, index if atom.type.ndim else (), mask


def _dims(index: Index) -> list[Dim]:
    out = []
    for atom, _ in index.terms:
        out.extend([atom] if isinstance(atom, Dim) else
                   _dims(atom.index) if isinstance(atom, (Div, Mod, Clamp)) else [])
    return out


def _data_dependent(index: tuple[Index, ...]) -> bool:
    return any(isinstance(a, FromValue) for i in index for a, _ in i.terms)


def index_depth(index: Index) -> int:
    """How deeply `index` nests index expressions (through div, mod, clamp and picked values)."""
    depth = 0
    for atom, _ in index.terms:
        if isinstance(atom, (Div, Mod, Clamp)):
            depth = max(depth, 1 + index_depth(atom.index))
        elif isinstance(atom, FromValue) and isinstance(atom.value, Picked):
            inner = atom.value.index + tuple(i for i, _, _ in atom.value.mask)
            depth = max(depth, 1 + max(map(index_depth, inner), default=0))
        elif isinstance(atom, FromValue):
            depth = max(depth, 1)
    return depth


def _check_depth(eqn: Eqn, reads: list[Read], index: tuple[Index, ...], mask: Mask) -> None:
    for _, at, under in reads:
        if at is index and under is mask:
            continue  # as deep as the place the value itself is needed at
        for i in at + tuple(m for m, _, _ in under):
            if index_depth(i) > MAX_INDEX_DEPTH:
                raise FusionRefused(f"the index {eqn.primitive} reads its operand at nests more than "
                                    f"{MAX_INDEX_DEPTH} levels deep")


def _check_no_recompute(domain: Domain, eqn: Eqn, index: tuple[Index, ...]) -> None:
    """Expensive work runs once per point it is needed at: its index must use every parallel
    dim, or only outer ones (then it is hoisted out of the inner loops)."""
    used = {a.k for i in index for a in _dims(i)}
    p = len(domain.parallel)
    if used >= set(range(p)) or used == set(range(len(used))) or _data_dependent(index):
        return
    raise FusionRefused(f"{eqn.primitive} of {eqn.outvars[0].type} would be recomputed for every "
                        f"point of a kernel over {domain.parallel + domain.reduce}")


def check_site(domain: Domain, eqn: Eqn, index: tuple[Index, ...]) -> None:
    """Whether the value of `eqn` may be computed at `index` inside a kernel over `domain`."""
    if primitive(eqn.primitive).expensive:
        _check_no_recompute(domain, eqn, index)
    if eqn.primitive not in INDEX_RULES:  # scatter_add: complete only when its kernel ends
        raise FusionRefused(f"the result of {eqn.primitive} cannot be read in its own kernel")


# --- the index rules ----------------------------------------------------------------------------

ReadsRule = Callable[[Domain, Eqn, tuple[Index, ...], Mask], list[Read]]
BuildRule = Callable[["Lowerer", Eqn, tuple[Index, ...], Mask, list[Read], list[Expr]], Expr]


@dataclass(frozen=True)
class IndexRule:
    """How a primitive's value at an index is made: which operand reads (the cheap half, shared
    by legality checks and lowering) and the expression built from them."""

    reads: ReadsRule
    build: BuildRule


def _same_index(domain, eqn, index, mask) -> list[Read]:
    return [(a, index, mask) for a in eqn.inputs]


def _apply_op(lw, eqn, index, mask, reads, values) -> Expr:
    return Op(eqn.primitive, tuple(values), eqn.outvars[0].type.dtype, eqn.params)


def _operand_value(lw, eqn, index, mask, reads, values) -> Expr:
    """The value of the (last) operand read: layout changes and gathers compute nothing."""
    return values[-1]


def _broadcast_reads(domain, eqn, index, mask) -> list[Read]:
    (x,), p = eqn.inputs, eqn.param_dict
    shape = p["shape"]
    inner = tuple(index[d] if n == shape[d] else Index.zero() for n, d in zip(x.type.shape, p["dims"]))
    return [(x, inner, mask)]


def _transpose_reads(domain, eqn, index, mask) -> list[Read]:
    perm = eqn.param_dict["permutation"]
    inner = [Index.zero()] * len(perm)
    for i, p in enumerate(perm):
        inner[p] = index[i]
    return [(eqn.inputs[0], tuple(inner), mask)]


def _reshaped(index: tuple[Index, ...], out_shape: tuple[int, ...], in_shape: tuple[int, ...],
              extents: tuple[int, ...]) -> tuple[Index, ...]:
    """Where a reshape from `in_shape` to `out_shape` reads its operand for the value at `index`."""
    linear = Index()
    for i, s in zip(index, strides(out_shape)):
        linear = linear + i * s
    return tuple(mod(floordiv(linear, s, extents), n, extents) for s, n in zip(strides(in_shape), in_shape))


# The same reshapes are asked of the same indices again and again (each fusion trial, every
# layer of a model) and their floor-div/mod simplification is the dearest of the index rules.
# Only indices over the domain's dims are remembered: equal as kernel IR nodes means identical
# there (integer coefficients), which a picked value's float constants would not guarantee.
_reshaped_affine = functools.lru_cache(maxsize=1 << 14)(_reshaped)


def _over_dims(index: Index) -> bool:
    """Whether `index` is built of domain dims alone (through div, mod and clamp)."""
    return all(isinstance(a, Dim) or isinstance(a, (Div, Mod, Clamp)) and _over_dims(a.index)
               for a, _ in index.terms)


def _reshape_reads(domain, eqn, index, mask) -> list[Read]:
    x = eqn.inputs[0]
    if all(map(_over_dims, index)):
        # a tuple of its own: callers tell a read at the requested index itself by identity
        inner = tuple(iter(_reshaped_affine(index, eqn.outvars[0].type.shape, x.type.shape, domain.extents)))
    else:
        inner = _reshaped(index, eqn.outvars[0].type.shape, x.type.shape, domain.extents)
    return [(x, inner, mask)]


def _slice_reads(domain, eqn, index, mask) -> list[Read]:
    p = eqn.param_dict
    inner = tuple(i * st + lo for i, lo, st in zip(index, p["start"], p["strides"]))
    return [(eqn.inputs[0], inner, mask)]


def _within(domain: Domain, index: Index, n: int) -> bool:
    lo, hi = index_bounds(index, domain.extents)
    return 0 <= lo and hi < n


def _pad_reads(domain, eqn, index, mask) -> list[Read]:
    x, p = eqn.inputs[0], eqn.param_dict
    inner = tuple(i + (-lo) for i, lo in zip(index, p["low"]))
    bounds = tuple((i, 0, n) for i, n in zip(inner, x.type.shape) if not _within(domain, i, n))
    return [(x, inner, mask + bounds)]


def _pad_build(lw, eqn, index, mask, reads, values) -> Expr:
    bounds = reads[0][2][len(mask):]
    if not bounds:
        return values[0]
    dtype = eqn.inputs[0].type.dtype
    return Op("select", (in_bounds(bounds, lw.domain.extents), values[0], Const(eqn.param_dict["value"], dtype)),
              dtype)


def _concatenate_reads(domain, eqn, index, mask) -> list[Read]:
    d = eqn.param_dict["dimension"]
    reads, offset = [], 0
    for x in eqn.inputs:
        n = x.type.shape[d]
        shifted = index[:d] + (index[d] + (-offset),) + index[d + 1:]
        reads.append((x, shifted, mask + ((shifted[d], 0, n),)))
        offset += n
    return reads


def _concatenate_build(lw, eqn, index, mask, reads, values) -> Expr:
    result = values[-1]
    for (_, _, piece_mask), value in zip(reversed(reads[:-1]), reversed(values[:-1])):
        bound = piece_mask[len(mask):]
        result = Op("select", (in_bounds(bound, lw.domain.extents), value, result), value.dtype)
    return result


def _simplified_mask(mask: Mask, extents: tuple[int, ...]) -> Mask:
    """`mask` with each bound tested over as few dims as it can be (`simplified_bound`: a test
    of outer dims alone is one value per row) and the bounds that always hold left out."""
    return tuple(b for b in (simplified_bound(bound, dim_ranges(extents)) for bound in mask) if b is not None)


def in_bounds(mask: Mask, extents: tuple[int, ...]) -> Expr:
    """Whether every bound of `mask` holds."""
    bounds = _simplified_mask(mask, extents)
    return InBounds(bounds, dt.bool_) if bounds else Const(True, dt.bool_)


@functools.lru_cache(maxsize=1 << 14)
def input_load(slot: int, ty: TensorType, index: tuple[Index, ...], mask: Mask, extents: tuple[int, ...]) -> Expr:
    """The read of input `slot` (of type `ty`) at `index` under `mask`. A masked read's index
    only matters where the mask holds, so it is simplified for the dims' ranges there (a piece
    of a concatenation read through reshapes loses its divisions and moduli); where the index
    so simplified stays inside the buffer over the whole domain, the read needs no guard and
    becomes a plain load and a select (contiguous loads, which vectorise, instead of guarded
    gathers)."""
    if not mask:
        return Load(slot, index, ty.dtype)
    ranges = narrowed(dim_ranges(extents), mask)
    if ranges is None:  # the mask never holds
        return Const(0, ty.dtype)
    index = tuple(simplified(i, extents, ranges) for i in index)
    if all(0 <= lo and hi < n for (lo, hi), n in zip((index_bounds(i, extents) for i in index), ty.shape)):
        return Op("select", (in_bounds(mask, extents), Load(slot, index, ty.dtype), Const(0, ty.dtype)), ty.dtype)
    return Load(slot, index, ty.dtype, _simplified_mask(mask, extents))


def _iota_build(lw, eqn, index, mask, reads, values) -> Expr:
    return IndexValue(index[eqn.param_dict["dimension"]], eqn.outvars[0].type.dtype)


def _no_reads(domain, eqn, index, mask) -> list[Read]:
    return []


def gather_reads(eqn: Eqn, index: tuple[Index, ...], mask: Mask, clamp: bool) -> tuple[Read, tuple[Index, ...], Index]:
    """For a gather (or scatter) at `index`: the read of its indices operand, the index into the
    gathered (scattered) array, and the position along its axis, which holds the picked value."""
    x, idx = eqn.inputs[0], eqn.inputs[1]
    axis, b = eqn.param_dict["axis"], eqn.param_dict["batch_dims"]
    n_idx = idx.type.ndim - b
    picked: Read = (idx, tuple(index[:b]) + tuple(index[axis:axis + n_idx]), mask)
    at = Index.of(FromValue(Picked(*picked)))
    if clamp:
        at = Index.of(Clamp(at, x.type.shape[axis]))
    return picked, tuple(index[:axis]) + (at,) + tuple(index[axis + n_idx:]), at


def _gather_reads(domain, eqn, index, mask) -> list[Read]:
    picked, inner, _ = gather_reads(eqn, index, mask, clamp=True)
    return [picked, (eqn.inputs[0], inner, mask)]


def _row_result_reads(domain, eqn, index, mask) -> list[Read]:
    """A reduction's (or contraction's) result exists only at the current row."""
    if index != domain.row_index:
        raise FusionRefused(f"the result of {eqn.primitive} is used at another row than its own")
    return []


def _row_result_build(lw, eqn, index, mask, reads, values) -> Expr:
    return lw.row_value(eqn)


_ELEMENTWISE = IndexRule(_same_index, _apply_op)
_ROW_RESULT = IndexRule(_row_result_reads, _row_result_build)

# Every primitive but scatter_add, whose result is complete only when its kernel ends, and the
# opaque ones, which are kernels of their own (glue.scheduler.calls).
INDEX_RULES = RuleTable("index", lambda p: p.name != "scatter_add" and not p.opaque)
INDEX_RULES.update({
    "broadcast_in_dim": IndexRule(_broadcast_reads, _operand_value),
    "transpose": IndexRule(_transpose_reads, _operand_value),
    "reshape": IndexRule(_reshape_reads, _operand_value),
    "slice": IndexRule(_slice_reads, _operand_value),
    "pad": IndexRule(_pad_reads, _pad_build),
    "concatenate": IndexRule(_concatenate_reads, _concatenate_build),
    "iota": IndexRule(_no_reads, _iota_build),
    "gather": IndexRule(_gather_reads, _operand_value),
    "dot_general": _ROW_RESULT,
    **{name: _ROW_RESULT for name, prim in PRIMITIVES.items() if prim.fold},
    **{name: _ELEMENTWISE for name, prim in PRIMITIVES.items() if prim.kind == "elementwise"},
})


def operand_reads(domain: Domain, eqn: Eqn, index: tuple[Index, ...], mask: Mask) -> list[Read]:
    """The checked reads of `eqn`'s operands when its value is needed at `index`."""
    check_site(domain, eqn, index)
    reads = INDEX_RULES[eqn.primitive].reads(domain, eqn, index, mask)
    _check_depth(eqn, reads, index, mask)
    return reads


# --- what a kernel computes first: its contraction or reductions, and its stores --------------

def contraction_reads(domain: Domain, eqn: Eqn) -> list[Read]:
    """Where a contraction reads its two operands in its kernel's domain."""
    (lhs, rhs), ((lc, rc), (lb, rb)) = eqn.inputs, eqn.param_dict["dimension_numbers"]
    p = len(domain.parallel)
    lfree = [a for a in range(lhs.type.ndim) if a not in lc + lb]
    rfree = [a for a in range(rhs.type.ndim) if a not in rc + rb]

    def operand_index(ndim, contract, batch, free, free_start):
        where = {a: Index.dim(i) for i, a in enumerate(batch)}
        where.update({a: Index.dim(p + i) for i, a in enumerate(contract)})
        where.update({a: Index.dim(free_start + i) for i, a in enumerate(free)})
        return tuple(where[a] for a in range(ndim))

    return [(lhs, operand_index(lhs.type.ndim, lc, lb, lfree, len(lb)), ()),
            (rhs, operand_index(rhs.type.ndim, rc, rb, rfree, len(lb) + len(lfree)), ())]


def reduction_read(domain: Domain, eqn: Eqn) -> Read:
    return eqn.inputs[0], domain.element_index, ()


def placement(domain: Domain, var: Var) -> tuple[str, tuple[Index, ...]]:
    """Where output `var` is stored: at the row or element level, and at which index."""
    shape = var.type.shape
    if domain.kind != "pointwise" and shape == domain.parallel and \
            (domain.kind == "contraction" or len(domain.reduce)):
        return "row", domain.row_index
    if shape == domain.element_shape:
        return "element", domain.element_index
    if domain.reduced_axes and shape == tuple(1 if a in domain.reduced_axes else n
                                              for a, n in enumerate(domain.element_shape)):
        # A row value kept with its reduced axes as size 1 (keepdims=True).
        return "row", tuple(Index.zero() if a in domain.reduced_axes else i
                            for a, i in enumerate(domain.element_index))
    raise FusionRefused(f"an output of shape {shape} does not fit a kernel over {domain.parallel}"
                        f"{' x ' + str(domain.reduce) if domain.reduce else ''}")


def check_scatter_target(eqn: Eqn, defined: Mapping[int, Eqn]) -> None:
    """A scatter_add's kernel starts from the array it adds into, so that array is an input."""
    target = eqn.inputs[0]
    if not isinstance(target, Var) or target.id in defined:
        raise FusionRefused("the array a scatter_add adds into must come from memory")


def scatter_reads(domain: Domain, eqn: Eqn) -> tuple[Read, Read, tuple[Index, ...], Mask]:
    """A scatter_add's store: the read of its indices, the read of its updates, the index it adds
    at and the bound that index must keep."""
    target_array = eqn.inputs[0]
    index = domain.element_index
    picked, target, at = gather_reads(eqn, index, (), clamp=False)
    bound = ((at, 0, target_array.type.shape[eqn.param_dict["axis"]]),)
    return picked, (eqn.inputs[2], index, ()), target, bound


def root_reads(domain: Domain, eqns: Iterable[Eqn], outputs: Sequence[Var], defined: Mapping[int, Eqn]) -> list[Read]:
    """Every read a kernel over `domain` starts from: its contraction's operands, its reductions'
    inputs, and its outputs at the places they are stored, in the order lowering makes them."""
    reads: list[Read] = []
    for eqn in eqns:
        if eqn.primitive == "dot_general":
            reads.extend(contraction_reads(domain, eqn))
        elif primitive(eqn.primitive).fold:
            reads.append(reduction_read(domain, eqn))
    for var in outputs:
        producer = defined.get(var.id)
        if producer is not None and producer.primitive == "scatter_add":
            check_scatter_target(producer, defined)
            picked, updates, _, _ = scatter_reads(domain, producer)
            reads.extend([picked, updates])
        else:
            reads.append((var, placement(domain, var)[1], ()))
    return reads


# --- walks ------------------------------------------------------------------------------------

class SiteWalk:
    """Which values a kernel over `domain` computes at which places (`sites`), and where it reads
    each value from memory (`reads`: value id -> places), following only the `reads` halves of
    the index rules. `defined` maps the values the kernel computes to their equations. A walk may
    extend a `base` walk: it then records only what the base does not already hold."""

    def __init__(self, domain: Domain, defined: Mapping[int, Eqn], base: "SiteWalk | None" = None):
        self.domain = domain
        self.defined = defined
        self.base = base
        self.sites: set[Key] = set()
        # value id -> places, in the order they are found (a dict as an ordered set, so that
        # what follows them, refusals included, comes out the same on every run)
        self.reads: dict[int, dict[Place, None]] = {}

    def visited(self, key: Key) -> bool:
        return key in self.sites or (self.base is not None and self.base.visited(key))

    def visit(self, requests: Sequence[Read]) -> None:
        """Follow `requests` (and what they read) in lowering's order; FusionRefused if some value
        cannot be computed where it is needed."""
        stack = list(reversed(requests))
        while stack:
            atom, index, mask = stack.pop()
            if isinstance(atom, Literal):
                continue
            key = key_of(atom, index, mask)
            eqn = self.defined.get(atom.id)
            if eqn is None:
                self.reads.setdefault(atom.id, {})[key[1:]] = None
                continue
            if key in self.sites or self.base is not None and self.base.visited(key):  # (`visited`, inlined)
                continue
            self.sites.add(key)
            stack.extend(reversed(operand_reads(self.domain, eqn, key[1], mask)))

    def absorb(self, other: "SiteWalk") -> None:
        """Take in what `other` (a walk extending this one) found."""
        self.sites |= other.sites
        for vid, places in other.reads.items():
            self.reads.setdefault(vid, {}).update(places)


class Lowerer:
    """Builds the expressions of one kernel: the same walk as `SiteWalk`, with each rule's
    `build` half applied once a value's reads are built (an explicit stack, in the order a
    recursive walk would visit them, so input slots and shared subexpressions come out the same
    however long the chain)."""

    def __init__(self, eqns: Sequence[Eqn], domain: Domain):
        self.domain = domain
        self.defined: dict[int, Eqn] = {v.id: e for e in eqns for v in e.outvars}
        self.inputs: list[Buffer] = []
        self.input_slot: dict[int, int] = {}
        self.reductions: list[Reduction] = []
        self.row_slot: dict[int, int] = {}
        self.memo: dict[Key, Expr] = {}

    def input(self, var: Var) -> int:
        if var.id not in self.input_slot:
            self.input_slot[var.id] = len(self.inputs)
            self.inputs.append(Buffer(var.id, var.type))
        return self.input_slot[var.id]

    def built(self, atom: Atom, index: tuple[Index, ...], mask: Mask) -> Expr:
        """The expression of a read already built."""
        if isinstance(atom, Literal):
            return Const(atom.value, atom.type.dtype)
        return self.memo[key_of(atom, index, mask)]

    def resolve(self, index: Index) -> Index:
        """`index` with each picked value replaced by its (built) expression."""
        terms, changed = [], False
        for atom, c in index.terms:
            new = atom
            if isinstance(atom, FromValue) and isinstance(atom.value, Picked):
                new = FromValue(self.built(atom.value.atom, atom.value.index, atom.value.mask))
            elif isinstance(atom, (Div, Mod, Clamp)):
                inner = self.resolve(atom.index)
                if inner is not atom.index:
                    new = replace(atom, index=inner)
            changed = changed or new is not atom
            terms.append((new, c))
        return Index(tuple(terms), index.const) if changed else index

    def resolve_read(self, read: Read) -> Read:
        atom, index, mask = read
        return (atom, tuple(map(self.resolve, index)),
                tuple((self.resolve(i), lo, hi) for i, lo, hi in mask))

    def value(self, atom: Atom, index: tuple[Index, ...], mask: Mask = ()) -> Expr:
        """The expression of `atom` at `index` under `mask`."""
        if isinstance(atom, Literal):
            return Const(atom.value, atom.type.dtype)
        root = key_of(atom, index, mask)
        # Each frame: the value's key, its equation, its reads (resolved as they are reached),
        # and how many of them are built.
        stack: list[list] = [[atom, root, None, None, 0]]
        while stack:
            frame = stack[-1]
            var, key, eqn, reads, done = frame
            if key in self.memo:
                stack.pop()
                continue
            if reads is None:
                eqn = self.defined.get(var.id)
                if eqn is None:
                    self.memo[key] = input_load(self.input(var), var.type, key[1], key[2], self.domain.extents)
                    stack.pop()
                    continue
                frame[2] = eqn
                frame[3] = reads = operand_reads(self.domain, eqn, key[1], key[2])
            if done < len(reads):
                # Reads are resolved only when reached: a gather's index into its array holds
                # the value its indices read, built just before.
                read = reads[done] = self.resolve_read(reads[done])
                frame[4] = done + 1
                operand, at, under = read
                if not isinstance(operand, Literal) and key_of(operand, at, under) not in self.memo:
                    stack.append([operand, key_of(operand, at, under), None, None, 0])
                continue
            values = [self.built(*r) for r in reads]
            self.memo[key] = INDEX_RULES[eqn.primitive].build(self, eqn, key[1], key[2], reads, values)
            stack.pop()
        return self.memo[root]

    def row_value(self, eqn: Eqn) -> Expr:
        """A reduction's (or contraction's) result at the current row."""
        k = self.row_slot[eqn.outvars[0].id]
        return _convert(RowValue(k, self.reductions[k].dtype), eqn.outvars[0].type.dtype)

    def add_reduction(self, eqn: Eqn, op: str, value: Expr, dtype: dt.DType) -> None:
        self.row_slot[eqn.outvars[0].id] = len(self.reductions)
        self.reductions.append(Reduction(op, value, dtype))


def _convert(value: Expr, dtype: dt.DType) -> Expr:
    return value if value.dtype == dtype else Op("convert_element_type", (value,), dtype,
                                                 (("new_dtype", dtype),))


def _add_contraction(lw: Lowerer, eqn: Eqn) -> None:
    acc = accumulator(eqn.outvars[0].type.dtype)
    left, right = (lw.value(*read) for read in contraction_reads(lw.domain, eqn))
    lw.add_reduction(eqn, "sum", Op("mul", (_convert(left, acc), _convert(right, acc)), acc), acc)


def _add_reduction(lw: Lowerer, eqn: Eqn) -> None:
    op = primitive(eqn.primitive).fold
    value = lw.value(*reduction_read(lw.domain, eqn))
    dtype = accumulator(value.dtype) if op in ("sum", "prod") else (
        eqn.param_dict["index_dtype"] if op.startswith("arg") else value.dtype)
    lw.add_reduction(eqn, op, value if op.startswith("arg") else _convert(value, dtype), dtype)


def _scatter_store(lw: Lowerer, eqn: Eqn, slot: int) -> Store:
    picked, updates, target, bound = scatter_reads(lw.domain, eqn)
    lw.value(*picked)
    target = tuple(map(lw.resolve, target))
    bound = tuple((lw.resolve(i), lo, hi) for i, lo, hi in bound)
    return Store(slot, lw.value(*updates), "element", target, "add", bound)


def _kernel_name(ops: Sequence[str], name: str) -> str:
    return f"{'_'.join(ops[:5])}_{name}"


def _sources(eqns: Sequence[Eqn]) -> tuple[str, ...]:
    """The user's source lines of a kernel's equations, each once."""
    return tuple(dict.fromkeys(e.source for e in eqns if e.source))


def lower_group(eqns: Sequence[Eqn], outputs: Sequence[Var], name: str) -> Kernel:
    """The Kernel computing `outputs` from the equations `eqns` (in topological order)."""
    scattered = {e.outvars[0].id for e in eqns if e.primitive == "scatter_add"}
    outputs = sorted(outputs, key=lambda v: v.id not in scattered)  # a scatter writes output 0
    domain = _domain(eqns, outputs)
    lw = Lowerer(eqns, domain)
    for eqn in eqns:
        if eqn.primitive == "dot_general":
            _add_contraction(lw, eqn)
        elif primitive(eqn.primitive).fold:
            _add_reduction(lw, eqn)
    stores, init = [], None
    for slot, var in enumerate(outputs):
        producer = lw.defined.get(var.id)
        if producer is not None and producer.primitive == "scatter_add":
            check_scatter_target(producer, lw.defined)
            stores.append(_scatter_store(lw, producer, slot))
            init = lw.input(producer.inputs[0])
            continue
        level, index = placement(domain, var)
        stores.append(Store(slot, lw.value(var, index), level, index))
    ops = tuple(dict.fromkeys(e.primitive for e in eqns if not primitive(e.primitive).moves_data_only)) or \
        tuple(dict.fromkeys(e.primitive for e in eqns))
    precision = next((e.param_dict.get("precision") for e in eqns if e.primitive == "dot_general"), None)
    return Kernel(_kernel_name(ops, name), domain.kind, domain.parallel, domain.reduce,
                  tuple(lw.inputs), tuple(Buffer(v.id, v.type) for v in outputs),
                  tuple(lw.reductions), tuple(stores), ops, init, _sources(eqns), precision)


def params_text(params: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, str], ...]:
    """An equation's params in their lossless text form."""
    return tuple((key, format_param(value)) for key, value in params)


def group_shape(eqns: Sequence[Eqn], outputs: Sequence[Var],
                text: Callable[[tuple], tuple] = params_text) -> tuple[tuple, list[int]]:
    """A group of equations up to the ids of its values: each equation's primitive, params (in
    their lossless text form, `text`), operand types and which values it reads and makes, each
    value numbered by its first appearance, then which of them are the outputs. Also the value
    ids in that numbering."""
    number: dict[int, int] = {}
    ids: list[int] = []

    def slot(var: Var) -> int:
        if var.id not in number:
            number[var.id] = len(ids)
            ids.append(var.id)
        return number[var.id]

    parts: list[tuple] = []
    for e in eqns:
        args = tuple((slot(a), a.type) if isinstance(a, Var) else (str(a), a.type) for a in e.inputs)
        parts.append((e.primitive, text(e.params), args, tuple((slot(v), v.type) for v in e.outvars)))
    parts.append(tuple(slot(v) for v in outputs))
    return tuple(parts), ids


class GroupLowering:
    """`lower_group`, for the groups of one fusion: a group equal to an earlier one up to the
    ids of its values (each layer of a model makes the same kernels) gets the earlier kernel
    with its buffers' values, name and source lines replaced, instead of being lowered again.
    Kernel IR refers to buffers by position, so nothing else in a kernel names a value."""

    def __init__(self) -> None:
        self._lowered: dict[tuple, tuple[Kernel, list[int]]] = {}
        # id(params) -> (params, their text): equations share params objects (a recomputed copy
        # its original's, a layer's attention tiles the first layer's), kept so the id stays theirs
        self._texts: dict[int, tuple[tuple, tuple]] = {}

    def shape(self, eqns: Sequence[Eqn], outputs: Sequence[Var]) -> tuple[tuple, list[int]]:
        """`group_shape`, each params object written once."""
        return group_shape(eqns, outputs, self._text)

    def _text(self, params: tuple) -> tuple:
        found = self._texts.get(id(params))
        if found is None:
            found = self._texts[id(params)] = params, params_text(params)
        return found[1]

    def __call__(self, eqns: Sequence[Eqn], outputs: Sequence[Var], name: str) -> Kernel:
        shape, ids = self.shape(eqns, outputs)
        earlier = self._lowered.get(shape)
        if earlier is None:
            kernel = lower_group(eqns, outputs, name)
            self._lowered[shape] = (kernel, ids)
            return kernel
        kernel, earlier_ids = earlier
        renamed = dict(zip(earlier_ids, ids))
        return replace(kernel, name=_kernel_name(kernel.ops, name), source=_sources(eqns),
                       inputs=tuple(Buffer(renamed[b.value_id], b.type) for b in kernel.inputs),
                       outputs=tuple(Buffer(renamed[b.value_id], b.type) for b in kernel.outputs))
