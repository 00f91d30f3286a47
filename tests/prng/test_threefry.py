"""glue.random's bits against Random123's known answers, JAX's published values and an
independent NumPy model of JAX's PRNG (`jax_model`): seeds, split, fold_in, bits of every
width and uniform floats, under both of JAX's counter schemes, eagerly and under jit."""
from __future__ import annotations

import jax_model
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glue
from glue import random
from glue.settings import config

# Random123's known-answer vectors for threefry2x32_20 (kat_vectors): (counter, key, result).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]
SCHEMES = pytest.mark.parametrize("partitionable", [True, False], ids=["partitionable", "original"])
shapes = st.lists(st.integers(0, 5), max_size=3).map(tuple)
seeds = st.one_of(st.integers(-2 ** 31, 2 ** 31 - 1), st.sampled_from([0, 1, 42, -1, 2 ** 31, 2 ** 32 + 5]))


def u32(*values: int) -> np.ndarray:
    return np.array(values, np.uint32)


def traced(fn, *args):
    """fn(*args) under jit on the reference backend: the samplers' jitted cores are inlined into
    it, so the whole public path runs without compiling native code per shape (the backends are
    compared with each other in test_random_backends)."""
    return np.asarray(glue.jit(fn, backend="reference")(*args))


@pytest.mark.parametrize("counter, key, want", KNOWN_ANSWERS)
def test_threefry_matches_random123s_known_answers(counter, key, want):
    assert tuple(int(v[0]) for v in jax_model.threefry2x32(key, u32(counter[0]), u32(counter[1]))) == want
    assert tuple(np.asarray(random.threefry_2x32(key, u32(*counter))).tolist()) == want
    jitted = glue.jit(lambda k, c: random.threefry_2x32((k[0], k[1]), c))(u32(*key), u32(*counter))
    assert tuple(np.asarray(jitted).tolist()) == want


def test_threefry_2x32_hashes_the_halves_of_its_counts_as_pairs():
    counts = np.arange(7, dtype=np.uint32).reshape(7, 1)
    got = np.asarray(random.threefry_2x32((np.uint32(3), np.uint32(4)), counts))
    y0, y1 = jax_model.threefry2x32((3, 4), u32(0, 1, 2, 3), u32(4, 5, 6, 0))
    assert got.shape == (7, 1) and got.ravel().tolist() == np.concatenate([y0, y1])[:7].tolist()


def test_published_jax_values_of_the_original_scheme():
    """What JAX's documentation shows for PRNGKey(0) (before threefry_partitionable became
    the default): its split, and normal(key, (1,)) = -0.20584226."""
    with config.override(threefry_partitionable=False):
        assert np.asarray(random.split(random.PRNGKey(0))).tolist() == [[4146024105, 967050713],
                                                                         [2718843009, 1272950319]]
        assert np.asarray(random.normal(random.PRNGKey(0), (1,)))[0] == pytest.approx(-0.20584226, abs=1e-7)


# jax.random outputs recorded by public projects' tests and docs (values from real JAX runs):
# key_data(fold_in(key(seed), i)) for i = 0..12, which is also split(key(seed), 13) with the
# partitionable scheme; and, before it became the default, bits and normal of key(0).
JAX_FOLD_IN = {
    0: [(1797259609, 2579123966), (928981903, 3453687069), (4146024105, 2718843009), (2467461003, 3840466878),
        (2285895361, 433833334), (1524306142, 1887795613), (3792494674, 2909014575), (2716826189, 292468403),
        (2292653872, 931858003), (823147153, 450340679), (3668660785, 652965180), (255289810, 156206175),
        (2763346363, 124557586)],
    12345: [(1214163296, 439912094), (867802714, 3762255628), (795667951, 2300365598), (709272294, 1661227809),
            (305750198, 730924241), (1545186055, 432531754), (3552431482, 1517125165), (3645526921, 1314572738),
            (3549796694, 2529333308), (2657012232, 1416960692), (1763606390, 309040335), (3052679535, 1314812838),
            (2650252694, 1226034348)],
}


@pytest.mark.parametrize("seed", sorted(JAX_FOLD_IN))
def test_recorded_jax_keys(seed):
    want = [list(pair) for pair in JAX_FOLD_IN[seed]]
    key = random.key(seed)
    assert traced(lambda d: random.split(random.wrap_key_data(d), 13), random.key_data(key)).tolist() == want
    folded = traced(lambda d: glue.vmap(lambda i: random.fold_in(d, i))(np.arange(13, dtype=np.uint32)),
                    random.key_data(key))
    assert folded.tolist() == want


def test_recorded_jax_values_of_the_original_scheme():
    with config.override(threefry_partitionable=False):
        assert traced(lambda k: random.bits(k, (4,)), random.PRNGKey(0)).tolist() == \
            [4146024105, 967050713, 2718843009, 1272950319]
        np.testing.assert_allclose(traced(lambda k: random.normal(k, (2, 2)), random.PRNGKey(0)).ravel(),
                                   [1.8160863, -0.75488514, 0.33988908, -0.53483534], rtol=1e-6)


def test_partitionable_keys_hash_their_index():
    """The first key of a partitionable split is the hash of counter (0, 0): Random123's first
    known answer under the key (0, 0)."""
    assert np.asarray(random.split(random.PRNGKey(0)))[0].tolist() == [0x6B200159, 0x99BA4EFE]


