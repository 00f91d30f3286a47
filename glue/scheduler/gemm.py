"""What a contraction kernel is as a matrix product, for whoever serves it (a library, or a
backend's tensor-core kernels): `gemm_spec(kernel)` -> `GemmSpec` or None.

A contraction kernel folds `A * B` over its reduce dims, where A does not use the rhs's free
dims and B does not use the lhs's. Its output's parallel dims split into batch dims (used by
both operands), M dims (A only) and N dims (B only); the reduce dims are K. The product is then
`C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]` over the flattened dim groups.

An operand is a *view* when it is one load of an input buffer (under conversions that only
widen it to the accumulator type) at an affine index whose every dim group flattens to one
stride: then a library reads it in place, transposed or not. Anything else (a cast prologue that
rounds, a broadcast, a gather, a reshape that does not flatten) is *computed*, and a backend
first evaluates it into a buffer of its own. The kernel's stores are its epilogue: when the one
store writes the accumulator (converted to the output type at most) at the output's natural
position, `direct` is that output's view, and the product can be written there; otherwise a
backend writes the product aside and runs the epilogue after it.

The analysis is target-independent, like the rest of the scheduler: it says what the product
is, not who computes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.ir.core import strides
from glue.ir.dtypes import DType
from glue.scheduler.kernel_ir import (Buffer, Clamp, Dim, Div, Expr, FromValue, InBounds, Index, IndexValue,
                                      Kernel, Load, Mod, Op, RowValue, Store, children, floordiv, indices_of,
                                      mod, subexpressions)


@dataclass(frozen=True)
class View:
    """A strided matrix (or batch of them) in a kernel operand buffer: element (b, r, c) of the
    flattened dim groups sits at `offset + b*batch_stride + r*row_stride + c*col_stride`."""

    buffer: int            # the kernel input (for an output view: the kernel output) it reads
    dtype: DType
    offset: int
    batch_stride: int
    row_stride: int
    col_stride: int

    @property
    def layout(self) -> str:
        """"row" (columns contiguous), "col" (rows contiguous) or "strided" (neither)."""
        if self.col_stride == 1:
            return "row"
        return "col" if self.row_stride == 1 else "strided"


@dataclass(frozen=True)
class GemmSpec:
    """`C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]` for a contraction kernel.

    `batch`, `m`, `n`, `k` list the kernel's domain dims of each group (outer first); `a`/`b`
    are their views or None when computed (`a_expr`/`b_expr` give them at a domain point);
    `operand_dtype` is what the product multiplies (the views' dtype, or what the computed
    expressions round to), `accumulator` what it sums in; `direct` is the output view when the
    product can be written straight to the kernel's output."""

    kernel: Kernel
    batch: tuple[int, ...]
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    a: View | None
    b: View | None
    a_expr: Expr
    b_expr: Expr
    operand_dtype: DType
    accumulator: DType
    direct: View | None

    def extent(self, dims: tuple[int, ...]) -> int:
        return math.prod(self.kernel.parallel[d] if d < len(self.kernel.parallel)
                         else self.kernel.reduce[d - len(self.kernel.parallel)] for d in dims)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(batch count, M, N, K)."""
        return self.extent(self.batch), self.extent(self.m), self.extent(self.n), self.extent(self.k)

    @property
    def flops(self) -> int:
        batches, m, n, k = self.shape
        return 2 * batches * m * n * k

    def describe(self) -> str:
        batches, m, n, k = self.shape
        def side(view: View | None) -> str:
            return "computed" if view is None else f"{view.dtype} {view.layout}"
        out = "direct" if self.direct is not None else "epilogue"
        return (f"gemm {batches}x{m}x{n}x{k} {self.operand_dtype}->{self.accumulator} "
                f"A {side(self.a)} B {side(self.b)} out {out}")


def _strip_widening(e: Expr, accumulator: DType) -> Expr:
    """The expression under conversions that only widen it (bf16 -> f32 is exact)."""
    while isinstance(e, Op) and e.primitive == "convert_element_type" and e.args[0].dtype.is_float \
            and e.dtype.is_float and e.args[0].dtype.bits <= e.dtype.bits:
        e = e.args[0]
    return e


def _dim_coefficients(index: tuple[Index, ...], shape: tuple[int, ...]) -> tuple[dict[int, int], int] | None:
    """The flat element offset of `index` in a row-major buffer of `shape`, as {dim: stride}
    and a constant; None when it is not affine in the domain dims."""
    coefficients: dict[int, int] = {}
    const = 0
    for i, stride in zip(index, strides(shape)):
        const += i.const * stride
        for atom, c in i.terms:
            if not isinstance(atom, Dim):
                return None
            coefficients[atom.k] = coefficients.get(atom.k, 0) + c * stride
    return coefficients, const


def _group_stride(coefficients: dict[int, int], dims: tuple[int, ...], extents: tuple[int, ...]) -> int | None:
    """The one stride of a flattened dim group (outer dims first), or None when its dims'
    strides do not nest (0 when the operand does not move along the group)."""
    if not dims:
        return 0
    inner = coefficients.get(dims[-1], 0)
    expected = inner
    for d in reversed(dims):
        if coefficients.get(d, 0) != expected:
            return None
        expected *= extents[d]
    return inner


def _view(e: Expr, buffers: tuple, rows: tuple[int, ...], cols: tuple[int, ...], batch: tuple[int, ...],
          extents: tuple[int, ...], accumulator: DType) -> tuple[View | None, DType]:
    """The view of operand expression `e` over (batch, rows, cols), and what it multiplies as."""
    inner = _strip_widening(e, accumulator)
    if isinstance(inner, Op) and inner.primitive == "convert_element_type":
        return None, inner.dtype  # a rounding prologue (f32 -> bf16): computed, multiplied in bf16
    if not isinstance(inner, Load) or inner.mask:
        return None, inner.dtype
    found = _dim_coefficients(inner.index, buffers[inner.input].type.shape)
    if found is None:
        return None, inner.dtype
    coefficients, const = found
    used = set(coefficients) - {d for d, c in coefficients.items() if c == 0}
    if not used <= set(rows) | set(cols) | set(batch):
        return None, inner.dtype
    parts = [_group_stride(coefficients, g, extents) for g in (batch, rows, cols)]
    if any(p is None for p in parts):
        return None, inner.dtype
    return View(inner.input, inner.dtype, const, *parts), inner.dtype


def _direct(kernel: Kernel, batch: tuple[int, ...], m: tuple[int, ...], n: tuple[int, ...],
            accumulator: DType) -> View | None:
    """The output view when the kernel's one store writes the accumulator as it is (or
    converted) at the output's natural position."""
    if len(kernel.stores) != 1:
        return None
    store: Store = kernel.stores[0]
    value = store.value
    if isinstance(value, Op) and value.primitive == "convert_element_type":
        value = value.args[0]
    if not isinstance(value, RowValue) or store.mode != "set" or store.mask:
        return None
    found = _dim_coefficients(store.index, kernel.outputs[store.output].type.shape)
    if found is None:
        return None
    coefficients, const = found
    extents = kernel.parallel + kernel.reduce
    parts = [_group_stride(coefficients, g, extents) for g in (batch, m, n)]
    if any(p is None for p in parts):
        return None
    return View(store.output, kernel.outputs[store.output].type.dtype, const, *parts)


