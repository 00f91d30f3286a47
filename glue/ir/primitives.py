"""The primitive registry: every primitive of the IR with its facts and its one shape/dtype rule.

A rule takes the operand types and the params and returns the output type, or raises
`RuleError` with a sentence saying what is wrong; `infer_type` turns that into a GlueError that
names the primitive, the operand types and the user's line. The facts later layers decide by
(is it expensive to recompute, what it folds with, is it linear, does it only move data) are
fields of `Primitive`, so there is one place to look them up. Evaluation, differentiation,
batching and lowering rules live in `RuleTable`s of their own layers, keyed by primitive name;
a table rejects a name that is not a primitive when it is filled, and `RuleTable.missing()`
lists the primitives a table that must cover them all still lacks (tests check every such table).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from glue.errors import GlueTypeError, describe_location
from glue.ir import dtypes as dt
from glue.ir.core import TensorType, literal_problem, shape_problem
from glue.ir.dtypes import DType


class RuleError(Exception):
    """Raised by a shape rule; carries only the sentence, context is added by `infer_type`."""


@dataclass(frozen=True)
class Primitive:
    """A primitive operation: its name, kind, type rule and the facts passes decide by.

    kind: elementwise | reduction | index | layout | contraction | creation | call.
    expensive: a transcendental (or pow/sqrt): worth computing once, not once per reader.
    fold: for reductions, the operation the values are folded with (sum, max, argmax, ...).
    linear: the output is linear in its differentiable operands (add, transpose, sum, gather in
        the gathered array, ...); dot_general, linear in each operand separately, says so too.
    cast: converts element types and changes nothing else.
    multiple_results: the rule returns a tuple of types, and the equation defines one output
        variable per type (control flow, attention); every other primitive has one output.
    opaque: the scheduler never fuses it with anything; it becomes a kernel of its own, which a
        backend runs by the primitive's own rule (a loop around a compiled body, a library
        call, a hand-written kernel).
    bitwise: reads and writes raw bits (a bitcast), so it is evaluated at the declared widths
        even where the reference computes every float in float64.
    effect: it has a side effect (prints): its first operand and first result are the effect
        token, which orders effects and keeps them alive (see `has_effects`).
    """

    name: str
    kind: str
    rule: Callable[..., TensorType]
    variadic: bool = False
    expensive: bool = False
    fold: str | None = None
    linear: bool = False
    cast: bool = False
    multiple_results: bool = False
    opaque: bool = False
    bitwise: bool = False
    effect: bool = False

    @property
    def moves_data_only(self) -> bool:
        """Computes nothing: a layout change, an index pattern or a cast (cheap in any kernel,
        free before a contraction, left out of kernel names)."""
        return self.kind in ("layout", "creation") or self.cast


PRIMITIVES: dict[str, Primitive] = {}


def _register(name: str, kind: str, rule: Callable[..., TensorType], variadic: bool = False, **facts: Any) -> None:
    PRIMITIVES[name] = Primitive(name, kind, rule, variadic, **facts)


class RuleTable(dict):
    """Rules of one layer keyed by primitive name (reference impls, JVPs, index rules, ...).

    Filling it with a name that is not a primitive raises at import, so a typo or a removed
    primitive cannot leave a dead rule; `covers` says which primitives the table must have a
    rule for (None: it is a partial table, such as fast paths), and `missing()` lists those it
    lacks."""

    TABLES: list["RuleTable"] = []

    def __init__(self, name: str, covers: Callable[[Primitive], bool] | None = None):
        super().__init__()
        self.name = name
        self.covers = covers
        RuleTable.TABLES.append(self)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in PRIMITIVES:
            raise KeyError(f"rule table {self.name!r}: {key!r} is not a primitive")
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def register(self, *names: str) -> Callable[[Any], Any]:
        """Decorator: the function is the rule of each of `names`."""
        def put(fn: Any) -> Any:
            for name in names:
                self[name] = fn
            return fn
        return put

    def missing(self) -> list[str]:
        if self.covers is None:
            return []
        return sorted(name for name, prim in PRIMITIVES.items() if self.covers(prim) and name not in self)


def every_primitive(prim: Primitive) -> bool:
    return True


def primitive(name: str) -> Primitive:
    """The primitive called `name` (a KeyError naming it when there is none)."""
    found = PRIMITIVES.get(name)
    if found is None:
        raise KeyError(f"{name!r} is not a primitive")
    return found


def infer_types(name: str, in_types: tuple[TensorType, ...], params: dict[str, Any],
                source: str | None = None) -> tuple[TensorType, ...]:
    """The output types of `name` applied to operands of `in_types` (one per output variable)."""
    out = infer_type(name, in_types, params, source)
    return out if isinstance(out, tuple) else (out,)


def _where(source: str | None) -> str:
    """The user's line for an error message (read from the file only when a rule fails)."""
    return f" {describe_location(source)}" if source else ""


