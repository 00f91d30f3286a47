"""glue.numpy indexing against NumPy: x[index] (basic and integer-array), take, take_along_axis,
eagerly and under glue.jit, with traced and concrete indices; and the indexing errors."""
from __future__ import annotations

import numpy as np
import pytest
from gnp_checks import arrays, assert_matches, check, shapes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
from glue.errors import GlueIndexError

HERE = "test_numpy_indexing.py"


@given(data=st.data())
def test_basic_indexing(data):
    x = data.draw(arrays(shapes(max_dims=4)))
    index = data.draw(hnp.basic_indices(x.shape, allow_newaxis=True, allow_ellipsis=True))
    check(lambda a: a[index], lambda a: a[index], gnp.asarray(x))
    check(lambda a: gnp.getitem(a, index), lambda a: a[index], x)


def index_arrays(draw, shape, n):
    """An int64 index array whose shape broadcasts against `shape`, with negative indices too."""
    drop = draw(st.integers(0, len(shape)))
    own = tuple(draw(st.sampled_from([1, d])) for d in shape[drop:])
    return draw(hnp.arrays(np.int64, own, elements=st.integers(-n, n - 1)))


@st.composite
def mixed_indices(draw):
    """(x, index): each axis gets a slice, an int or an index array (arrays broadcast
    together), and sometimes a None goes in between."""
    x = draw(arrays(shapes(min_dims=1, max_dims=4)))
    common = draw(shapes(max_dims=2, max_side=3))
    index = []
    for n in x.shape:
        kind = draw(st.sampled_from(["slice", "int", "array", "array"]))
        if kind == "slice":
            index.append(draw(st.slices(n)))
        elif kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        else:
            index.append(index_arrays(draw, common, n))
    index = index[:draw(st.integers(1, len(index)))]
    if draw(st.booleans()):  # a new axis, which also separates index arrays
        index.insert(draw(st.integers(0, len(index))), None)
    return x, tuple(index)


@given(case=mixed_indices())
def test_integer_array_indexing(case):
    x, index = case
    check(lambda a: gnp.getitem(a, index), lambda a: a[index], x)
    # The index arrays as traced arguments of the jitted function (and of the eager one).
    positions = [i for i, item in enumerate(index) if isinstance(item, np.ndarray)]

    def indexed(a, *arrays):
        items = list(index)
        for i, arr in zip(positions, arrays):
            items[i] = arr
        return a[tuple(items)]

    check(indexed, lambda a, *_: a[index], gnp.asarray(x), *(index[i] for i in positions))


@given(data=st.data())
def test_common_model_forms(data):
    n, c, v = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    logits = data.draw(arrays((n, c)))
    labels = data.draw(hnp.arrays(np.int32, (n,), elements=st.integers(0, c - 1)))
    table = data.draw(arrays((v, 3)))
    tokens = data.draw(hnp.arrays(np.int32, (2, n), elements=st.integers(-v, v - 1)))
    logits, table = gnp.asarray(logits), gnp.asarray(table)
    check(lambda lg, lb: lg[gnp.arange(n), lb], lambda lg, lb: lg[np.arange(n), lb], logits, labels)
    check(lambda lg, lb: lg[np.arange(n), lb], lambda lg, lb: lg[np.arange(n), lb], logits, labels)
    check(lambda t, k: t[k], lambda t, k: t[k], table, tokens)           # embedding lookup
    check(lambda t, k: t[:, k[0]], lambda t, k: t[:, k[0] % 3], table, tokens % 3)
    check(lambda t, k: t[k[0], 1:], lambda t, k: t[k[0], 1:], table, tokens)
    check(lambda t, k: t[k[0, 0]], lambda t, k: t[k[0, 0]], table, tokens)  # a traced scalar index


