"""Blocked contractions that differ only in their sizes share one compiled module
(glue/backend_cpu/matmul.py, program.py): the code compiles in the numbers they have alike and
reads the others when it is called, and every contraction's results are the bits its own code
(all its sizes compiled in) gives, and match the float64 reference."""
import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue.backend_cpu.matmul import common_sizes
from glue.backend_cpu.target import host
from glue.ir import dtypes as dt
from glue.reference.compare import mismatch
from glue.settings import config

pytestmark = pytest.mark.usefixtures("x64")  # float64 operands are part of what is tested


def _data(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _contractions(program):
    return [s for s in program.sources.values() if s.kernel.kind == "contraction"]


def _compiled(fn, *args):
    return glue.jit(fn, backend="cpu").lower(*args).compile()


def _all_products(pairs):
    return [a @ b for a, b in pairs]


def test_a_layers_products_share_one_module():
    """x @ W for the shapes of a transformer layer's products: one code, three uses, each with
    its own sizes (and its own units of work); every result is the bits of the product compiled
    alone, whose code has all its sizes compiled in."""
    rng = np.random.default_rng(0)
    x, h = _data(rng, 96, 48), _data(rng, 96, 160)
    # (144 and 288 columns split into different units of work at 256-bit and at 512-bit vectors)
    pairs = [(x, _data(rng, 48, 144)), (x, _data(rng, 48, 288)), (h, _data(rng, 160, 48))]
    compiled = _compiled(_all_products, pairs)
    program = compiled.lowered.lowering["program"]
    (source,) = _contractions(program)
    launches = [use.launch for use in program.uses if use.key == source.key]
    assert len(launches) == 3 and len({launch.sizes for launch in launches}) == 3
    assert len({launch.units for launch in launches}) > 1
    assert None in source.compiled_in  # N and K differ: read when called
    for got, (a, b) in zip(compiled(pairs), pairs):
        (alone,) = _contractions(_compiled(lambda a, b: a @ b, a, b).lowered.lowering["program"])
        assert None not in alone.compiled_in  # alone, all its sizes are compiled in
        np.testing.assert_array_equal(np.asarray(got), np.asarray(glue.jit(lambda a, b: a @ b, backend="cpu")(a, b)))
        want = a.astype(np.float64) @ b
        assert mismatch(np.asarray(got), want, dt.float32, 8.0) is None


def test_what_every_use_has_alike_is_compiled_in():
    assert common_sizes([(1, 2, 3), (1, 5, 3), (1, 2, 4)]) == (1, None, None)
    assert common_sizes([(7, 8)]) == (7, 8)


def test_the_extents_a_flat_index_is_divided_by_stay_in_the_code():
    """Rows over (batch, sequence): the sequence length divides the flat row, so products over
    other sequence lengths have code of their own; other batch counts share it."""
    rng = np.random.default_rng(1)
    w = _data(rng, 32, 40)
    xs = [_data(rng, 3, 8, 32), _data(rng, 5, 8, 32), _data(rng, 3, 12, 32)]
    compiled = _compiled(lambda xs, w: [x @ w for x in xs], xs, w)
    assert len(_contractions(compiled.lowered.lowering["program"])) == 2
    for got, x in zip(compiled(xs, w), xs):
        assert mismatch(np.asarray(got), x.astype(np.float64) @ w, dt.float32, 8.0) is None


def test_shared_code_read_back_from_the_disk_cache(tmp_path):
    """Another program of the same products finds the shared object on disk: its uses still
    run with their own sizes and units, not those of the kernel the code was built for."""
    rng = np.random.default_rng(2)
    pairs = [(_data(rng, 40, 24), _data(rng, 24, 72)), (_data(rng, 40, 72), _data(rng, 72, 24))]
    with config.override(cache_dir=str(tmp_path)):
        first = [np.asarray(r) for r in _compiled(_all_products, pairs)(pairs)]
        gc.collect()  # the first program's code leaves this process
        again = _compiled(_all_products, pairs)
        assert {s.source for s in again.lowered.lowering.kernel_stats.values()} == {"disk"}
        for got, want in zip(again(pairs), first):
            np.testing.assert_array_equal(np.asarray(got), want)


# --- any sizes, any way of reading the operands -----------------------------------------------

LANES = host().vector_bits // 32  # float32 lanes of this host's vectors (8 with AVX2, 16 with AVX-512)
FORMS = {  # name: (fn of (a, b), a's shape for m, k, batch), b's shape for k, n, batch)
    "plain": (lambda a, b: a @ b, lambda m, k, bt: (m, k), lambda k, n, bt: (k, n)),
    "transposed right": (lambda a, b: a @ b.T, lambda m, k, bt: (m, k), lambda k, n, bt: (n, k)),
    "transposed left": (lambda a, b: a.T @ b, lambda m, k, bt: (k, m), lambda k, n, bt: (k, n)),
    "cast left": (lambda a, b: a.astype(gnp.float32) @ b, lambda m, k, bt: (m, k), lambda k, n, bt: (k, n)),
    "batched": (lambda a, b: gnp.einsum("bmk,bkn->bmn", a, b), lambda m, k, bt: (bt, m, k),
                lambda k, n, bt: (bt, k, n)),
    "epilogue": (lambda a, b: gnp.tanh(a @ b) * 2.0 + 1.0, lambda m, k, bt: (m, k), lambda k, n, bt: (k, n)),
    "outer": (lambda a, b: gnp.tensordot(a, b, axes=0), lambda m, k, bt: (m,), lambda k, n, bt: (n,)),  # no reduce dims
}


@st.composite
def _cases(draw):
    form = draw(st.sampled_from(sorted(FORMS)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    # extents of at least 2 (an extent of 1 is a broadcast, another structure) and columns of
    # at least a vector of float32 on this host (fewer take the row loop)
    sizes = draw(st.lists(st.tuples(st.integers(2, 40), st.integers(2, 70), st.integers(LANES, 60), st.integers(2, 3)),
                          min_size=2, max_size=3, unique=True))
    kc = draw(st.sampled_from([None, 1, 7, 32]))
    return form, dtype, sizes, kc


@settings(deadline=None)
@given(_cases(), st.integers(0, 2**32 - 1))
def test_contractions_of_other_sizes_share_code_and_keep_their_bits(case, seed):
    form, dtype, sizes, kc = case
    fn, left, right = FORMS[form]
    rng = np.random.default_rng(seed)
    left_dtype = np.float16 if form == "cast left" else dtype
    pairs = [(_data(rng, *left(m, k, bt), dtype=left_dtype), _data(rng, *right(k, n, bt), dtype=dtype))
             for m, k, n, bt in sizes]
    step = 2 * LANES * 4  # bytes of a packed B panel's row of float32 (two vectors)
    budgets = {"cpu_matmul_min_work": 0} if kc is None else {"cpu_matmul_min_work": 0, "cpu_matmul_l1_bytes": kc * step}
    with config.override(**budgets, cpu_parallel_threshold=0):
        compiled = _compiled(lambda pairs: [fn(a, b) for a, b in pairs], pairs)
        assert len(_contractions(compiled.lowered.lowering["program"])) == 1
        together = [np.asarray(r) for r in compiled(pairs)]
        alone = [np.asarray(glue.jit(fn, backend="cpu")(a, b)) for a, b in pairs]
    for got, own, (a, b) in zip(together, alone, pairs):
        np.testing.assert_array_equal(got, own)
        want = np.asarray(fn(a.astype(np.float64), b.astype(np.float64)))
        assert mismatch(got, want, dt.from_numpy(np.dtype(dtype)), 8.0) is None