def gemm_spec(kernel: Kernel) -> GemmSpec | None:
    """The matrix product a contraction kernel computes, or None when it is not one (a
    reduction that is not a sum of two operands' product, or operands using each other's free
    dims)."""
    if kernel.kind != "contraction" or len(kernel.reductions) != 1:
        return None
    reduction = kernel.reductions[0]
    value = reduction.value
    if reduction.op != "sum" or not (isinstance(value, Op) and value.primitive == "mul" and len(value.args) == 2):
        return None
    a_expr, b_expr = value.args
    p = len(kernel.parallel)
    used_a, used_b = _dims_used(a_expr), _dims_used(b_expr)
    if used_a is None or used_b is None:
        return None
    parallel = range(p)
    m = tuple(d for d in parallel if d in used_a and d not in used_b)
    n = tuple(d for d in parallel if d in used_b and d not in used_a)
    batch = tuple(d for d in parallel if d not in m and d not in n)
    k = tuple(range(p, p + len(kernel.reduce)))
    extents = kernel.parallel + kernel.reduce
    a_view, a_type = _view(a_expr, kernel.inputs, m, k, batch, extents, reduction.dtype)
    b_view, b_type = _view(b_expr, kernel.inputs, k, n, batch, extents, reduction.dtype)
    operand = a_type if a_type == b_type else reduction.dtype
    if operand not in (dt.bfloat16, dt.float16, dt.float32, dt.float64):
        return None
    return GemmSpec(kernel, batch, m, n, k, a_view, b_view, a_expr, b_expr, operand, reduction.dtype,
                    _direct(kernel, batch, m, n, reduction.dtype))