def infer_type(name: str, in_types: tuple[TensorType, ...], params: dict[str, Any],
               source: str | None = None) -> TensorType | tuple[TensorType, ...]:
    """The output type of `name` applied to operands of `in_types` (a tuple of types for a
    primitive with multiple results); a GlueTypeError if ill-typed."""
    prim = PRIMITIVES.get(name)
    if prim is None:
        raise GlueTypeError(f"unknown primitive '{name}'{_where(source)}")
    try:
        out = prim.rule(*in_types, **params)
        for result in out if isinstance(out, tuple) else (out,):
            problem = shape_problem(result.shape, result.dtype) if isinstance(result.dtype, DType) else \
                f"{result.dtype!r} is not a dtype"
            if problem:
                raise RuleError(f"the result cannot be an array: {problem}")
        return out
    except RuleError as err:
        operands = ", ".join(map(str, in_types)) or "no operands"
        shown = " ".join(f"{k}={v}" for k, v in params.items())
        raise GlueTypeError(f"{name}{'[' + shown + ']' if shown else ''} on ({operands}): {err}"
                            f"{_where(source)}") from None
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, OverflowError) as err:
        # A wrong number of operands, missing params, or params of the wrong kind (a rule
        # unpacks and indexes them): the rule met something it was not written for.
        raise GlueTypeError(f"{name}: bad operands or parameters ({len(in_types)} operands, params "
                            f"{sorted(params)}): {type(err).__name__}: {err}{_where(source)}") from None


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise RuleError(message)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: Any, what: str, length: int | None = None) -> None:
    """`value` must be a tuple of ints (of `length` entries when given): a float there would
    make a float shape that compares equal to an int one and fails only in a backend."""
    _require(isinstance(value, tuple) and all(map(_int, value)), f"{what} must be a tuple of ints, not {value!r}")
    _require(length is None or len(value) == length, f"{what} needs one entry per axis ({length}), not {value!r}")


def _common_shape(*types: TensorType) -> tuple[int, ...]:
    """Elementwise operands share one shape; rank-0 operands broadcast implicitly."""
    shapes = {t.shape for t in types if t.ndim}
    _require(len(shapes) <= 1, "operand shapes differ")
    return shapes.pop() if shapes else ()


def _same_dtype(*types: TensorType) -> DType:
    kinds = {t.dtype for t in types}
    _require(len(kinds) == 1, "operand dtypes differ")
    return types[0].dtype


# --- elementwise ----------------------------------------------------------------------------

def _unary(accepts: Callable[[DType], bool], what: str):
    def rule(x: TensorType) -> TensorType:
        _require(accepts(x.dtype), f"needs {what} operands")
        return x
    return rule


_float = _unary(lambda d: d.is_float, "floating-point")
_numeric = _unary(lambda d: d != dt.bool_, "numeric")
_logical = _unary(lambda d: not d.is_float, "bool or integer")
_integer = _unary(lambda d: d.is_int, "integer")

for _name in ("exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "logistic", "sqrt",
              "rsqrt", "sin", "cos", "erf", "erfc"):
    _register(_name, "elementwise", _float, expensive=True)
for _name in ("floor", "ceil", "round"):
    _register(_name, "elementwise", _float)
_register("neg", "elementwise", _numeric, linear=True)
for _name in ("abs", "sign"):
    _register(_name, "elementwise", _numeric)
_register("not", "elementwise", _logical)
_register("population_count", "elementwise", _integer)


def _binary(accepts: Callable[[DType], bool], what: str, result: DType | None = None):
    def rule(x: TensorType, y: TensorType) -> TensorType:
        shape = _common_shape(x, y)
        dtype = _same_dtype(x, y)
        _require(accepts(dtype), f"needs {what} operands")
        return TensorType(shape, result or dtype)
    return rule


for _name in ("add", "sub"):
    _register(_name, "elementwise", _binary(lambda d: d != dt.bool_, "numeric"), linear=True)
for _name in ("mul", "div", "rem"):
    _register(_name, "elementwise", _binary(lambda d: d != dt.bool_, "numeric"))
_register("pow", "elementwise", _binary(lambda d: d != dt.bool_, "numeric"), expensive=True)
for _name in ("max", "min"):
    _register(_name, "elementwise", _binary(lambda d: True, "any"))
