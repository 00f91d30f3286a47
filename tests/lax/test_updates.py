"""x.at[index].get/set/add/multiply/min/max/apply against NumPy with JAX's semantics: negative
indices count from the end, out-of-range ones are clamped for get and dropped for updates, the
last of repeated positions wins a set, and add/multiply/min/max combine them (np.add.at ...);
static and traced indices, eagerly and under jit, and their gradients."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp

# The NumPy references compute in float64, so the programs keep their float64 inputs wide.
pytestmark = pytest.mark.usefixtures("x64")

MARGIN = 8  # wider than any out-of-range index or slice step drawn below


@st.composite
def indexed(draw):
    """(x, index, the positions of index's arrays in it): ints, slices, None, Ellipsis and
    integer arrays (one broadcastable shape), with repeats, negatives and out-of-range values."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.normal(size=shape)
    n_axes = draw(st.integers(1, len(shape)))
    array_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    items, arrays = [], []
    for axis in range(n_axes):
        n = shape[axis]
        kind = draw(st.sampled_from(["int", "slice", "array"]))
        if kind == "int":
            items.append(draw(st.integers(-n - 2, n + 1)))
        elif kind == "slice":
            step = draw(st.sampled_from([None, 1, 2, -1, -2]))
            start = draw(st.none() | st.integers(-n - 1, n))
            stop = draw(st.none() | st.integers(-n - 1, n))
            items.append(slice(start, stop, step))
        else:
            arrays.append(len(items))
            items.append(rng.integers(-n - 2, n + 2, array_shape).astype(np.int32))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(items)))
        items.insert(at, None)
        arrays = [k + (k >= at) for k in arrays]
    if draw(st.booleans()) and n_axes < len(shape):
        items.append(Ellipsis)
    return x, tuple(items), arrays


def _expanded(index, ndim):
    """The index with its Ellipsis (or the axes it leaves out at the end) as whole slices, and
    negative integers counted from the end: a list of (item, axis of x or None)."""
    explicit = sum(1 for i in index if i is not None and i is not Ellipsis)
    items = []
    for item in index:
        items += [slice(None)] * (ndim - explicit) if item is Ellipsis else [item]
    if not any(i is Ellipsis for i in index):
        items += [slice(None)] * (ndim - explicit)
    out, axis = [], 0
    for item in items:
        if item is None:
            out.append((None, None))
            continue
        out.append((item, axis))
        axis += 1
    return out


def _reference_update(x, index, values, op):
    """The update through NumPy on x padded by MARGIN: out-of-range positions land in the margin."""
    padded = np.pad(x, MARGIN, constant_values=np.nan)
    key = []
    for item, axis in _expanded(index, x.ndim):
        if axis is None:
            key.append(None)
            continue
        n = x.shape[axis]
        if isinstance(item, slice):
            r = range(n)[item]
            key.append(slice(r.start + MARGIN, r.start + MARGIN + len(r) * r.step, r.step) if len(r)
                       else slice(MARGIN, MARGIN))
        else:
            key.append(np.where(np.asarray(item) < 0, np.asarray(item) + n, item) + MARGIN)
    key = tuple(key)
    v = np.broadcast_to(values, padded[key].shape)
    if op == "set":
        padded[key] = v
    else:
        {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[op].at(padded, key, v)
    return padded[tuple(slice(MARGIN, MARGIN + n) for n in x.shape)]


def _reference_get(x, index):
    key = []
    for item, axis in _expanded(index, x.ndim):
        if axis is not None and not isinstance(item, slice):
            n = x.shape[axis]
            item = np.clip(np.where(np.asarray(item) < 0, np.asarray(item) + n, item), 0, n - 1)
        key.append(item)
    return x[tuple(key)]


OPS = {"set": "set", "add": "add", "mul": "multiply", "min": "min", "max": "max"}


@given(case=indexed(), op=st.sampled_from(sorted(OPS)), traced=st.booleans())
def test_updates_match_numpy(case, op, traced):
    x, index, arrays = case
    view = _reference_get(x, index).shape
    values = np.random.default_rng(0).normal(size=view)
    want = _reference_update(x, index, values, op)

    def update(x, values, *idx):
        full = list(index)
        for k, i in zip(arrays, idx):
            full[k] = i
        return getattr(x.at[tuple(full)], OPS[op])(values)

    given_arrays = [index[k] for k in arrays]
    got = glue.jit(update, backend="cpu")(x, values, *given_arrays) if traced else \
        update(glue.Array(x), values, *given_arrays)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12 if op != "mul" else 1e-10)