def _dims_used(e: Expr) -> frozenset[int] | None:
    """The domain dims an operand expression reads at; None where it reads a row value."""
    dims: set[int] = set()
    for sub in subexpressions([e]):
        if isinstance(sub, RowValue):
            return None
        stack = list(indices_of(sub))
        while stack:
            for atom, _ in stack.pop().terms:
                if isinstance(atom, Dim):
                    dims.add(atom.k)
                elif isinstance(atom, (Div, Mod, Clamp)):
                    stack.append(atom.index)
    return frozenset(dims)


# --- the product's prologue and epilogue as kernels of their own ------------------------------

def substitute(exprs: list[Expr], dims: dict[int, Index], rows: dict[int, Expr] | None = None) -> list[Expr]:
    """`exprs` with every domain dim `k` replaced by the index `dims[k]` and every row value
    `k` by `rows[k]` (an iterative rebuild of the shared DAG: each node once)."""
    rows = rows or {}
    done: dict[Expr, Expr] = {}

    def index(i: Index) -> Index:
        out = Index((), i.const)
        for atom, c in i.terms:
            out = out + _atom(atom) * c
        return out

    def _atom(atom) -> Index:
        if isinstance(atom, Dim):
            return dims[atom.k]
        if isinstance(atom, Div):
            return Index.of(Div(index(atom.index), atom.divisor))
        if isinstance(atom, Mod):
            return Index.of(Mod(index(atom.index), atom.divisor))
        if isinstance(atom, Clamp):
            return Index.of(Clamp(index(atom.index), atom.size))
        return Index.of(FromValue(done[atom.value]))

    def mask(m):
        return tuple((index(i), lo, hi) for i, lo, hi in m)

    stack = [(e, False) for e in exprs]
    while stack:
        e, ready = stack.pop()
        if e in done:
            continue
        if not ready:
            stack.append((e, True))
            stack.extend((c, False) for c in children(e) if c not in done)
            continue
        if isinstance(e, Load):
            done[e] = Load(e.input, tuple(index(i) for i in e.index), e.dtype, mask(e.mask), e.other)
        elif isinstance(e, Op):
            done[e] = Op(e.primitive, tuple(done[a] for a in e.args), e.dtype, e.params)
        elif isinstance(e, IndexValue):
            done[e] = IndexValue(index(e.index), e.dtype)
        elif isinstance(e, InBounds):
            done[e] = InBounds(mask(e.mask), e.dtype)
        elif isinstance(e, RowValue):
            done[e] = rows[e.k]
        else:
            done[e] = e
    return [done[e] for e in exprs]


def _group_index(dims: tuple[int, ...], extents: tuple[int, ...], at: dict[int, Index]) -> Index:
    """The flat (row-major) index of a dim group from its dims' indices."""
    flat = Index()
    for d in dims:
        flat = flat * extents[d] + at[d]
    return flat


def _unflatten(dims: tuple[int, ...], extents: tuple[int, ...], shape: tuple[int, ...], pk: int) -> dict[int, Index]:
    """The group's dims as indices of new domain dim `pk` (of a domain of `shape`), which holds
    their flat row-major index."""
    out: dict[int, Index] = {}
    inner = 1
    for d in reversed(dims):
        out[d] = mod(floordiv(Index.dim(pk), inner, shape), extents[d], shape)
        inner *= extents[d]
    return out


def operand_kernel(spec: GemmSpec, side: str, name: str, transposed: bool = False) -> Kernel:
    """A pointwise kernel writing a computed operand as a row-major [batch, rows, cols] buffer
    of the product's operand dtype (A: [b, m, k]; B: [b, k, n]), or `transposed`, as
    [batch, cols, rows] (the operand column-major), for a product that reads it as a view. Its
    one input list is the contraction kernel's."""
    k = spec.kernel
    extents = k.parallel + k.reduce
    rows, cols = (spec.m, spec.k) if side == "a" else (spec.k, spec.n)
    expr = _strip_widening(spec.a_expr if side == "a" else spec.b_expr, spec.accumulator)
    batch_at, rows_at, cols_at = (0, 2, 1) if transposed else (0, 1, 2)  # the domain dim of each group
    shape = [0, 0, 0]
    for at_dim, group in ((batch_at, spec.batch), (rows_at, rows), (cols_at, cols)):
        shape[at_dim] = spec.extent(group)
    domain = tuple(shape)
    at = {**_unflatten(spec.batch, extents, domain, batch_at), **_unflatten(rows, extents, domain, rows_at),
          **_unflatten(cols, extents, domain, cols_at)}
    (value,) = substitute([expr], at)
    if value.dtype != spec.operand_dtype:
        value = Op("convert_element_type", (value,), spec.operand_dtype, (("new_dtype", spec.operand_dtype),))
    out = Buffer(-1, TensorType(domain, spec.operand_dtype))
    store = Store(0, value, "element", (Index.dim(0), Index.dim(1), Index.dim(2)))
    return Kernel(f"{side}_operand_{name}", "pointwise", domain, (), k.inputs, (out,), (), (store,),
                  ("convert_element_type",), None, k.source)