@given(data=st.data())
def test_take(data):
    x = data.draw(arrays(shapes(min_dims=1)))
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    n = x.size if axis is None else x.shape[axis]
    idx = index_arrays(data.draw, data.draw(shapes(max_dims=2, max_side=3)), n)
    check(lambda a, i: gnp.take(a, i, axis), lambda a, i: np.take(a, i, axis), x, idx)
    check(lambda a: gnp.take(a, idx.tolist(), axis), lambda a: np.take(a, idx, axis), x)


@given(data=st.data())
def test_take_along_axis(data):
    x = data.draw(arrays(shapes(min_dims=1)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    k = data.draw(st.integers(1, 4))
    shape = tuple(k if i == axis % x.ndim else data.draw(st.sampled_from([1, n])) for i, n in enumerate(x.shape))
    n = x.shape[axis]
    idx = data.draw(hnp.arrays(np.int32, shape, elements=st.integers(-n, n - 1)))
    check(lambda a, i: gnp.take_along_axis(a, i, axis), lambda a, i: np.take_along_axis(a, i, axis), x, idx)


def test_indexing_records_gather_and_slices():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    ir = str(glue.make_ir(lambda a: a[1:3, ::2])(x))
    assert "slice[" in ir and "gather" not in ir
    ir = str(glue.make_ir(lambda a: a[::-1])(x))
    assert "gather[axis=0" in ir and "iota" in ir
    ir = str(glue.make_ir(lambda a, i: a[:, i])(x, np.array([1, 2])))
    assert ir.count("gather[axis=1 batch_dims=0]") == 1
    ir = str(glue.make_ir(lambda a, i: gnp.take_along_axis(a, i, -1))(x, np.zeros((4, 2), np.int32)))
    assert "gather[axis=1 batch_dims=1]" in ir and "transpose" not in ir


def test_out_of_range_traced_indices_clamp():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = glue.jit(lambda a, i, j: a[i, j], backend="reference")(x, np.array([5, -7, 1]), np.array([0, 9, -1]))
    assert_matches(got, x[[2, 0, 1], [0, 3, 3]])


def raises_naming(error, fn, *parts):
    with pytest.raises(error) as info:
        fn()
    for part in parts + (HERE,):
        assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"


def test_boolean_masks_are_rejected():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    mask = x > 2
    raises_naming(GlueIndexError, lambda: gnp.asarray(x)[mask], "getitem", "f32[2,3]", "boolean mask")
    raises_naming(GlueIndexError, lambda: gnp.asarray(x)[gnp.asarray(mask)], "getitem", "boolean mask")
    raises_naming(GlueIndexError, lambda: gnp.asarray(x)[True], "getitem", "boolean mask")
    raises_naming(GlueIndexError, lambda: glue.jit(lambda a: a[a > 2], backend="reference")(x),
                  "getitem", "f32[2,3]", "boolean mask")
    raises_naming(GlueIndexError, lambda: glue.jit(lambda a, m: a[:, m], backend="reference")(x, mask[0]),
                  "getitem", "boolean mask")


def test_bad_indices():
    a = gnp.asarray(np.zeros((2, 3), np.float32))
    raises_naming(GlueIndexError, lambda: a[2], "getitem", "f32[2,3]", "index 2", "axis 0", "size 2")
    raises_naming(GlueIndexError, lambda: a[:, -4], "getitem", "index -4", "axis 1")
    raises_naming(GlueIndexError, lambda: a[[0, 5]], "getitem", "index 5")
    raises_naming(GlueIndexError, lambda: a[0, 0, 0], "getitem", "too many indices")
    raises_naming(GlueIndexError, lambda: a[..., 0, ...], "getitem", "single ellipsis")
    raises_naming(GlueIndexError, lambda: a[np.array([0.5])], "getitem", "float")
    raises_naming(GlueIndexError, lambda: a[np.zeros((2,), int), np.zeros((3,), int)], "getitem",
                  "[2]", "[3]", "broadcast")
    raises_naming(glue.GlueError, lambda: gnp.take_along_axis(a, np.zeros(3, int), 0), "take_along_axis",
                  "same rank")
