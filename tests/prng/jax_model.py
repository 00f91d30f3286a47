"""JAX's PRNG, modelled in plain NumPy from its description, independently of glue.random:
Threefry-2x32 as Random123 states it (20 rounds, a key injection after every fourth), JAX's
seeding (the seed's high and low 32 bits), and both of its counter schemes for split, fold_in
and random bits (`partitionable`: element i hashes the 64-bit counter i and xors the two
words; otherwise the flat counters 0..n-1 are hashed as pairs of halves), and the uniform
floats JAX makes from bits.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

_R = (13, 15, 26, 6, 17, 29, 16, 24)  # rotation of round r is _R[r % 8]


def threefry2x32(key: tuple[int, int], x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Random123's threefry2x32_20, elementwise over uint32 arrays x0, x1."""
    with np.errstate(over="ignore"):
        ks = [np.uint32(key[0]), np.uint32(key[1])]
        ks.append(ks[0] ^ ks[1] ^ np.uint32(0x1BD11BDA))
        x0 = np.asarray(x0, np.uint32) + ks[0]
        x1 = np.asarray(x1, np.uint32) + ks[1]
        for r in range(20):
            x0 = x0 + x1
            x1 = (x1 << np.uint32(_R[r % 8])) | (x1 >> np.uint32(32 - _R[r % 8]))
            x1 = x1 ^ x0
            if r % 4 == 3:
                s = (r + 1) // 4
                x0 = x0 + ks[s % 3]
                x1 = x1 + ks[(s + 1) % 3] + np.uint32(s)
        return x0, x1


def seed_key(seed: int, x64: bool) -> np.ndarray:
    """jax.random.PRNGKey(seed): the seed as int64 (wrapped to int32 without x64); key words
    are its high and low 32 bits (the high word is 0 for a 32-bit seed)."""
    value = int(np.int64(seed)) if x64 else int(np.int64(seed).astype(np.int32))
    bits = value & (2 ** 64 - 1) if x64 else value & (2 ** 32 - 1)
    return np.array([bits >> 32, bits & 0xFFFFFFFF], np.uint32)


def _hash_flat(key: np.ndarray, counts: np.ndarray) -> np.ndarray:
    n = counts.size
    padded = np.concatenate([counts, np.zeros(n % 2, np.uint32)])
    half = padded.size // 2
    y0, y1 = threefry2x32(tuple(key), padded[:half], padded[half:])
    return np.concatenate([y0, y1])[:n]


def _index_words(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    return (index >> np.uint64(32)).astype(np.uint32), (index & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def split(key: np.ndarray, shape: tuple[int, ...], partitionable: bool) -> np.ndarray:
    if partitionable:
        return np.stack(threefry2x32(tuple(key), *_index_words(shape)), axis=-1)
    return _hash_flat(key, np.arange(2 * math.prod(shape), dtype=np.uint32)).reshape(shape + (2,))


def fold_in(key: np.ndarray, data: int) -> np.ndarray:
    y0, y1 = threefry2x32(tuple(key), np.zeros(1, np.uint32), np.array([data], np.uint32))
    return np.array([y0[0], y1[0]], np.uint32)


def bits(key: np.ndarray, width: int, shape: tuple[int, ...], partitionable: bool) -> np.ndarray:
    unsigned = np.dtype(f"uint{width}")
    size = math.prod(shape)
    if partitionable:
        y0, y1 = threefry2x32(tuple(key), *_index_words(shape))
        if width == 64:
            return (y0.astype(np.uint64) << np.uint64(32)) | y1.astype(np.uint64)
        return (y0 ^ y1).astype(unsigned)
    if width == 64:
        words = _hash_flat(key, np.arange(2 * size, dtype=np.uint32)).astype(np.uint64)
        return ((words[:size] << np.uint64(32)) | words[size:]).reshape(shape)
    words = _hash_flat(key, np.arange(-(-width * size // 32), dtype=np.uint32))
    return words.view(unsigned)[:size].reshape(shape)  # the words' bytes, little-endian


def uniform(key: np.ndarray, shape: tuple[int, ...], dtype, partitionable: bool,
            minval: float = 0.0, maxval: float = 1.0) -> np.ndarray:
    """JAX's uniform: mantissa bits under the exponent of 1.0, less one, scaled."""
    finfo = ml_dtypes.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    width = 8 if nmant < 8 else nbits
    unsigned = np.dtype(f"uint{nbits}")
    raw = bits(key, width, shape, partitionable).astype(unsigned)
    one = np.array(1.0, dtype)
    pattern = (raw >> unsigned.type(width - nmant)) | one.view(unsigned)
    floats = pattern.view(dtype) - one
    lo, hi = np.array(minval, dtype), np.array(maxval, dtype)
    return np.maximum(lo, (floats * (hi - lo) + lo).astype(dtype))


def erf_inv(y: np.ndarray) -> np.ndarray:
    """erf's inverse in float64 by bisection on math.erf (slow, exact enough to judge by)."""
    lo, hi = np.full(y.shape, -6.0), np.full(y.shape, 6.0)
    erf = np.vectorize(math.erf)
    for _ in range(80):
        mid = (lo + hi) / 2
        below = erf(mid) < y
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return (lo + hi) / 2
