"""Lowering a fusion group (a set of Graph equations) into one Kernel.

The group's domain comes from what it holds: a dot_general's output and contracting dims, the
rows and reduced dims shared by its reductions, a scatter's updates, or else its outputs' shape.
Each value is then expressed at a domain index by walking back through the equations with
per-primitive index rules (`INDEX_RULES`): elementwise ops apply to their operands at the same
index, layout ops rewrite the index, gather reads through a data-dependent index. A group that
cannot be expressed this way raises `FusionRefused` with the reason, and the fuser keeps the
equations apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from glue.ir import PRIMITIVES, Eqn, Literal, RuleTable, Var, primitive
from glue.ir.core import strides
from glue.ir import dtypes as dt
from glue.ir.core import Atom
from glue.scheduler.kernel_ir import (Buffer, Clamp, Const, Dim, Div, Expr, FromValue, InBounds, Index,
                                      IndexValue, Kernel, Load, Mod, Op, Reduction, RowValue, Store,
                                      floordiv, index_bounds, mod)

Mask = tuple[tuple[Index, int, int], ...]


class FusionRefused(Exception):
    """These equations cannot form one kernel; the message says why."""


def accumulator(dtype: dt.DType) -> dt.DType:
    """The dtype sums and products run in: float32 for 16-bit floats."""
    return dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype


def _reduced_axes(eqn: Eqn) -> tuple[int, ...]:
    params = eqn.param_dict
    return tuple(sorted(params["axes"])) if "axes" in params else (params["axis"],)


@dataclass
class _Domain:
    kind: str
    parallel: tuple[int, ...]
    reduce: tuple[int, ...]
    element_shape: tuple[int, ...] | None  # shape of element-level values, if the kernel has them
    element_index: tuple[Index, ...] = ()  # where element-level values sit in the domain
    reduced_axes: tuple[int, ...] = ()  # axes of element_shape that the reductions fold

    @property
    def row_index(self) -> tuple[Index, ...]:
        return tuple(Index.dim(k) for k in range(len(self.parallel)))


def _domain(eqns: Sequence[Eqn], outputs: Sequence[Var]) -> _Domain:
    dots = [e for e in eqns if e.primitive == "dot_general"]
    reductions = [e for e in eqns if primitive(e.primitive).fold]
    scatters = [e for e in eqns if e.primitive == "scatter_add"]
    if len(dots) + len(scatters) + bool(reductions) > 1 or len(dots) > 1 or len(scatters) > 1:
        raise FusionRefused("a kernel holds one contraction, one scatter, or reductions over one row shape")
    if dots:
        (lhs, _), ((lc, _), _) = dots[0].inputs, dots[0].param_dict["dimension_numbers"]
        return _Domain("contraction", dots[0].outvars[0].type.shape,
                       tuple(lhs.type.shape[a] for a in lc), None)
    if scatters:
        shape = scatters[0].inputs[2].type.shape
        return _Domain("data", shape, (), shape, tuple(Index.dim(k) for k in range(len(shape))))
    if reductions:
        shape, axes = reductions[0].inputs[0].type.shape, _reduced_axes(reductions[0])
        for r in reductions[1:]:
            if (r.inputs[0].type.shape, _reduced_axes(r)) != (shape, axes):
                raise FusionRefused("reductions over different rows")
        kept = [a for a in range(len(shape)) if a not in axes]
        where = {a: Index.dim(i) for i, a in enumerate(kept)}
        where.update({a: Index.dim(len(kept) + i) for i, a in enumerate(axes)})
        return _Domain("reduction", tuple(shape[a] for a in kept), tuple(shape[a] for a in axes),
                       shape, tuple(where[a] for a in range(len(shape))), axes)
    shapes = {v.type.shape for v in outputs}
    if len(shapes) != 1:
        raise FusionRefused(f"outputs of different shapes {sorted(shapes)}")
    shape = shapes.pop()
    return _Domain("pointwise", shape, (), shape, tuple(Index.dim(k) for k in range(len(shape))))


def _dims(index: Index) -> list[Dim]:
    out = []
    for atom, _ in index.terms:
        out.extend([atom] if isinstance(atom, Dim) else
                   _dims(atom.index) if isinstance(atom, (Div, Mod, Clamp)) else [])
    return out


def _data_dependent(index: tuple[Index, ...]) -> bool:
    return any(isinstance(a, FromValue) for i in index for a, _ in i.terms)


class _Lowerer:
    def __init__(self, eqns: Sequence[Eqn], domain: _Domain):
        self.domain = domain
        self.defined: dict[int, Eqn] = {v.id: e for e in eqns for v in e.outvars}
        self.inputs: list[Buffer] = []
        self.input_slot: dict[int, int] = {}
        self.reductions: list[Reduction] = []
        self.row_slot: dict[int, int] = {}
        self.memo: dict[tuple, Expr] = {}

    @property
    def extents(self) -> tuple[int, ...]:
        return self.domain.parallel + self.domain.reduce

    def input(self, var: Var) -> int:
        if var.id not in self.input_slot:
            self.input_slot[var.id] = len(self.inputs)
            self.inputs.append(Buffer(var.id, var.type))
        return self.input_slot[var.id]

    def value(self, atom: Atom, index: tuple[Index, ...], mask: Mask = ()) -> Expr:
        if isinstance(atom, Literal):
            return Const(atom.value, atom.type.dtype)
        if not atom.type.ndim:
            index = ()
        key = (atom.id, index, mask)
        if key not in self.memo:
            eqn = self.defined.get(atom.id)
            if eqn is None:
                self.memo[key] = Load(self.input(atom), index, atom.type.dtype, mask)
            else:
                if primitive(eqn.primitive).expensive:
                    self._check_no_recompute(eqn, index)
                if eqn.primitive not in INDEX_RULES:  # scatter_add: complete only when its kernel ends
                    raise FusionRefused(f"the result of {eqn.primitive} cannot be read in its own kernel")
                self.memo[key] = INDEX_RULES[eqn.primitive](self, eqn, index, mask)
        return self.memo[key]

    def _check_no_recompute(self, eqn: Eqn, index: tuple[Index, ...]) -> None:
        """Expensive work runs once per point it is needed at: its index must use every
        parallel dim, or only outer ones (then it is hoisted out of the inner loops)."""
        used = {a.k for i in index for a in _dims(i)}
        p = len(self.domain.parallel)
        if used >= set(range(p)) or used == set(range(len(used))) or _data_dependent(index):
            return
        raise FusionRefused(f"{eqn.primitive} of {eqn.outvars[0].type} would be recomputed for every "
                            f"point of a kernel over {self.domain.parallel + self.domain.reduce}")

    def row_value(self, eqn: Eqn, index: tuple[Index, ...]) -> Expr:
        """A reduction's (or contraction's) result, which exists only at the current row."""
        if index != self.domain.row_index:
            raise FusionRefused(f"the result of {eqn.primitive} is used at another row than its own")
        k = self.row_slot[eqn.outvars[0].id]
        reduction, out = self.reductions[k], eqn.outvars[0].type.dtype
        value: Expr = RowValue(k, reduction.dtype)
        return value if reduction.dtype == out else Op("convert_element_type", (value,), out,
                                                       (("new_dtype", out),))

    def add_reduction(self, eqn: Eqn, op: str, value: Expr, dtype: dt.DType) -> None:
        self.row_slot[eqn.outvars[0].id] = len(self.reductions)
        self.reductions.append(Reduction(op, value, dtype))


def _convert(value: Expr, dtype: dt.DType) -> Expr:
    return value if value.dtype == dtype else Op("convert_element_type", (value,), dtype,
                                                 (("new_dtype", dtype),))


def _elementwise(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    args = tuple(lw.value(a, index, mask) for a in eqn.inputs)
    return Op(eqn.primitive, args, eqn.outvars[0].type.dtype, eqn.params)


def _broadcast(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    (x,), p = eqn.inputs, eqn.param_dict
    inner = tuple(index[d] if n == p["shape"][d] else Index() for n, d in zip(x.type.shape, p["dims"]))
    return lw.value(x, inner, mask)


def _transpose(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    perm = eqn.param_dict["permutation"]
    inner = [Index()] * len(perm)
    for i, p in enumerate(perm):
        inner[p] = index[i]
    return lw.value(eqn.inputs[0], tuple(inner), mask)



def _reshape(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    x = eqn.inputs[0]
    linear = Index()
    for i, s in zip(index, strides(eqn.outvars[0].type.shape)):
        linear = linear + i * s
    inner = tuple(mod(floordiv(linear, s, lw.extents), n, lw.extents)
                  for s, n in zip(strides(x.type.shape), x.type.shape))
    return lw.value(x, inner, mask)


def _slice(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    p = eqn.param_dict
    inner = tuple(i * st + lo for i, lo, st in zip(index, p["start"], p["strides"]))
    return lw.value(eqn.inputs[0], inner, mask)


def _pad(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    x, p = eqn.inputs[0], eqn.param_dict
    inner = tuple(i + (-lo) for i, lo in zip(index, p["low"]))
    bounds = tuple((i, 0, n) for i, n in zip(inner, x.type.shape) if not _within(lw, i, n))
    dtype = x.type.dtype
    if not bounds:
        return lw.value(x, inner, mask)
    return Op("select", (InBounds(bounds, dt.bool_), lw.value(x, inner, mask + bounds),
                         Const(p["value"], dtype)), dtype)


def _within(lw: _Lowerer, index: Index, n: int) -> bool:
    lo, hi = index_bounds(index, lw.extents)
    return 0 <= lo and hi < n


def _concatenate(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    d = eqn.param_dict["dimension"]
    pieces, offset = [], 0
    for x in eqn.inputs:
        n = x.type.shape[d]
        shifted = index[:d] + (index[d] + (-offset),) + index[d + 1:]
        bound = ((shifted[d], 0, n),)
        pieces.append((bound, lw.value(x, shifted, mask + bound)))
        offset += n
    result = pieces[-1][1]
    for bound, value in reversed(pieces[:-1]):
        result = Op("select", (InBounds(bound, dt.bool_), value, result), value.dtype)
    return result


def _iota(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    return IndexValue(index[eqn.param_dict["dimension"]], eqn.outvars[0].type.dtype)


def _gather_index(lw: _Lowerer, eqn: Eqn, index, mask, clamp: bool) -> tuple[tuple[Index, ...], Index]:
    x, idx = eqn.inputs[0], eqn.inputs[1]
    axis, b = eqn.param_dict["axis"], eqn.param_dict["batch_dims"]
    n_idx = idx.type.ndim - b
    picked = lw.value(idx, tuple(index[:b]) + tuple(index[axis:axis + n_idx]), mask)
    at = Index.of(FromValue(picked))
    if clamp:
        at = Index.of(Clamp(at, x.type.shape[axis]))
    return tuple(index[:axis]) + (at,) + tuple(index[axis + n_idx:]), at


def _gather(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    inner, _ = _gather_index(lw, eqn, index, mask, clamp=True)
    return lw.value(eqn.inputs[0], inner, mask)


def _row_result(lw: _Lowerer, eqn: Eqn, index, mask) -> Expr:
    return lw.row_value(eqn, index)


# Every primitive but scatter_add, whose result is complete only when its kernel ends, and the
# opaque ones, which are kernels of their own (glue.scheduler.calls).
INDEX_RULES = RuleTable("index", lambda p: p.name != "scatter_add" and not p.opaque)
INDEX_RULES.update({
    "broadcast_in_dim": _broadcast, "transpose": _transpose, "reshape": _reshape, "slice": _slice,
    "pad": _pad, "concatenate": _concatenate, "iota": _iota, "gather": _gather, "dot_general": _row_result,
    **{name: _row_result for name, prim in PRIMITIVES.items() if prim.fold},
    **{name: _elementwise for name, prim in PRIMITIVES.items() if prim.kind == "elementwise"},
})


def _add_contraction(lw: _Lowerer, eqn: Eqn) -> None:
    (lhs, rhs), ((lc, rc), (lb, rb)) = eqn.inputs, eqn.param_dict["dimension_numbers"]
    p = len(lw.domain.parallel)
    lfree = [a for a in range(lhs.type.ndim) if a not in lc + lb]
    rfree = [a for a in range(rhs.type.ndim) if a not in rc + rb]

    def operand_index(ndim, contract, batch, free, free_start):
        where = {a: Index.dim(i) for i, a in enumerate(batch)}
        where.update({a: Index.dim(p + i) for i, a in enumerate(contract)})
        where.update({a: Index.dim(free_start + i) for i, a in enumerate(free)})
        return tuple(where[a] for a in range(ndim))

    acc = accumulator(eqn.outvars[0].type.dtype)
    left = lw.value(lhs, operand_index(lhs.type.ndim, lc, lb, lfree, len(lb)))
    right = lw.value(rhs, operand_index(rhs.type.ndim, rc, rb, rfree, len(lb) + len(lfree)))
    lw.add_reduction(eqn, "sum", Op("mul", (_convert(left, acc), _convert(right, acc)), acc), acc)


def _add_reduction(lw: _Lowerer, eqn: Eqn) -> None:
    op = primitive(eqn.primitive).fold
    value = lw.value(eqn.inputs[0], lw.domain.element_index)
    dtype = accumulator(value.dtype) if op in ("sum", "prod") else (
        eqn.param_dict["index_dtype"] if op.startswith("arg") else value.dtype)
    lw.add_reduction(eqn, op, value if op.startswith("arg") else _convert(value, dtype), dtype)


def lower_group(eqns: Sequence[Eqn], outputs: Sequence[Var], name: str) -> Kernel:
    """The Kernel computing `outputs` from the equations `eqns` (in topological order)."""
    scattered = {e.outvars[0].id for e in eqns if e.primitive == "scatter_add"}
    outputs = sorted(outputs, key=lambda v: v.id not in scattered)  # a scatter writes output 0
    domain = _domain(eqns, outputs)
    lw = _Lowerer(eqns, domain)
    for eqn in eqns:
        if eqn.primitive == "dot_general":
            _add_contraction(lw, eqn)
        elif primitive(eqn.primitive).fold:
            _add_reduction(lw, eqn)
    stores, init = [], None
    for slot, var in enumerate(outputs):
        producer = lw.defined.get(var.id)
        if producer is not None and producer.primitive == "scatter_add":
            if not isinstance(producer.inputs[0], Var) or producer.inputs[0].id in lw.defined:
                raise FusionRefused("the array a scatter_add adds into must come from memory")
            stores.append(_scatter_store(lw, producer, slot))
            init = lw.input(producer.inputs[0])
            continue
        level, index = _placement(domain, var)
        stores.append(Store(slot, lw.value(var, index), level, index))
    ops = tuple(dict.fromkeys(e.primitive for e in eqns if not primitive(e.primitive).moves_data_only)) or \
        tuple(dict.fromkeys(e.primitive for e in eqns))
    sources = tuple(dict.fromkeys(e.source for e in eqns if e.source))
    precision = next((e.param_dict.get("precision") for e in eqns if e.primitive == "dot_general"), None)
    return Kernel(f"{'_'.join(ops[:5])}_{name}", domain.kind, domain.parallel, domain.reduce,
                  tuple(lw.inputs), tuple(Buffer(v.id, v.type) for v in outputs),
                  tuple(lw.reductions), tuple(stores), ops, init, sources, precision)


def _placement(domain: _Domain, var: Var) -> tuple[str, tuple[Index, ...]]:
    shape = var.type.shape
    if domain.kind != "pointwise" and shape == domain.parallel and \
            (domain.kind == "contraction" or len(domain.reduce)):
        return "row", domain.row_index
    if shape == domain.element_shape:
        return "element", domain.element_index
    if domain.reduced_axes and shape == tuple(1 if a in domain.reduced_axes else n
                                              for a, n in enumerate(domain.element_shape)):
        # A row value kept with its reduced axes as size 1 (keepdims=True).
        return "row", tuple(Index() if a in domain.reduced_axes else i
                            for a, i in enumerate(domain.element_index))
    raise FusionRefused(f"an output of shape {shape} does not fit a kernel over {domain.parallel}"
                        f"{' x ' + str(domain.reduce) if domain.reduce else ''}")


def _scatter_store(lw: _Lowerer, eqn: Eqn, slot: int) -> Store:
    index = lw.domain.element_index
    target, at = _gather_index(lw, eqn, index, (), clamp=False)
    bound = ((at, 0, eqn.inputs[0].type.shape[eqn.param_dict["axis"]]),)
    return Store(slot, lw.value(eqn.inputs[2], index), "element", target, "add", bound)