for _name in ("and", "or", "xor"):
    _register(_name, "elementwise", _binary(lambda d: not d.is_float, "bool or integer"))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _register(_name, "elementwise", _binary(lambda d: True, "any", dt.bool_))
# Shift amounts are read as unsigned: one of the operand's width or more shifts every bit out
# (the arithmetic shift then fills with the sign bit), as XLA defines them.
for _name in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
    _register(_name, "elementwise", _binary(lambda d: d.is_int, "integer"))


def _select(pred: TensorType, on_true: TensorType, on_false: TensorType) -> TensorType:
    _require(pred.dtype == dt.bool_, "the predicate must be bool")
    shape = _common_shape(pred, on_true, on_false)
    return TensorType(shape, _same_dtype(on_true, on_false))


def _convert(x: TensorType, *, new_dtype: DType) -> TensorType:
    _require(isinstance(new_dtype, DType), "new_dtype must be a dtype")
    return TensorType(x.shape, new_dtype)


def _bitcast_convert(x: TensorType, *, new_dtype: DType) -> TensorType:
    _require(isinstance(new_dtype, DType), "new_dtype must be a dtype")
    _require(dt.bool_ not in (x.dtype, new_dtype), "bool has no bit pattern to reinterpret")
    _require(x.dtype.bits == new_dtype.bits, f"{x.dtype} and {new_dtype} differ in width")
    return TensorType(x.shape, new_dtype)


_register("select", "elementwise", _select)
_register("convert_element_type", "elementwise", _convert, cast=True, linear=True)
_register("bitcast_convert_type", "elementwise", _bitcast_convert, bitwise=True)


# --- reductions -----------------------------------------------------------------------------

def _check_axes(x: TensorType, axes: tuple[int, ...]) -> None:
    _ints(axes, "axes")
    _require(len(set(axes)) == len(axes), f"repeated axis in {axes}")
    _require(all(0 <= a < x.ndim for a in axes), f"axes {axes} out of range for rank {x.ndim}")


def _reduce(numeric: bool):
    def rule(x: TensorType, *, axes: tuple[int, ...]) -> TensorType:
        _check_axes(x, axes)
        _require(not numeric or x.dtype != dt.bool_, "needs numeric operands")
        return TensorType(tuple(n for i, n in enumerate(x.shape) if i not in axes), x.dtype)
    return rule


def _arg_reduce(x: TensorType, *, axis: int, index_dtype: DType) -> TensorType:
    _check_axes(x, (axis,))
    _require(x.shape[axis] > 0, "cannot reduce an empty axis")
    _require(isinstance(index_dtype, DType) and index_dtype.is_int, "index_dtype must be an integer dtype")
    return TensorType(x.shape[:axis] + x.shape[axis + 1:], index_dtype)


_register("reduce_sum", "reduction", _reduce(True), fold="sum", linear=True)
_register("reduce_prod", "reduction", _reduce(True), fold="prod")
_register("reduce_max", "reduction", _reduce(False), fold="max")
_register("reduce_min", "reduction", _reduce(False), fold="min")
_register("argmax", "reduction", _arg_reduce, fold="argmax")
_register("argmin", "reduction", _arg_reduce, fold="argmin")


# --- layout ---------------------------------------------------------------------------------

def _is_shape(shape: Any) -> bool:
    return isinstance(shape, tuple) and all(_int(n) and n >= 0 for n in shape)


def _broadcast_in_dim(x: TensorType, *, shape: tuple[int, ...], dims: tuple[int, ...]) -> TensorType:
    _require(_is_shape(shape), f"bad target shape {shape}")
    _ints(dims, "dims")
    _require(len(dims) == x.ndim, f"dims {dims} must name one target axis per operand axis")
    _require(all(0 <= d < len(shape) for d in dims) and list(dims) == sorted(set(dims)),
             f"dims {dims} must be increasing target axes")
    for n, d in zip(x.shape, dims):
        _require(n in (1, shape[d]), f"operand axis of size {n} cannot broadcast to {shape[d]}")
    return TensorType(shape, x.dtype)


