"""Integer semantics at full range, for every backend: small programs over each integer dtype
whose inputs take any value of it (its extremes most often), so that wrapping arithmetic,
division by zero and by -1, unsigned compares, shifts past the width, saturating and wrapping
conversions and bitcasts all meet. (The random programs of `glue.testing` keep values small, so
that float results stay within tolerance; these keep integers exact and wide instead.)

`CASES` names each group of primitives; `case(group, dtype)` draws a Graph and inputs for it,
and `same(got, want)` compares results bit for bit (any NaN matches any NaN). Every program
keeps to 12 arguments and results, which the cuda kernel emulator can launch.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

from glue.frontend.tracing import bind, trace_flat
from glue.ir import Graph, TensorType
from glue.ir import dtypes as dt

N = 11  # elements per operand: enough for every edge value to meet every other in a few draws


def values(dtype: dt.DType) -> st.SearchStrategy[int]:
    info = np.iinfo(dtype.numpy)
    edges = sorted({int(info.min), int(info.min) + 1, -1 if dtype.signed else 1, 0, 1, 2,
                    int(info.max) - 1, int(info.max)})
    return st.one_of(st.sampled_from(edges), st.integers(int(info.min), int(info.max)))


def float_values(dtype: dt.DType) -> st.SearchStrategy[float]:
    """Floats around every integer type's limits, and NaN and the infinities."""
    limits = [float(2 ** k + d) for k in (7, 8, 15, 16, 31, 32, 63, 64) for d in (-1, 0, 1)]
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.5, -0.5, -1.5, 255.5] + limits + [-v for v in limits]
    return st.one_of(st.sampled_from(specials), st.floats(-2.0 ** 65, 2.0 ** 65, width=32))