@given(case=indexed(), traced=st.booleans())
def test_get_clamps_and_fills(case, traced):
    x, index, arrays = case

    def get(x, *idx, **kw):
        full = list(index)
        for k, i in zip(arrays, idx):
            full[k] = i
        return x.at[tuple(full)].get(**kw)

    given_arrays = [index[k] for k in arrays]
    fn = glue.jit(get, backend="reference") if traced else get
    np.testing.assert_array_equal(np.asarray(fn(glue.Array(x) if not traced else x, *given_arrays)),
                                  _reference_get(x, index))


def test_modes_and_special_values():
    x = np.zeros(5, np.float32)
    assert list(np.asarray(glue.Array(x).at[7].set(1.0))) == [0] * 5  # dropped
    assert list(np.asarray(glue.Array(x).at[7].set(1.0, mode="clip"))) == [0, 0, 0, 0, 1]
    got = glue.Array(np.arange(5.0)).at[np.array([1, 9])].get(mode="fill", fill_value=-1.0)
    assert list(np.asarray(got)) == [1.0, -1.0]
    assert np.isnan(np.asarray(glue.Array(np.arange(5.0)).at[9].get(mode="fill")))
    neg_zero = np.asarray(glue.Array(np.ones(2)).at[0].set(-0.0))
    assert np.signbit(neg_zero[0]) and neg_zero[1] == 1.0
    flags = glue.Array(np.zeros(3, bool)).at[np.array([0, 2])].set(True)
    assert list(np.asarray(flags)) == [True, False, True]
    counts = glue.Array(np.zeros(3, np.int32)).at[np.array([1, 1, 1])].add(2)
    assert list(np.asarray(counts)) == [0, 6, 0]
    applied = glue.Array(np.arange(4.0)).at[1:3].apply(lambda v: v * 10)
    assert list(np.asarray(applied)) == [0, 10, 20, 3]
    subtracted = glue.Array(np.ones(3)).at[np.array([0, 0])].subtract(1.0)
    assert list(np.asarray(subtracted)) == [-1, 1, 1]


def test_kv_cache_and_embedding_writes_under_jit():
    cache = np.zeros((2, 6, 4), np.float32)  # batch, positions, features

    @glue.jit
    def write(cache, pos, kv):
        return cache.at[:, pos].set(kv)

    out = np.asarray(write(cache, np.int32(3), np.ones((2, 4), np.float32)))
    assert out[:, 3].sum() == 8 and out.sum() == 8
    table = np.zeros((5, 3), np.float32)
    ids = np.array([1, 4, 1], np.int32)
    grads = glue.jit(lambda t, i, g: t.at[i].add(g), backend="cpu")(table, ids, np.ones((3, 3), np.float32))
    assert list(np.asarray(grads)[:, 0]) == [0, 2, 0, 0, 1]


def test_one_hot_updates_are_differentiable():
    rng = np.random.default_rng(1)
    x, v = rng.normal(size=(4, 3)), rng.normal(size=(3, 3))
    idx = np.array([2, 0, 2])

    def loss(x, v, op):
        return (getattr(gnp.asarray(x).at[idx], op)(v) ** 2).sum()

    for op in ("set", "add", "multiply", "max"):
        gx, gv = glue.grad(loss, argnums=(0, 1))(x, v, op)
        for arg, g in ((0, gx), (1, gv)):
            base = [x, v]
            fd = np.zeros_like(base[arg])
            for i in np.ndindex(fd.shape):
                up = [a.copy() for a in base]
                down = [a.copy() for a in base]
                up[arg][i] += 1e-6
                down[arg][i] -= 1e-6
                fd[i] = (float(loss(*up, op)) - float(loss(*down, op))) / 2e-6
            np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-6, err_msg=f"{op} argument {arg}")
    compiled = glue.jit(glue.grad(lambda x, v: loss(x, v, "set")), backend="cpu")(x.astype(np.float32),
                                                                                  v.astype(np.float32))
    np.testing.assert_allclose(np.asarray(compiled), np.asarray(glue.grad(lambda x: loss(x, v, "set"))(x)),
                               rtol=1e-5, atol=1e-6)


def test_bad_indices_are_clear_errors():
    x = glue.Array(np.zeros((2, 3)))
    with pytest.raises(glue.GlueError, match="boolean indices"):
        x.at[True].set(1.0)
    with pytest.raises(glue.GlueError, match="too many indices"):
        x.at[0, 0, 0].set(1.0)
    with pytest.raises(glue.GlueError, match="cannot be broadcast to the indexed shape"):
        x.at[0].set(np.ones(4))
    with pytest.raises(glue.GlueError, match="index arrays must be integers"):
        x.at[np.array([0.5])].get()