@given(seeds)
def test_seeds_give_jaxs_keys(seed):
    assert np.asarray(random.PRNGKey(seed)).tolist() == jax_model.seed_key(seed, x64=False).tolist()
    assert np.asarray(random.key_data(random.key(seed))).tolist() == jax_model.seed_key(seed, x64=False).tolist()
    with config.override(enable_x64=True):
        assert np.asarray(random.PRNGKey(seed)).tolist() == jax_model.seed_key(seed, x64=True).tolist()


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int8])
def test_traced_seeds_give_the_same_keys(dtype):
    seed = np.array(-3 if np.dtype(dtype).kind == "i" else 7, dtype)
    want = jax_model.seed_key(int(seed), x64=False)
    assert traced(random.PRNGKey, seed).tolist() == want.tolist()


def test_a_64_bit_seed_splits_into_two_words_with_x64():
    with config.override(enable_x64=True):
        assert traced(random.PRNGKey, np.int64(2 ** 40 + 9)).tolist() == [256, 9]


@SCHEMES
@settings(deadline=None)
@given(seed=seeds, shape=st.lists(st.integers(1, 4), max_size=2).map(tuple))
def test_split_is_jaxs(partitionable, seed, shape):
    key = random.PRNGKey(seed)
    with config.override(threefry_partitionable=partitionable):
        got = traced(lambda k: random.split(k, shape if len(shape) != 1 else shape[0]), key)
    assert got.tolist() == jax_model.split(np.asarray(key), shape, partitionable).tolist()


def test_split_eagerly_and_of_typed_keys():
    key = random.key(3)
    want = jax_model.split(jax_model.seed_key(3, x64=False), (3,), True)
    keys = random.split(key, 3)
    assert isinstance(keys, random.KeyArray) and keys.shape == (3,)
    assert np.asarray(random.key_data(keys)).tolist() == want.tolist()
    assert [np.asarray(random.key_data(k)).tolist() for k in keys] == want.tolist()


@given(seed=seeds, data=st.integers(0, 2 ** 32 - 1))
def test_fold_in_is_jaxs(seed, data):
    key = random.PRNGKey(seed)
    want = jax_model.fold_in(np.asarray(key), data).tolist()
    assert traced(random.fold_in, key, np.uint32(data)).tolist() == want
    assert traced(lambda k: random.fold_in(k, data), key).tolist() == want


def test_fold_in_eagerly():
    key = random.PRNGKey(7)
    assert np.asarray(random.fold_in(key, 12)).tolist() == jax_model.fold_in(np.asarray(key), 12).tolist()


@SCHEMES
@pytest.mark.parametrize("width", [8, 16, 32, 64])
@settings(deadline=None, max_examples=max(4, settings.default.max_examples // 4))
@given(seed=seeds, shape=shapes)
def test_bits_of_every_width_are_jaxs(partitionable, width, seed, shape):
    key = random.PRNGKey(seed)
    with config.override(threefry_partitionable=partitionable, enable_x64=True):
        got = traced(lambda k: random.bits(k, shape, np.dtype(f"uint{width}")), key)
    want = jax_model.bits(np.asarray(key), width, shape, partitionable)
    assert got.dtype == want.dtype and got.shape == shape
    assert got.tolist() == want.tolist()


@SCHEMES
@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
@settings(deadline=None, max_examples=max(4, settings.default.max_examples // 4))
@given(seed=seeds, shape=shapes)
def test_uniform_floats_are_jaxs_bit_for_bit(partitionable, dtype, seed, shape):
    key = random.PRNGKey(seed)
    np_dtype = np.dtype(glue.ir.dtypes.from_numpy(dtype).numpy)
    with config.override(threefry_partitionable=partitionable):
        got = traced(lambda k: random.uniform(k, shape, dtype, minval=-2.0, maxval=3.0), key)
    want = jax_model.uniform(np.asarray(key), shape, np_dtype, partitionable, -2.0, 3.0)
    assert got.dtype == np_dtype
    assert np.atleast_1d(got).view(np.uint8).tolist() == np.atleast_1d(want).view(np.uint8).tolist()


def test_float64_uniform_with_x64():
    key = random.PRNGKey(5)
    with config.override(enable_x64=True):
        got = traced(lambda k: random.uniform(k, (7,), np.float64), key)
    assert got.dtype == np.float64
    assert got.tolist() == jax_model.uniform(np.asarray(key), (7,), np.float64, True).tolist()


@SCHEMES
def test_normals_are_sqrt2_erf_inv_of_jaxs_uniforms(partitionable):
    key = random.PRNGKey(11)
    with config.override(threefry_partitionable=partitionable):
        got = traced(lambda k: random.normal(k, (500,)), key)
    lo = np.nextafter(np.float32(-1), np.float32(0))
    u = jax_model.uniform(np.asarray(key), (500,), np.float32, partitionable, lo, 1.0)
    want = np.sqrt(2.0) * jax_model.erf_inv(u.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-7)


def test_float64_normals_are_accurate_with_x64():
    key = random.PRNGKey(2)
    with config.override(enable_x64=True):
        got = traced(lambda k: random.normal(k, (300,), np.float64), key)
    lo = np.nextafter(-1.0, 0.0)
    u = jax_model.uniform(np.asarray(key), (300,), np.float64, True, lo, 1.0)
    np.testing.assert_allclose(got, np.sqrt(2.0) * jax_model.erf_inv(u), rtol=1e-12, atol=1e-13)


def test_the_scheme_flag_changes_the_bits_and_reads_like_jaxs():
    key = random.PRNGKey(1)
    new = np.asarray(random.bits(key, (4,)))
    config.update("jax_threefry_partitionable", False)
    try:
        old = np.asarray(random.bits(key, (4,)))
    finally:
        config.update("jax_threefry_partitionable", True)
    assert new.tolist() == jax_model.bits(np.asarray(key), 32, (4,), True).tolist()
    assert old.tolist() == jax_model.bits(np.asarray(key), 32, (4,), False).tolist() != new.tolist()