def _array(draw, dtype: dt.DType, shape: tuple[int, ...], elements: st.SearchStrategy) -> np.ndarray:
    items = draw(st.lists(elements, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    with np.errstate(all="ignore"):
        return np.array(items, dtype=np.float64 if dtype.is_float else dtype.numpy).astype(dtype.numpy).reshape(shape)


def _amounts(dtype: dt.DType) -> st.SearchStrategy[int]:
    """Shift amounts: inside the width, just past it, and (read as unsigned) huge."""
    return st.one_of(st.integers(0, dtype.bits + 1), values(dtype))


_ARITH = ("add", "sub", "mul", "div", "rem", "max", "min")
_BITS = ("and", "or", "xor")
_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
_SHIFTS = ("shift_left", "shift_right_logical", "shift_right_arithmetic")
_UNARY = ("neg", "abs", "sign", "not", "population_count")


def _binary_ops(names: tuple[str, ...]):
    """Each op on two full-range operands, and the first two on one and a full-range scalar."""
    def build(draw, dtype):
        t = [TensorType((N,), dtype), TensorType((N,), dtype), TensorType((), dtype)]
        args = [_array(draw, dtype, type_.shape, values(dtype)) for type_ in t]
        return (lambda x, y, s: [bind(p, x, y) for p in names] + [bind(p, x, s) for p in names[:2]]), t, args
    return build


def _shifts(draw, dtype):
    t = [TensorType((N,), dtype), TensorType((N,), dtype), TensorType((), dtype)]
    args = [_array(draw, dtype, (N,), values(dtype)), _array(draw, dtype, (N,), _amounts(dtype)),
            _array(draw, dtype, (), _amounts(dtype))]
    return (lambda x, y, s: [bind(p, x, y) for p in _SHIFTS] + [bind(p, x, s) for p in _SHIFTS]), t, args


def _unary_and_pow(draw, dtype):
    low = 0 if dtype.is_unsigned else -2
    t = [TensorType((N,), dtype), TensorType((N,), dtype)]
    args = [_array(draw, dtype, (N,), values(dtype)), _array(draw, dtype, (N,), st.integers(low, 2 * dtype.bits))]
    return (lambda x, e: [bind(p, x) for p in _UNARY] + [bind("pow", x, e)]), t, args


def _converts_from(kinds: tuple[str, ...]):
    """Wrapping, widening and rounding conversions of full-range values to the dtypes of `kinds`."""
    def build(draw, dtype):
        targets = [d for d in dt.ALL_DTYPES if d != dtype and d.kind in kinds]
        fn = lambda x: [bind("convert_element_type", x, new_dtype=d) for d in targets]  # noqa: E731
        return fn, [TensorType((N,), dtype)], [_array(draw, dtype, (N,), values(dtype))]
    return build


def _converts_to(draw, dtype):
    """Truncating, saturating conversions of floats (NaN, infinities, limits) and bools."""
    sources = [dt.float16, dt.bfloat16, dt.float32, dt.float64]
    t = [TensorType((N,), d) for d in sources] + [TensorType((N,), dt.bool_)]
    args = [_array(draw, d, (N,), float_values(d)) for d in sources] + \
        [np.array(draw(st.lists(st.booleans(), min_size=N, max_size=N)))]
    return (lambda *xs: [bind("convert_element_type", x, new_dtype=dtype) for x in xs]), t, args


_FLOAT_LAYOUTS = {16: (10, 7), 32: (23,), 64: (52,)}  # significand bits of the floats of a width


def _quiet_nan_bits(bits: np.ndarray, width: int) -> np.ndarray:
    """Bits whose signaling NaN patterns (as any float of the width) are made quiet: 16-bit
    floats live in float32 registers, and the conversions there and back quiet them, which is
    no difference in value."""
    wide = bits.view(f"uint{width}").astype(np.uint64)
    for mantissa in _FLOAT_LAYOUTS.get(width, ()):
        exponent = ((1 << (width - 1 - mantissa)) - 1) << mantissa
        is_nan = ((wide & exponent) == exponent) & ((wide & ((1 << mantissa) - 1)) != 0)
        wide = np.where(is_nan, wide | (1 << (mantissa - 1)), wide)
    return wide.astype(f"uint{width}").view(bits.dtype)


def _bitcasts(draw, dtype):
    """The bits of every same-width dtype read as `dtype`, and back."""
    others = [d for d in dt.ALL_DTYPES if d.bits == dtype.bits and d not in (dtype, dt.bool_)]
    bits = _quiet_nan_bits(_array(draw, dtype, (N,), values(dtype)), dtype.bits)
    t = [TensorType((N,), dtype)] + [TensorType((N,), d) for d in others]
    args = [bits] + [bits.view(d.numpy) for d in others]

    def fn(x, *ys):
        return [bind("bitcast_convert_type", x, new_dtype=d) for d in others] + \
            [bind("bitcast_convert_type", y, new_dtype=dtype) for y in ys]
    return fn, t, args


def _reductions(draw, dtype):
    shape = (3, 9)
    t = [TensorType(shape, dtype)]

    def fn(x):
        out = [bind(p, x, axes=(1,)) for p in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")]
        return out + [bind("reduce_sum", x, axes=(0, 1)), bind("argmax", x, axis=1, index_dtype=dtype),
                      bind("argmin", x, axis=0, index_dtype=dtype)]
    return fn, t, [_array(draw, dtype, shape, values(dtype))]


def _indexing(draw, dtype):
    """Gathers at full-range indices (clamped), scatters (out of range dropped), a wrapping
    iota and an integer contraction."""
    t = [TensorType((4, 6), dt.float32), TensorType((5,), dtype), TensorType((4, 6), dtype),
         TensorType((4, 5), dtype), TensorType((6, 3), dtype)]
    near = st.integers(0 if dtype.is_unsigned else -2, 8)
    args = [_array(draw, dt.float32, (4, 6), st.integers(-9, 9)), _array(draw, dtype, (5,), st.one_of(near, values(dtype))),
            _array(draw, dtype, (4, 6), values(dtype)), _array(draw, dtype, (4, 5), values(dtype)),
            _array(draw, dtype, (6, 3), values(dtype))]

    def fn(table, idx, target, updates, rhs):
        return [bind("gather", table, idx, axis=1, batch_dims=0),
                bind("scatter_add", target, idx, updates, axis=1, batch_dims=0),
                bind("iota", dtype=dtype, shape=(300,), dimension=0),
                bind("dot_general", target, rhs, dimension_numbers=(((1,), (0,)), ((), ())))]
    return fn, t, args


CASES: dict[str, Callable[[Any, dt.DType], tuple[Callable, list[TensorType], list[np.ndarray]]]] = {
    "arithmetic": _binary_ops(_ARITH), "bitwise": _binary_ops(_BITS), "compare": _binary_ops(_COMPARE),
    "shifts": _shifts, "unary and pow": _unary_and_pow, "converts to ints": _converts_from(("int",)),
    "converts to floats": _converts_from(("float", "bool")),
    "converts to": _converts_to, "bitcasts": _bitcasts, "reductions": _reductions, "indexing": _indexing,
}


@st.composite
def case(draw, group: str, dtype: dt.DType) -> tuple[Graph, list[np.ndarray]]:
    fn, types, args = CASES[group](draw, dtype)
    return trace_flat(fn, types, group.replace(" ", "_")).graph, args


def same(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype.kind in "fV":
        wide_got, wide_want = got.astype(np.float64), want.astype(np.float64)
        return bool(np.all((got.view(f"uint{8 * got.itemsize}") == want.view(f"uint{8 * want.itemsize}"))
                           | (np.isnan(wide_got) & np.isnan(wide_want))))
    return bool(np.array_equal(got, want))