def _reshape(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    _require(_is_shape(shape), f"bad target shape {shape}")
    _require(math.prod(shape) == x.size, f"cannot reshape {x.size} elements into {shape}")
    return TensorType(shape, x.dtype)


def _transpose(x: TensorType, *, permutation: tuple[int, ...]) -> TensorType:
    _ints(permutation, "permutation")
    _require(sorted(permutation) == list(range(x.ndim)),
             f"{permutation} is not a permutation of {x.ndim} axes")
    return TensorType(tuple(x.shape[p] for p in permutation), x.dtype)


def _slice(x: TensorType, *, start: tuple[int, ...], limit: tuple[int, ...],
           strides: tuple[int, ...]) -> TensorType:
    for value, what in ((start, "start"), (limit, "limit"), (strides, "strides")):
        _ints(value, what, x.ndim)
    out = []
    for n, lo, hi, st in zip(x.shape, start, limit, strides):
        _require(0 <= lo <= hi <= n and st >= 1, f"slice {lo}:{hi}:{st} is out of bounds for size {n}")
        out.append(max(0, -(-(hi - lo) // st)))
    return TensorType(tuple(out), x.dtype)


def _pad(x: TensorType, *, low: tuple[int, ...], high: tuple[int, ...], value: Any) -> TensorType:
    _ints(low, "low", x.ndim)
    _ints(high, "high", x.ndim)
    _require(all(p >= 0 for p in low + high), "padding must be non-negative")
    _require(isinstance(value, (bool, int, float)), "the padding value must be a scalar")
    if x.dtype.is_int:  # an integral float (0.0) is accepted for integers, as NumPy does
        _require(math.isfinite(value) and float(value).is_integer() and literal_problem(int(value), x.dtype) is None,
                 f"the padding value {value!r} is not an integer of {x.dtype}")
    return TensorType(tuple(n + lo + hi for n, lo, hi in zip(x.shape, low, high)), x.dtype)


def _concatenate(*xs: TensorType, dimension: int) -> TensorType:
    _require(len(xs) >= 1, "needs at least one operand")
    dtype = _same_dtype(*xs)
    first = xs[0]
    _require(_int(dimension) and 0 <= dimension < first.ndim, f"dimension {dimension} out of range for rank {first.ndim}")
    for x in xs:
        _require(x.ndim == first.ndim and all(
            a == b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != dimension),
            "operand shapes differ outside the concatenated dimension")
    size = sum(x.shape[dimension] for x in xs)
    return TensorType(first.shape[:dimension] + (size,) + first.shape[dimension + 1:], dtype)


def _iota(*, dtype: DType, shape: tuple[int, ...], dimension: int) -> TensorType:
    _require(_is_shape(shape) and _int(dimension) and 0 <= dimension < len(shape), f"bad iota {shape} along {dimension}")
    _require(isinstance(dtype, DType) and dtype != dt.bool_, "iota needs a numeric dtype")
    return TensorType(shape, dtype)


_register("broadcast_in_dim", "layout", _broadcast_in_dim, linear=True)
_register("reshape", "layout", _reshape, linear=True)
_register("transpose", "layout", _transpose, linear=True)
_register("slice", "layout", _slice, linear=True)
_register("pad", "layout", _pad)  # linear in the operand only when the padding value is 0
_register("concatenate", "layout", _concatenate, variadic=True, linear=True)
_register("iota", "creation", _iota)


# --- contraction ----------------------------------------------------------------------------

# JAX's matmul precisions. On a GPU, "default" and "high" let float32 operands run on TF32
# tensor cores and "highest" keeps full float32; 16-bit operands always use their own tensor
# cores. JAX's other spellings name the same three.
PRECISIONS = ("default", "high", "highest")
PRECISION_ALIASES = {"bfloat16": "default", "tensorfloat32": "high", "float32": "highest", "fastest": "default"}


def canonical_precision(precision: Any) -> str | None:
    """"default" | "high" | "highest" for any of JAX's spellings (a string, `glue.Precision.X`,
    or a pair of equal ones); None for None."""
    if precision is None:
        return None
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        first, second = map(canonical_precision, precision)
        _require(first == second, f"different precisions for the two operands {precision} are not supported")
        return first
    name = str(getattr(precision, "name", precision)).lower()
    name = PRECISION_ALIASES.get(name, name)
    _require(name in PRECISIONS, f"unknown precision {precision!r}; use one of {PRECISIONS}")
    return name


def _dot_general(lhs: TensorType, rhs: TensorType, *,
                 dimension_numbers: tuple[tuple[tuple[int, ...], tuple[int, ...]],
                                          tuple[tuple[int, ...], tuple[int, ...]]],
                 precision: str | None = None, preferred_element_type: DType | None = None) -> TensorType:
    _require(isinstance(dimension_numbers, tuple) and len(dimension_numbers) == 2
             and all(isinstance(p, tuple) and len(p) == 2 for p in dimension_numbers),
             "dimension_numbers must be ((lhs contracting, rhs contracting), (lhs batch, rhs batch))")
    (lc, rc), (lb, rb) = dimension_numbers
    for axes in (lc, rc, lb, rb):
        _ints(axes, "each list of dimension_numbers")
    dtype = _same_dtype(lhs, rhs)
    _require(dtype != dt.bool_, "needs numeric operands")
    _require(precision is None or precision in PRECISIONS, f"precision must be one of {PRECISIONS}")
    if preferred_element_type is not None:
        _require(isinstance(preferred_element_type, DType), "preferred_element_type must be a dtype")
        _require(preferred_element_type.kind == dtype.kind and preferred_element_type.bits >= dtype.bits,
                 f"preferred_element_type {preferred_element_type} must be a {dtype.kind} type at least as "
                 f"wide as the operands' {dtype}")
        dtype = preferred_element_type
    _require(len(lc) == len(rc) and len(lb) == len(rb), "dimension lists differ in length")
    _check_axes(lhs, lc + lb)
    _check_axes(rhs, rc + rb)
    for a, b in zip(lc + lb, rc + rb):
        _require(lhs.shape[a] == rhs.shape[b],
                 f"lhs axis {a} (size {lhs.shape[a]}) does not match rhs axis {b} (size {rhs.shape[b]})")
    lfree = [n for i, n in enumerate(lhs.shape) if i not in lc + lb]
    rfree = [n for i, n in enumerate(rhs.shape) if i not in rc + rb]
    return TensorType(tuple(lhs.shape[i] for i in lb) + tuple(lfree) + tuple(rfree), dtype)


_register("dot_general", "contraction", _dot_general, linear=True)


def canonical_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params an equation records: defaults made explicit, so that equal programs have
    equal text and cache keys (a contraction's precision, and an attention's, is resolved from
    `glue.config.default_matmul_precision` when the caller names none)."""
    if name not in ("dot_general", "attention", "attention_bwd"):
        return params
    from glue.settings import config

    try:
        chosen = canonical_precision(params.get("precision"))
        default = canonical_precision(config.default_matmul_precision)
    except RuleError as err:
        raise GlueTypeError(f"{name}: {err}") from None
    if name != "dot_general":
        return {**params, "precision": chosen or default}
    return {**params, "precision": chosen or default,
            "preferred_element_type": params.get("preferred_element_type")}


# --- indexing -------------------------------------------------------------------------------

def gather_shape(x: TensorType, idx: TensorType, axis: int, batch_dims: int) -> tuple[int, ...]:
    """Shape of `gather[axis, batch_dims] x idx`: x.shape[:axis] + idx.shape[batch_dims:] + x.shape[axis+1:]."""
    _require(idx.dtype.is_int, "indices must be integers")
    _require(_int(axis) and _int(batch_dims) and 0 <= batch_dims <= axis < x.ndim, f"need 0 <= batch_dims <= axis < rank {x.ndim}")
    _require(idx.ndim >= batch_dims and x.shape[:batch_dims] == idx.shape[:batch_dims],
             "leading batch dimensions of operand and indices differ")
    return x.shape[:axis] + idx.shape[batch_dims:] + x.shape[axis + 1:]


def _gather(x: TensorType, idx: TensorType, *, axis: int, batch_dims: int) -> TensorType:
    return TensorType(gather_shape(x, idx, axis, batch_dims), x.dtype)


def _scatter_add(x: TensorType, idx: TensorType, updates: TensorType, *, axis: int,
                 batch_dims: int) -> TensorType:
    _require(updates.shape == gather_shape(x, idx, axis, batch_dims),
             "updates must have the shape that gather would produce")
    _require(updates.dtype == x.dtype and x.dtype != dt.bool_, "updates must match a numeric operand")
    return x


_register("gather", "index", _gather, linear=True)  # in the operand; indices carry no tangent
_register("scatter_add", "index", _scatter_add, linear=True)


# --- control flow and calls -----------------------------------------------------------------
#
# These take their bodies as Graph params (closed: every value a body uses is one of its inputs)
# and are `opaque`: the scheduler makes each equation a "call" kernel that a backend runs by
# running the bodies as programs of their own. An equation whose bodies print (debug_print) is
# *effectful*: its first operand and its first result are the effect token that orders the
# program's prints (see `has_effects`).

def _types_of(graph: Any) -> tuple[TensorType, ...]:
    return tuple(v.type for v in graph.invars)


def _require_graph(graph: Any, what: str) -> None:
    from glue.ir.core import Graph

    _require(isinstance(graph, Graph), f"{what} must be a graph")
    _require(not graph.constvars, f"{what} must take its constants as inputs")


def _same_types(got: Sequence[TensorType], want: Sequence[TensorType], what: str) -> None:
    got, want = tuple(got), tuple(want)
    _require(len(got) == len(want), f"{what}: {len(got)} values where {len(want)} are needed")
    for i, (g, w) in enumerate(zip(got, want)):
        _require(g == w, f"{what}: value {i} is {g}, but {w} is needed")


def _scan(*operands: TensorType, body: Any, length: int, reverse: bool, num_carry: int,
          num_consts: int) -> tuple[TensorType, ...]:
    """Operands: the carry, the constants, then the stacked xs (leading axis `length`). The body
    maps (carry, constants, one slice of each x) to (new carry, one slice of each y)."""
    _require_graph(body, "the scan body")
    _require(isinstance(length, int) and length >= 0, f"length must be a non-negative int, not {length!r}")
    _require(isinstance(reverse, bool), "reverse must be a bool")
    _require(0 <= num_carry and 0 <= num_consts and num_carry + num_consts <= len(operands),
             f"{num_carry} carries and {num_consts} constants among {len(operands)} operands")
    xs = operands[num_carry + num_consts:]
    for x in xs:
        _require(x.ndim >= 1 and x.shape[0] == length, f"scanned operand {x} has no leading axis of length {length}")
    slices = tuple(TensorType(x.shape[1:], x.dtype) for x in xs)
    _same_types(_types_of(body), operands[:num_carry + num_consts] + slices, "the scan body's inputs")
    outs = tuple(a.type for a in body.outvars)
    _same_types(outs[:num_carry], operands[:num_carry], "the scan body's carry out")
    return operands[:num_carry] + tuple(TensorType((length,) + t.shape, t.dtype) for t in outs[num_carry:])


def _while(*operands: TensorType, cond: Any, body: Any, num_carry: int, cond_consts: int) -> tuple[TensorType, ...]:
    """Operands: the carry, the condition's constants, then the body's constants."""
    _require_graph(cond, "the while condition")
    _require_graph(body, "the while body")
    _require(0 <= num_carry and 0 <= cond_consts and num_carry + cond_consts <= len(operands),
             f"{num_carry} carries and {cond_consts} condition constants among {len(operands)} operands")
    carry = operands[:num_carry]
    _same_types(_types_of(cond), carry + operands[num_carry:num_carry + cond_consts], "the condition's inputs")
    _same_types([a.type for a in cond.outvars], [TensorType((), dt.bool_)], "the condition's result")
    _same_types(_types_of(body), carry + operands[num_carry + cond_consts:], "the while body's inputs")
    _same_types([a.type for a in body.outvars], carry, "the while body's results")
    return carry


def _cond(*operands: TensorType, branches: tuple) -> tuple[TensorType, ...]:
    """Operands: the branches' operands, then the branch index (an int32 scalar, clamped)."""
    _require(isinstance(branches, tuple) and len(branches) >= 1, "cond needs a tuple of branches")
    _require(len(operands) >= 1 and operands[-1] == TensorType((), dt.int32),
             "the last operand must be the branch index, an i32 scalar")
    for k, branch in enumerate(branches):
        _require_graph(branch, f"branch {k}")
        _same_types(_types_of(branch), operands[:-1], f"branch {k}'s inputs")
    outs = tuple(a.type for a in branches[0].outvars)
    for k, branch in enumerate(branches[1:], start=1):
        _same_types([a.type for a in branch.outvars], outs, f"branch {k}'s results (branch 0 gives {outs})")
    return outs


def _call_body(*operands: TensorType, body: Any, **params: Any) -> tuple[TensorType, ...]:
    _require_graph(body, "the body")
    _same_types(_types_of(body), operands, "the body's inputs")
    return tuple(a.type for a in body.outvars)


def _custom_jvp_call(*operands: TensorType, body: Any, jvp: Any, num_consts: int) -> tuple[TensorType, ...]:
    """Operands: the arguments, then constants (values the functions close over). `jvp` maps
    (arguments, constants, one tangent per argument) to (outputs, one tangent per output)."""
    outs = _call_body(*operands, body=body)
    _require_graph(jvp, "the jvp rule")
    args = operands[:len(operands) - num_consts]
    _same_types(_types_of(jvp), operands + args, "the jvp rule's inputs")
    _same_types([a.type for a in jvp.outvars], outs + outs, "the jvp rule's results")
    return outs


def _custom_vjp_call(*operands: TensorType, body: Any, fwd: Any, bwd: Any,
                     num_consts: tuple[int, int, int]) -> tuple[TensorType, ...]:
    """Operands: the arguments, then the constants of `body`, of `fwd` and of `bwd`. `fwd` maps
    (arguments, its constants) to (outputs, residuals); `bwd` maps (residuals, one cotangent per
    output, its constants) to one cotangent per argument."""
    _require(isinstance(num_consts, tuple) and len(num_consts) == 3, "num_consts must be three counts")
    nb, nf, nw = num_consts
    n_args = len(operands) - nb - nf - nw
    _require(n_args >= 0, f"{sum(num_consts)} constants among {len(operands)} operands")
    args = operands[:n_args]
    outs = _call_body(*(args + operands[n_args:n_args + nb]), body=body)
    _require_graph(fwd, "fwd")
    _require_graph(bwd, "bwd")
    _same_types(_types_of(fwd), args + operands[n_args + nb:n_args + nb + nf], "fwd's inputs")
    fwd_outs = tuple(a.type for a in fwd.outvars)
    _same_types(fwd_outs[:len(outs)], outs, "fwd's outputs")
    residuals = fwd_outs[len(outs):]
    _same_types(_types_of(bwd), residuals + outs + operands[n_args + nb + nf:], "bwd's inputs")
    _same_types([a.type for a in bwd.outvars], args, "bwd's results")
    return outs


CHECKPOINT_POLICIES = ("nothing_saveable", "everything_saveable", "dots_saveable",
                       "dots_with_no_batch_dims_saveable")


def _checkpoint(*operands: TensorType, body: Any, policy: str, prevent_cse: bool) -> tuple[TensorType, ...]:
    _require(policy in CHECKPOINT_POLICIES, f"unknown policy {policy!r}; glue has {CHECKPOINT_POLICIES}")
    return _call_body(*operands, body=body)


def _optimization_barrier(*operands: TensorType) -> tuple[TensorType, ...]:
    return operands


TOKEN = TensorType((), dt.int32)


def _debug_print(token: TensorType, *operands: TensorType, fmt: str, names: tuple) -> tuple[TensorType, ...]:
    """Prints `fmt.format(*positional, **named)` on the host once the operands are ready; the
    last len(names) operands are the named ones. Takes and gives the effect token."""
    _require(token == TOKEN, "the first operand must be the effect token (an i32 scalar)")
    _require(isinstance(fmt, str), "fmt must be a string")
    _require(isinstance(names, tuple) and len(names) <= len(operands), "names must name trailing operands")
    return (TOKEN,)


for _name, _rule in (("scan", _scan), ("while", _while), ("cond", _cond),
                     ("custom_jvp_call", _custom_jvp_call), ("custom_vjp_call", _custom_vjp_call),
                     ("checkpoint", _checkpoint), ("optimization_barrier", _optimization_barrier)):
    _register(_name, "call", _rule, variadic=True, multiple_results=True, opaque=True)
_register("debug_print", "call", _debug_print, variadic=True, multiple_results=True, opaque=True, effect=True)


# --- attention ------------------------------------------------------------------------------
#
# softmax(q k^T * scale + bias, masked) v over heads, as jax.nn.dot_product_attention computes
# it, one equation: the scheduler runs it tiled (glue/scheduler/attention.py) so that no
# T x S buffer is ever made. Operands q, k, v, then the bias and the boolean mask where
# `has_bias` / `has_mask` say so. q is (B, T, N, H) in layout "BTNH" or (B, N, T, H) in "BNTH";
# k and v have K heads, K dividing N (grouped-query: head n reads kv head n // (N // K)), and
# S positions; v may have another head size. The bias and mask are rank 4 and broadcast to
# (B, N, T, S). Logits a mask (or, with `causal`, key j > query i) removes take `masked_value`
# (JAX's large negative finite number, or what the recognised program used). `precision` is
# that of its two products, as dot_general's (float32 at "default" or "high" may run on TF32
# tensor cores; the reference is exact at every precision). Results: the
# output (q's layout with v's head size, q's dtype) and each row's logsumexp (B, N, T) in the
# accumulation type (float32 for 16-bit inputs), which the backward recomputes P from.

ATTENTION_LAYOUTS = ("BTNH", "BNTH")


def attention_dims(q: TensorType, k: TensorType, v: TensorType, layout: str) -> tuple[int, ...]:
    """(B, N, T, H, K, S, Hv) of an attention's operands (checked)."""
    _require(layout in ATTENTION_LAYOUTS, f"layout must be one of {ATTENTION_LAYOUTS}, not {layout!r}")
    _require(q.ndim == k.ndim == v.ndim == 4, "query, key and value must be rank 4")
    order = (0, 2, 1, 3) if layout == "BTNH" else (0, 1, 2, 3)
    (b, n, t, h), (bk, kh, s, hk), (bv, vh, sv, hv) = (tuple(x.shape[i] for i in order) for x in (q, k, v))
    _require(b == bk == bv, "query, key and value differ in batch size")
    _require(k.shape == v.shape[:3] + (hk,) and kh == vh and s == sv, "key and value differ in heads or length")
    _require(h == hk, f"query head size {h} differs from key head size {hk}")
    _require(kh >= 1 and n % kh == 0, f"{n} query heads are no multiple of {kh} key/value heads")
    _require(q.dtype == k.dtype == v.dtype and q.dtype.is_float, "query, key and value need one float dtype")
    return b, n, t, h, kh, s, hv


def attention_accumulator(dtype: DType) -> DType:
    """What attention computes in: float32 for 16-bit inputs, else their own type."""
    return dt.float32 if dtype.bits < 32 else dtype


def _attention_extras(extras: Sequence[TensorType], dims: tuple[int, ...], dtype: DType,
                      has_bias: bool, has_mask: bool) -> None:
    b, n, t, _, _, s, _ = dims
    _require(len(extras) == has_bias + has_mask, f"{len(extras)} bias/mask operands where "
             f"has_bias={has_bias} and has_mask={has_mask} ask for {has_bias + has_mask}")
    for x, what, want in zip(extras, ("bias", "mask")[not has_bias:], (dtype, dt.bool_)[not has_bias:]):
        _require(x.ndim == 4 and all(m in (1, full) for m, full in zip(x.shape, (b, n, t, s))),
                 f"the {what} {x} does not broadcast to (B, N, T, S) = {(b, n, t, s)}")
        _require(x.dtype == want, f"the {what} must be {want}, not {x.dtype}")


def _attention_params(scale: Any, causal: Any, masked_value: Any, precision: Any) -> None:
    _require(isinstance(scale, float) and isinstance(masked_value, float), "scale and masked_value must be floats")
    _require(isinstance(causal, bool), "causal must be a bool")
    _require(precision is None or precision in PRECISIONS, f"precision must be one of {PRECISIONS}")


def _attention(q: TensorType, k: TensorType, v: TensorType, *extras: TensorType, scale: float, causal: bool,
               layout: str, masked_value: float, has_bias: bool, has_mask: bool,
               precision: str | None = None) -> tuple[TensorType, ...]:
    dims = attention_dims(q, k, v, layout)
    _attention_extras(extras, dims, q.dtype, has_bias, has_mask)
    _attention_params(scale, causal, masked_value, precision)
    b, n, t, _, _, _, hv = dims
    out = (b, t, n, hv) if layout == "BTNH" else (b, n, t, hv)
    return TensorType(out, q.dtype), TensorType((b, n, t), attention_accumulator(q.dtype))


def _attention_bwd(q: TensorType, k: TensorType, v: TensorType, *rest: TensorType, scale: float, causal: bool,
                   layout: str, masked_value: float, has_bias: bool, has_mask: bool, bias_grad: bool,
                   precision: str | None = None) -> tuple[TensorType, ...]:
    """Operands: those of the forward, then its output and logsumexp and their cotangents.
    Results: the cotangents of q, k, v, and of the bias when `bias_grad`."""
    _require(len(rest) == has_bias + has_mask + 4, "attention_bwd takes the forward's operands, out, lse, "
             "and the cotangents of out and lse")
    extras, (out, lse, d_out, d_lse) = rest[:-4], rest[-4:]
    want = _attention(q, k, v, *extras, scale=scale, causal=causal, layout=layout, masked_value=masked_value,
                      has_bias=has_bias, has_mask=has_mask, precision=precision)
    _same_types((out, lse, d_out, d_lse), want + want, "the forward's results and their cotangents")
    _require(isinstance(bias_grad, bool) and (has_bias or not bias_grad), "bias_grad needs a bias")
    return (q, k, v) + ((extras[0],) if bias_grad else ())


_register("attention", "call", _attention, variadic=True, multiple_results=True, opaque=True)
_register("attention_bwd", "call", _attention_bwd, variadic=True, multiple_results=True, opaque=True)


def has_effects(name: str, params: dict[str, Any] | tuple) -> bool:
    """Whether an equation of `name` with `params` has a side effect (prints), itself or in a
    body: then its first operand and first result are the effect token."""
    if PRIMITIVES[name].effect:
        return True
    items = params.values() if isinstance(params, dict) else (v for _, v in params)
    return any(_graphs_have_effects(v) for v in items)


def _graphs_have_effects(value: Any) -> bool:
    from glue.ir.core import Graph

    if isinstance(value, tuple):
        return any(_graphs_have_effects(v) for v in value)
    if not isinstance(value, Graph):
        return False
    known = value.__dict__.get("_effects")
    if known is None:
        known = any(has_effects(e.primitive, e.params) for e in value.eqns)
        object.__setattr__(value, "_effects", known)
    return known