def product_of_written(spec: GemmSpec, sides: tuple[str, ...]) -> Kernel:
    """The contraction kernel reading operands `sides` ("a", "b") from buffers `operand_kernel`
    wrote, K-major (A as [batch, m, k], B transposed, as [batch, n, k]), appended to its
    inputs in that order; its epilogue as it was."""
    k = spec.kernel
    extents = k.parallel + k.reduce
    at = {d: Index.dim(d) for d in range(len(extents))}
    batch = _group_index(spec.batch, extents, at)
    inputs = list(k.inputs)
    operands = []
    for side, expr in (("a", spec.a_expr), ("b", spec.b_expr)):
        if side not in sides:
            operands.append(expr)
            continue
        outer = spec.m if side == "a" else spec.n
        shape = (spec.extent(spec.batch), spec.extent(outer), spec.extent(spec.k))
        value = Load(len(inputs), (batch, _group_index(outer, extents, at), _group_index(spec.k, extents, at)),
                     spec.operand_dtype)
        inputs.append(Buffer(-1, TensorType(shape, spec.operand_dtype)))
        if spec.operand_dtype != spec.accumulator:
            value = Op("convert_element_type", (value,), spec.accumulator, (("new_dtype", spec.accumulator),))
        operands.append(value)
    (reduction,) = k.reductions
    product = reduction.value
    value = Op(product.primitive, tuple(operands), product.dtype, product.params)
    return replace(k, inputs=tuple(inputs), reductions=(replace(reduction, value=value),))


def product_type(spec: GemmSpec) -> TensorType:
    """The [batch, m, n] buffer a product writes when its epilogue runs after it: in the
    accumulator's dtype, or in the narrower float that every use of the accumulator rounds it
    to first, when that is the operands' dtype (a bf16 product's bias and activation): the
    library rounds it as the cast would, and the buffer is half the bytes to write and read."""
    batches, m, n, _ = spec.shape
    rounded = _rounded_to(spec.kernel)
    # (a library writes a 16-bit product of 16-bit operands, not of float32 ones)
    return TensorType((batches, m, n), rounded if rounded == spec.operand_dtype else spec.accumulator)


def _rounded_to(kernel: Kernel) -> DType | None:
    """The dtype every use of the kernel's accumulator (row value 0) converts it to first, when
    there is one such dtype and it is a narrower float; else None."""
    targets = set()
    for s in kernel.stores:
        if isinstance(s.value, RowValue):
            return None
    for e in subexpressions(s.value for s in kernel.stores):
        for child in children(e):
            if isinstance(child, RowValue):
                if not (isinstance(e, Op) and e.primitive == "convert_element_type"):
                    return None
                targets.add(e.dtype)
    accumulator = kernel.reductions[0].dtype
    if len(targets) != 1:
        return None
    (target,) = targets
    return target if target.is_float and target.itemsize < accumulator.itemsize else None


def epilogue_kernel(spec: GemmSpec, name: str) -> Kernel:
    """The contraction kernel's stores as a pointwise kernel over its output domain, reading
    the product (`product_type`) as one more input (the last) where it read the accumulator."""
    k = spec.kernel
    extents = k.parallel
    at = {d: Index.dim(d) for d in range(len(k.parallel))}
    product = Load(len(k.inputs), (_group_index(spec.batch, extents, at), _group_index(spec.m, extents, at),
                                   _group_index(spec.n, extents, at)), product_type(spec).dtype)
    values = substitute([s.value for s in k.stores], at, {0: product})
    stores = tuple(Store(s.output, v, "element", s.index, s.mode, s.mask) for s, v in zip(k.stores, values))
    inputs = k.inputs + (Buffer(-1, product_type(spec)),)
    ops = tuple(op for op in k.ops if op != "dot_general") or ("copy",)
    return Kernel(f"epilogue_{name}", "pointwise", k.parallel, (), inputs, k.outputs, (), stores, ops, None,
                  k.source)
