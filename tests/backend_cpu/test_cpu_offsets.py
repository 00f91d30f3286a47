"""Constant read offsets moved into the operands' places (glue/backend_cpu/offsets.py): kernels
that read other slices of their inputs the same way share one compiled code, and every read
still reaches what the reference reads: slices, strides, reversals, pads, concatenations,
gathers and kernels written in place."""
import numpy as np
from hypothesis import given, settings, strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cpu import offsets
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch


def _program(fn, *args):
    return glue.jit(fn, backend="cpu").lower(*args).lowering["program"]


def _check(fn, *args):
    got = glue.jit(fn, backend="cpu")(*args)
    want = glue.jit(fn, backend="reference")(*args)
    for g, w in zip(glue.tree_util.tree_leaves(got), glue.tree_util.tree_leaves(want)):
        assert mismatch(np.asarray(g), np.asarray(w).astype(np.float64), dt.from_numpy(np.asarray(w).dtype)) is None


def test_kernels_reading_other_slices_share_code():
    """The tiles of one buffer, read by four programs: one code, four places."""
    x = np.arange(4 * 512, dtype=np.float32).reshape(4, 512) / 512
    tile = lambda t: lambda v: gnp.tanh(v[:, 128 * t:128 * (t + 1)]) * 3.0  # noqa: E731
    programs = [_program(tile(t), x) for t in range(4)]
    keys = [set(p.sources) for p in programs]
    assert all(k == keys[0] for k in keys) and len(keys[0]) == 1
    places = [use.places for p in programs for use in p.uses]
    assert len(set(places)) == 4  # the input's place moved on by 128 floats a tile
    assert [place[0].offset for place in places] == [0, 512, 1024, 1536]
    for t in range(4):
        _check(tile(t), x)


def test_what_stays_in_place():
    x = np.linspace(-1, 1, 64 * 8, dtype=np.float32).reshape(64, 8)
    ids = np.array([3, 0, 60, 63], np.int32)
    kernel = lambda fn, *args: _program(fn, *args).plan.kernels[0]  # noqa: E731
    # reads from element 0 on: nothing to move
    assert offsets.lift(kernel(lambda v: v * 2.0, x), frozenset()) is None
    # a pad reads x[i - 2] where i >= 2: its least read is element 0
    assert offsets.lift(kernel(lambda v: gnp.pad(v, ((2, 0), (0, 0))) + 1.0, x), frozenset()) is None
    # an input held fixed (an output shares its place) stays
    assert offsets.lift(kernel(lambda v: v[8:] * 2.0, x), frozenset({0})) is None
    moved, shifts = offsets.lift(kernel(lambda v: v[8:, 2:] * 2.0, x), frozenset())
    assert shifts == ((8 * 8 + 2) * 4,)
    # a gather's rows are data-dependent: the table stays where it is
    gathered = kernel(lambda v, i: gnp.take(v[4:], i, axis=0) + 1.0, x, ids)
    found = offsets.lift(gathered, frozenset())
    assert found is None or found[1][0] == 0


@st.composite
def _slicings(draw):
    rows, cols = draw(st.integers(1, 40)), draw(st.integers(1, 70))
    r0 = draw(st.integers(0, rows - 1))
    c0 = draw(st.integers(0, cols - 1))
    r1 = draw(st.integers(r0 + 1, rows))
    c1 = draw(st.integers(c0 + 1, cols))
    step = draw(st.sampled_from([1, 2, 3]))
    kind = draw(st.sampled_from(["slice", "reverse", "pad", "concat", "sum", "gather", "inplace"]))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    return rows, cols, (r0, r1, c0, c1, step), kind, dtype


@settings(deadline=None)
@given(_slicings(), st.integers(0, 2**32 - 1))
def test_moved_reads_match_the_reference(case, seed):
    rows, cols, (r0, r1, c0, c1, step), kind, dtype = case
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 8).astype(dtype)
    y = (rng.standard_normal((r1 - r0, cols)) * 8).astype(dtype)
    part = lambda v: v[r0:r1, c0:c1:step]  # noqa: E731
    fns = {
        "slice": lambda v, w: part(v) * 3 + part(v)[::-1],
        "reverse": lambda v, w: v[::-1][r0:r1, ::-1][:, c0:c1:step] - 1,
        "pad": lambda v, w: gnp.pad(part(v), ((1, 2), (3, 0))) + 2,
        "concat": lambda v, w: gnp.concatenate([part(v), w[:, c0:c1:step]], axis=0) * 2,
        "sum": lambda v, w: part(v).sum(axis=1) + v[r0:r1, c0:c1].max(axis=1),
        "gather": lambda v, w: gnp.take(v[r0:], gnp.arange(r1 - r0) % (rows - r0), axis=0)[:, c0:c1] + 1,
        "inplace": lambda v, w: (w[:, c0:] + v[r0:r1, c0:]) * 2,
    }
    _check(fns[kind], x, y)
