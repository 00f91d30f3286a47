"""`glue.random`: JAX's random numbers, from the same counter-based Threefry-2x32 hash.

A key is two uint32 words. `PRNGKey(seed)` makes a raw key (a uint32[2] array), `key(seed)` a
typed one (a `KeyArray` of shape ()); every function takes either and returns keys of the kind
it was given. Random bits are Threefry-2x32 (20 rounds) of a counter under the key, written in
glue primitives (uint32 adds, xors and shifts), so sampling traces into jit, batches under
vmap, lets grad through to a sampler's float parameters, and gives the same bits on every
backend. The bits, splits and folds are JAX's: with `threefry_partitionable` (JAX's default
since 0.5; `glue.config.update("jax_threefry_partitionable", False)` for the earlier scheme)
element i of a draw of `shape` hashes the 64-bit counter i; samplers turn bits into values as
JAX does (uniform floats from the mantissa bits, normals through erf_inv, ...), so values agree
with jax.random up to float rounding.

Typed keys are a convenience of concrete code: a transform (jit, vmap, grad) sees a typed key
argument as its uint32 data, and keys made inside a transform are raw. Each sampler is a
jitted function of its key and parameters, compiled once per shape and dtype (one fused kernel
for a plain draw); called inside a trace it is inlined.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import ml_dtypes
import numpy as np

import glue.numpy as gnp
from glue.errors import GlueError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.jit import jit
from glue.frontend.tracing import Tracer, bind, type_of
from glue.frontend.transforms import stop_gradient
from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.settings import config

__all__ = ["KeyArray", "PRNGKey", "bernoulli", "bits", "categorical", "choice", "exponential",
           "fold_in", "gumbel", "key", "key_data", "normal", "permutation", "randint", "split",
           "threefry_2x32", "truncated_normal", "uniform", "wrap_key_data"]

Shape = tuple[int, ...]
_U32 = dt.uint32
_KEY = TensorType((2,), _U32)


def _fail(fn: str, message: str) -> GlueError:
    return GlueTypeError(f"random.{fn}: {message} {describe_location(user_frame_location())}")


# --- keys -----------------------------------------------------------------------------------

class KeyArray:
    """Typed keys (JAX's key<fry> arrays): an array of `shape` whose elements are keys, held as
    their uint32 data of shape `shape + (2,)` (see `key_data`). Indexing and iterating give
    keys, and there are no operators on keys; what takes arrays (glue.numpy, transforms) sees
    a typed key as its data."""

    __slots__ = ("_data",)

    def __init__(self, data: Any):
        self._data = data

    @property
    def shape(self) -> Shape:
        return type_of(self._data).shape[:-1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> str:
        return "key<fry>"

    @property
    def aval(self) -> TensorType:
        """The type of the data: what a transform sees a typed key argument as."""
        return type_of(self._data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._data, dtype=dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise _fail("KeyArray", "len() of a single key")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: Any) -> "KeyArray":
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in index) or len(index) > self.ndim:
            raise _fail("KeyArray", f"index {index} must pick among the {self.ndim} key axes (no ...)")
        return KeyArray(gnp.asarray(self._data)[index])

    def __repr__(self) -> str:
        return f"KeyArray(shape={self.shape}, dtype=key<fry>, data={np.asarray(self._data).tolist()})"


def _typed(data: Any) -> Any:
    """Keys of `data`, typed where they are concrete (see the module docstring)."""
    return data if isinstance(data, Tracer) else KeyArray(data)


def key_data(keys: Any) -> Any:
    """The uint32 data of keys, of shape `keys.shape + (2,)` (a raw key is its own data)."""
    return keys._data if isinstance(keys, KeyArray) else keys


def wrap_key_data(key_bits_array: Any, *, impl: str | None = None) -> Any:
    """Typed keys whose data is `key_bits_array` (uint32, last axis 2)."""
    _check_impl("wrap_key_data", impl)
    data = gnp.asarray(key_bits_array)
    t = type_of(data)
    if t.dtype != _U32 or not t.shape or t.shape[-1] != 2:
        raise _fail("wrap_key_data", f"key data must be uint32 with a last axis of 2, not {t}")
    return _typed(data)


def _check_impl(fn: str, impl: Any) -> None:
    if impl not in (None, "threefry2x32", "threefry"):
        raise _fail(fn, f"glue implements the threefry2x32 PRNG only, not {impl!r}")


def _seed_words(fn: str, seed: Any) -> tuple[Any, Any]:
    """The two key words of an integer seed, as JAX's threefry_seed: the high and low 32 bits
    of the seed as a 64-bit integer (a Python int is one; without x64 it wraps to 32 bits)."""
    if isinstance(seed, (bool, float)):
        raise _fail(fn, f"the seed must be an integer, not {type(seed).__name__}")
    if isinstance(seed, int):
        if not -2 ** 63 <= seed < 2 ** 63:
            raise _fail(fn, f"the seed {seed} does not fit in 64 bits")
        seed = np.int64(seed) if dt.x64_enabled() else np.int64(seed).astype(np.int32)
    seed = gnp.asarray(seed)
    t = type_of(seed)
    if t.shape or not t.dtype.is_int:
        raise _fail(fn, f"the seed must be an integer scalar, not {t}")
    low = bind("convert_element_type", seed, new_dtype=_U32)
    if t.dtype.bits < 64:
        return np.uint32(0), low
    high = bind("shift_right_logical", seed, np.array(32, t.dtype.numpy)[()])
    return bind("convert_element_type", high, new_dtype=_U32), low


def _stack_words(w0: Any, w1: Any) -> Any:
    return gnp.stack([gnp.asarray(w0), gnp.asarray(w1)], axis=-1)


def PRNGKey(seed: Any, *, impl: str | None = None) -> Any:
    """A raw key (uint32[2]) from an integer seed, as `jax.random.PRNGKey`."""
    _check_impl("PRNGKey", impl)
    return _stack_words(*_seed_words("PRNGKey", seed))


def key(seed: Any, *, impl: str | None = None) -> Any:
    """A typed key (shape ()) from an integer seed, as `jax.random.key`."""
    _check_impl("key", impl)
    return _typed(_stack_words(*_seed_words("key", seed)))


def _single_key(fn: str, keys: Any) -> Any:
    """The uint32[2] data of a single key (typed or raw); a GlueError for anything else."""
    data = key_data(keys)
    t = type_of(data)
    if t != _KEY:
        what = f"typed keys of shape {t.shape[:-1]}" if isinstance(keys, KeyArray) else f"{t}"
        raise _fail(fn, f"needs a single key (a typed key of shape () or a raw uint32[2] key), not "
                        f"{what}; use glue.vmap to work on many keys")
    return data


def _words(fn: str, keys: Any) -> tuple[Any, Any]:
    """The two uint32 words of a single key (typed or raw), as rank-0 values."""
    data = _single_key(fn, keys)
    return tuple(bind("reshape", bind("slice", data, start=(i,), limit=(i + 1,), strides=(1,)), shape=())
                 for i in (0, 1))


def _like_keys(given: Any, data: Any) -> Any:
    return _typed(data) if isinstance(given, KeyArray) else data


# --- Threefry-2x32 --------------------------------------------------------------------------

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = 0x1BD11BDA


def _rotate_left(x: Any, bits: int) -> Any:
    return bind("or", bind("shift_left", x, np.uint32(bits)), bind("shift_right_logical", x, np.uint32(32 - bits)))


def _threefry(key0: Any, key1: Any, x0: Any, x1: Any) -> tuple[Any, Any]:
    """Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2,
    3"; Random123's threefry2x32_20): the pair of uint32 words (x0, x1) hashed under the key
    (key0, key1). Rank-0 operands broadcast against the others."""
    ks = (key0, key1, bind("xor", bind("xor", key0, key1), np.uint32(_KEY_PARITY)))
    x0, x1 = bind("add", x0, ks[0]), bind("add", x1, ks[1])
    for i in range(5):
        for bits in _ROTATIONS[i % 2]:
            x0 = bind("add", x0, x1)
            x1 = bind("xor", x0, _rotate_left(x1, bits))
        x0 = bind("add", x0, ks[(i + 1) % 3])
        x1 = bind("add", bind("add", x1, ks[(i + 2) % 3]), np.uint32(i + 1))
    return x0, x1


def threefry_2x32(keypair: Sequence[Any], count: Any) -> Any:
    """JAX's threefry_2x32: the uint32 array `count` hashed under the key words `keypair`, as
    pairs of its flat halves (padded with a 0 to even length), in count's shape."""
    key0, key1 = (gnp.astype(k, _U32) for k in keypair)
    count = gnp.asarray(count)
    t = type_of(count)
    if t.dtype != _U32:
        raise _fail("threefry_2x32", f"count must be uint32, not {t}")
    flat = gnp.reshape(count, (t.size,))
    padded = gnp.concatenate([flat, gnp.zeros((t.size % 2,), _U32.numpy)])
    half = (t.size + 1) // 2
    hashed = gnp.concatenate(_threefry(key0, key1, padded[:half], padded[half:]))
    return gnp.reshape(hashed[:t.size], t.shape)


def _counters(shape: Shape) -> tuple[Any, Any]:
    """The (high, low) words of each element's row-major 64-bit index, for the partitionable
    scheme."""
    if not shape:
        return np.uint32(0), np.uint32(0)
    if math.prod(shape) > 2 ** 32:
        raise _fail("bits", f"draws of more than 2**32 elements (shape {shape}) are not supported")
    low: Any = None
    for d, stride in enumerate(np.cumprod((1,) + shape[:0:-1])[::-1].tolist()):
        term = bind("iota", dtype=_U32, shape=shape, dimension=d)
        term = term if stride == 1 else bind("mul", term, np.uint32(stride))
        low = term if low is None else bind("add", low, term)
    return np.uint32(0), low


def _count_words(key0: Any, key1: Any, words: int) -> Any:
    """JAX's threefry_2x32(key, iota(words)) of the earlier scheme: the counts (padded with a
    0 to even) are split into halves and hashed as pairs (i, i + half), and the two halves of
    the result are joined again. Each word is computed where it lands: word j comes from pair
    j (first half) or j - half (second half), one hash per word and no array joined."""
    if words >= 2 ** 32 - 1:
        raise _fail("bits", f"draws of {words} words or more are not supported")
    half = np.uint32((words + 1) // 2)
    j = bind("iota", dtype=_U32, shape=(words,), dimension=0)
    second = bind("ge", j, half)
    pair = gnp.where(second, bind("sub", j, half), j)
    partner = bind("add", pair, half)
    partner = gnp.where(bind("lt", partner, np.uint32(words)), partner, np.uint32(0))
    y0, y1 = _threefry(key0, key1, pair, partner)
    return gnp.where(second, y1, y0)


def _join_64(high: Any, low: Any) -> Any:
    wide = [bind("convert_element_type", w, new_dtype=dt.uint64) for w in (high, low)]
    return bind("or", bind("shift_left", wide[0], np.uint64(32)), wide[1])


def _random_bits(key0: Any, key1: Any, width: int, shape: Shape, partitionable: bool) -> Any:
    """uint{width} random bits of `shape`, as JAX's threefry_random_bits."""
    unsigned = dt.from_numpy(f"uint{width}")
    if math.prod(shape) == 0:
        return gnp.zeros(shape, unsigned.numpy)
    if partitionable:
        y0, y1 = _threefry(key0, key1, *_counters(shape))
        if width == 64:
            return _join_64(y0, y1)
        mixed = bind("xor", y0, y1)
        return mixed if width == 32 else bind("convert_element_type", mixed, new_dtype=unsigned)
    size = math.prod(shape)
    if width == 64:
        words = _count_words(key0, key1, 2 * size)
        return gnp.reshape(_join_64(words[:size], words[size:]), shape)
    if width == 32:
        return gnp.reshape(_count_words(key0, key1, size), shape)
    # 8 and 16 bits: each word's pieces, lowest first (a little-endian view of the words)
    words = _count_words(key0, key1, -(-width * size // 32))
    per_word = 32 // width
    pieces = (type_of(words).size, per_word)
    spread = bind("broadcast_in_dim", words, shape=pieces, dims=(0,))
    shifts = bind("mul", bind("iota", dtype=_U32, shape=pieces, dimension=1), np.uint32(width))
    masked = bind("and", bind("shift_right_logical", spread, shifts), np.uint32((1 << width) - 1))
    flat = gnp.reshape(masked, (pieces[0] * per_word,))[:size]
    return gnp.reshape(bind("convert_element_type", flat, new_dtype=unsigned), shape)


def _partitionable() -> bool:
    return config.threefry_partitionable


# --- shapes and dtypes ------------------------------------------------------------------------

def _shape(fn: str, shape: Any, *param_shapes: Shape) -> Shape:
    """`shape` as a tuple of ints, which the parameters' shapes must broadcast to."""
    if isinstance(shape, (int, np.integer)) or not isinstance(shape, Sequence) or \
            not all(isinstance(n, (int, np.integer)) and n >= 0 for n in shape):
        raise _fail(fn, f"shape must be a sequence of nonnegative ints, not {shape!r}")
    shape = tuple(int(n) for n in shape)
    if param_shapes and gnp.broadcast_shapes(shape, *param_shapes) != shape:
        raise _fail(fn, f"shape {shape} is not broadcast-compatible with the parameters' shapes "
                        f"{list(param_shapes)}")
    return shape


def _float_dtype(fn: str, dtype: Any) -> DType:
    d = gnp.to_dtype(dtype)
    if not d.is_float:
        raise _fail(fn, f"dtype argument must be a float dtype, not {d}")
    return d


def _int_dtype(fn: str, dtype: Any) -> DType:
    d = gnp.to_dtype(dtype)
    if not d.is_int:
        raise _fail(fn, f"dtype argument must be an integer dtype, not {d}")
    return d


def _param_shape(x: Any) -> Shape:
    return type_of(x).shape


# --- bits, split, fold_in -----------------------------------------------------------------------

@jit(static_argnums=(1, 2, 3))
def _bits(key_words: Any, width: int, shape: Shape, partitionable: bool) -> Any:
    return _random_bits(*_words("bits", key_words), width, shape, partitionable)


def bits(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Any:
    """Uniform random bits of an unsigned dtype (default: uint32, uint64 with x64)."""
    d = dt.default_uint() if dtype is None else gnp.to_dtype(dtype)
    if not d.is_unsigned:
        raise _fail("bits", f"dtype argument must be an unsigned integer dtype, not {d}")
    return _bits(_single_key("bits", key), d.bits, _shape("bits", shape), _partitionable())


@jit(static_argnums=(1, 2))
def _split(key_words: Any, shape: Shape, partitionable: bool) -> Any:
    key0, key1 = _words("split", key_words)
    if partitionable:
        return _stack_words(*_threefry(key0, key1, *_counters(shape)))
    return gnp.reshape(_count_words(key0, key1, 2 * math.prod(shape)), shape + (2,))


def _split_in_two(key0: Any, key1: Any, partitionable: bool) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The words of split(key)'s two keys, each computed on its own (a sampler that splits its
    key uses them as scalars, with no array of keys to index)."""
    if partitionable:
        return _threefry(key0, key1, np.uint32(0), np.uint32(0)), _threefry(key0, key1, np.uint32(0), np.uint32(1))
    # the counts 0..3 hashed as the pairs (0, 2) and (1, 3); the key words are the results in order
    (a0, a1), (b0, b1) = (_threefry(key0, key1, np.uint32(i), np.uint32(i + 2)) for i in (0, 1))
    return (a0, b0), (a1, b1)


def split(key: Any, num: int | Sequence[int] = 2) -> Any:
    """`num` new keys (or keys of shape `num`) from one key, as `jax.random.split`."""
    shape = (num,) if isinstance(num, (int, np.integer)) else num
    return _like_keys(key, _split(_single_key("split", key), _shape("split", shape), _partitionable()))


@jit
def _fold_in(key_words: Any, data: Any) -> Any:
    key0, key1 = _words("fold_in", key_words)
    return _stack_words(*_threefry(key0, key1, np.uint32(0), bind("convert_element_type", data, new_dtype=_U32)))


def fold_in(key: Any, data: Any) -> Any:
    """A new key from a key and an integer (a step number, a device index, ...)."""
    raw_key = _single_key("fold_in", key)
    if isinstance(data, int) and not isinstance(data, bool):
        data = gnp.astype(data, gnp.to_dtype(np.uint32 if data >= 0 else np.int32))
    t = type_of(data)
    if t.shape or not t.dtype.is_int:
        raise _fail("fold_in", f"data must be an integer scalar, not {t}")
    return _like_keys(key, _fold_in(raw_key, data))


# --- floats -------------------------------------------------------------------------------------

def _scalar(value: float, dtype: DType) -> Any:
    """`value` as a NumPy scalar of `dtype`: a literal of that dtype (a Python float is weak)."""
    return np.array(value, dtype.numpy)[()]


def _uniform_floats(key0: Any, key1: Any, shape: Shape, dtype: DType, partitionable: bool) -> Any:
    """Floats in [0, 1): random mantissa bits under the exponent of 1.0, less 1 (as JAX)."""
    mantissa = int(ml_dtypes.finfo(dtype.numpy).nmant)
    width = 8 if mantissa < 8 else dtype.bits  # bfloat16 draws a byte per value
    unsigned = dt.from_numpy(f"uint{dtype.bits}")
    raw = _random_bits(key0, key1, width, shape, partitionable)
    raw = raw if width == dtype.bits else bind("convert_element_type", raw, new_dtype=unsigned)
    one = np.array(1.0, dtype.numpy)
    shifted = bind("shift_right_logical", raw, np.array(width - mantissa, unsigned.numpy)[()])
    floats = bind("bitcast_convert_type", bind("or", shifted, one.view(unsigned.numpy)[()]), new_dtype=dtype)
    return bind("sub", floats, one[()])


def _scaled(floats: Any, minval: Any, maxval: Any, dtype: DType) -> Any:
    lo, hi = gnp.astype(minval, dtype), gnp.astype(maxval, dtype)
    return gnp.maximum(lo, floats * (hi - lo) + lo)


@jit(static_argnums=(1, 2, 5))
def _uniform(key_words: Any, shape: Shape, dtype: DType, minval: Any, maxval: Any, partitionable: bool) -> Any:
    floats = _uniform_floats(*_words("uniform", key_words), shape, dtype, partitionable)
    return _scaled(floats, minval, maxval, dtype)


def uniform(key: Any, shape: Sequence[int] = (), dtype: Any = float, minval: Any = 0.0, maxval: Any = 1.0) -> Any:
    """Floats uniform in [minval, maxval), as `jax.random.uniform`."""
    d = _float_dtype("uniform", dtype)
    shape = _shape("uniform", shape, _param_shape(minval), _param_shape(maxval))
    return _uniform(_single_key("uniform", key), shape, d, minval, maxval, _partitionable())


# Mike Giles, "Approximating the erfinv function" (GPU Gems 4): the single-precision
# polynomials in w = -log(1 - x^2), for w < 5 and beyond; XLA's ErfInv uses them for float32.
_ERF_INV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERF_INV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                 -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _in_float32(fn: Any, x: Any) -> Any:
    """fn(x), computed in float32 for a 16-bit float x and rounded back (as XLA computes erf
    and erf_inv for them)."""
    dtype = type_of(x).dtype
    if dtype.bits != 16:
        return fn(x)
    return gnp.astype(fn(gnp.astype(x, dt.float32)), dtype)


def _erf_inv(x: Any) -> Any:
    """The inverse of erf (XLA's ErfInv for float32: Giles' polynomials, erf_inv(+-1) = +-inf);
    float64 refines the float32 approximation with two Newton steps on erf, to about 1e-14
    relative away from the far tails."""
    dtype = type_of(x).dtype
    typed = functools.partial(_scalar, dtype=dtype)
    # Where a branch is not taken its operand is made harmless, so that no infinite slope
    # (log1p at -1, sqrt at 0) meets a zero cotangent in grad and makes a NaN.
    edge = gnp.abs(x) == 1.0
    inside = gnp.where(edge, typed(0.0), x)
    w = -gnp.log1p(-inside * inside)
    central = w < 5.0
    w = gnp.where(central, w - 2.5, gnp.sqrt(gnp.where(central, typed(5.0), w)) - 3.0)
    p: Any = gnp.where(central, typed(_ERF_INV_CENTRAL[0]), typed(_ERF_INV_TAIL[0]))
    for near, far in zip(_ERF_INV_CENTRAL[1:], _ERF_INV_TAIL[1:]):
        p = gnp.where(central, typed(near), typed(far)) + p * w
    y = p * inside
    if dtype == dt.float64:
        for _ in range(2):
            y = y - (bind("erf", y) - inside) / (_TWO_OVER_SQRT_PI * gnp.exp(-y * y))
    return gnp.where(edge, stop_gradient(x) * np.inf, y)


def _next_toward_zero(value: float, dtype: DType) -> float:
    """The float of `dtype` next to `value` (nonzero) in the direction of 0."""
    unsigned = f"uint{dtype.bits}"
    return np.array(np.array(value, dtype.numpy).view(unsigned) - 1, unsigned).view(dtype.numpy).item()


@jit(static_argnums=(1, 2, 3))
def _normal(key_words: Any, shape: Shape, dtype: DType, partitionable: bool) -> Any:
    floats = _uniform_floats(*_words("normal", key_words), shape, dtype, partitionable)
    u = _scaled(floats, _next_toward_zero(-1.0, dtype), 1.0, dtype)
    return _scalar(math.sqrt(2.0), dtype) * _in_float32(_erf_inv, u)


def normal(key: Any, shape: Sequence[int] = (), dtype: Any = float) -> Any:
    """Standard normal floats, as `jax.random.normal` (sqrt(2) erf_inv(u), u uniform in (-1, 1))."""
    d = _float_dtype("normal", dtype)
    return _normal(_single_key("normal", key), _shape("normal", shape), d, _partitionable())


def _nextafter(x: Any, upward: bool) -> Any:
    """The float next to x toward +inf (or -inf), by its bits, as lax.nextafter: zero steps to
    the smallest subnormal of the direction's sign, NaN and the infinity ahead stay."""
    dtype = type_of(x).dtype
    unsigned = dt.from_numpy(f"uint{dtype.bits}")
    one = np.array(1, unsigned.numpy)[()]
    pattern = bind("bitcast_convert_type", x, new_dtype=unsigned)
    away_from_zero = (x > 0) if upward else (x < 0)
    stepped = gnp.where(away_from_zero, bind("add", pattern, one), bind("sub", pattern, one))
    smallest = np.array((0 if upward else 1 << (dtype.bits - 1)) | 1, unsigned.numpy)[()]
    moved = bind("bitcast_convert_type", gnp.where(x == 0, smallest, stepped), new_dtype=dtype)
    return gnp.where(gnp.isnan(x) | (x == (np.inf if upward else -np.inf)), x, moved)


@jit(static_argnums=(3, 4, 5))
def _truncated_normal(key_words: Any, lower: Any, upper: Any, shape: Shape, dtype: DType, partitionable: bool) -> Any:
    sqrt2 = _scalar(math.sqrt(2.0), dtype)
    lower, upper = gnp.astype(lower, dtype), gnp.astype(upper, dtype)
    a = _in_float32(lambda v: bind("erf", v), lower / sqrt2)
    b = _in_float32(lambda v: bind("erf", v), upper / sqrt2)
    floats = _uniform_floats(*_words("truncated_normal", key_words), shape, dtype, partitionable)
    out = sqrt2 * _in_float32(_erf_inv, _scaled(floats, a, b, dtype))
    # rounding (or u landing on a) must not push a value onto or past the bounds
    low = _nextafter(stop_gradient(lower), upward=True)
    high = _nextafter(stop_gradient(upper), upward=False)
    return gnp.clip(out, low, high)


def truncated_normal(key: Any, lower: Any, upper: Any, shape: Sequence[int] | None = None,
                     dtype: Any = float) -> Any:
    """Normal floats conditioned on lower < x < upper, as `jax.random.truncated_normal`."""
    d = _float_dtype("truncated_normal", dtype)
    bounds = (_param_shape(lower), _param_shape(upper))
    shape = gnp.broadcast_shapes(*bounds) if shape is None else _shape("truncated_normal", shape, *bounds)
    return _truncated_normal(_single_key("truncated_normal", key), lower, upper, tuple(shape), d, _partitionable())


def bernoulli(key: Any, p: Any = 0.5, shape: Sequence[int] | None = None) -> Any:
    """Booleans that are True with probability p, as `jax.random.bernoulli`."""
    d = dt.default_float() if isinstance(p, (int, float)) else type_of(p).dtype
    if not d.is_float:
        raise _fail("bernoulli", f"p must be a float probability, not {type_of(p)}")
    shape = _param_shape(p) if shape is None else _shape("bernoulli", shape, _param_shape(p))
    return uniform(key, shape, d) < p


def exponential(key: Any, shape: Sequence[int] = (), dtype: Any = float) -> Any:
    """Exponentially distributed floats (rate 1): -log(1 - u)."""
    u = uniform(key, shape, _float_dtype("exponential", dtype))
    return -gnp.log1p(-u)


def gumbel(key: Any, shape: Sequence[int] = (), dtype: Any = float) -> Any:
    """Standard Gumbel floats: -log(-log(u)), u uniform in [tiny, 1)."""
    d = _float_dtype("gumbel", dtype)
    tiny = float(ml_dtypes.finfo(d.numpy).tiny)
    return -gnp.log(-gnp.log(uniform(key, shape, d, minval=tiny, maxval=1.0)))


# --- integers -----------------------------------------------------------------------------------

def _clip_into(x: Any, dtype: DType) -> Any:
    """An integer value clipped into `dtype`'s range, then converted (JAX's
    _convert_and_clip_integer)."""
    own = type_of(x).dtype
    lo = max(np.iinfo(dtype.numpy).min, np.iinfo(own.numpy).min)
    hi = min(np.iinfo(dtype.numpy).max, np.iinfo(own.numpy).max)
    bounds = [np.array(v, own.numpy)[()] for v in (lo, hi)]
    return bind("convert_element_type", gnp.clip(x, *bounds), new_dtype=dtype)


def _integer_bound(value: Any) -> Any:
    """A bound of randint as an integer array (a float bound is converted, as JAX does)."""
    value = gnp.asarray(value)
    return value if type_of(value).dtype.is_int else gnp.astype(value, dt.default_int())


@jit(static_argnums=(3, 4, 5))
def _randint(key_words: Any, minval: Any, maxval: Any, shape: Shape, dtype: DType, partitionable: bool) -> Any:
    unsigned = dt.from_numpy(f"uint{dtype.bits}")
    top = np.array(np.iinfo(dtype.numpy).max, dtype.numpy)[()]
    # maxval past the dtype's range: the span is one larger (randint(key, s, 0, 256, uint8))
    beyond = gnp.asarray(maxval) > _clip_into(gnp.asarray(top), type_of(maxval).dtype)
    lo, hi = _clip_into(minval, dtype), _clip_into(maxval, dtype)
    lo, hi = gnp.broadcast_to(lo, shape), gnp.broadcast_to(hi, shape)
    beyond = gnp.broadcast_to(beyond, shape)
    # Twice the bits the dtype needs, to shrink the bias of the remainder.
    first, second = _split_in_two(*_words("randint", key_words), partitionable)
    higher = _random_bits(*first, dtype.bits, shape, partitionable)
    lower = _random_bits(*second, dtype.bits, shape, partitionable)
    one = np.array(1, unsigned.numpy)[()]
    span = bind("convert_element_type", bind("sub", hi, lo), new_dtype=unsigned)
    span = gnp.where(hi <= lo, one, span)
    span = gnp.where(beyond & (hi > lo), bind("add", span, one), span)
    # (higher * 2**bits + lower) % span without overflow: (a * b) % n = ((a % n) * (b % n)) % n
    multiplier = bind("rem", gnp.full(shape, 2 ** (dtype.bits // 2), unsigned.numpy), span)
    multiplier = bind("rem", bind("mul", multiplier, multiplier), span)
    offset = bind("add", bind("mul", bind("rem", higher, span), multiplier), bind("rem", lower, span))
    offset = bind("rem", offset, span)
    return bind("add", lo, bind("convert_element_type", offset, new_dtype=dtype))


def randint(key: Any, shape: Sequence[int], minval: Any, maxval: Any, dtype: Any = int) -> Any:
    """Integers uniform in [minval, maxval), as `jax.random.randint` (with its small bias when
    the span is no power of two)."""
    d = _int_dtype("randint", dtype)
    minval, maxval = _integer_bound(minval), _integer_bound(maxval)
    shape = _shape("randint", shape, _param_shape(minval), _param_shape(maxval))
    return _randint(_single_key("randint", key), minval, maxval, shape, d, _partitionable())


# --- orderings: permutation, choice, categorical -------------------------------------------------

def _ranks(values: Any, descending: bool) -> Any:
    """Each element's position in a stable sort of the last axis of `values` (int32)."""
    n = type_of(values).shape[-1]
    mine = gnp.expand_dims(values, -1)
    others = gnp.expand_dims(values, -2)
    ahead = (others > mine) if descending else (others < mine)
    position = gnp.arange(n)
    tie_before = (others == mine) & (gnp.expand_dims(position, -1) > position)
    return gnp.sum(ahead | tie_before, axis=-1, dtype=dt.int32)


def _positions_of_ranks(ranks: Any, count: int) -> Any:
    """For each rank r < count, the index whose rank is r (an inverse permutation)."""
    n = type_of(ranks).shape[-1]
    wanted = gnp.arange(count)
    hits = gnp.expand_dims(ranks, -2) == gnp.expand_dims(wanted, -1)
    return gnp.sum(gnp.where(hits, gnp.arange(n), 0), axis=-1, dtype=dt.int32)


def _sorted_by(keys: Any, x: Any, axis: int) -> Any:
    """x reordered along `axis` by a stable ascending sort of `keys` (JAX's sort_key_val)."""
    keys, x = gnp.moveaxis(keys, axis, -1), gnp.moveaxis(x, axis, -1)
    order = _positions_of_ranks(_ranks(keys, descending=False), type_of(keys).shape[-1])
    return gnp.moveaxis(gnp.take_along_axis(x, order, axis=-1), -1, axis)


def _top_k_indices(values: Any, k: int) -> Any:
    """Indices of the k largest entries of the last axis, largest first (ties: lower index)."""
    return _positions_of_ranks(_ranks(values, descending=True), k)


@jit(static_argnums=(2, 3))
def _shuffle(key_words: Any, x: Any, axis: int, partitionable: bool) -> Any:
    # JAX: enough rounds of sorting by 32-bit random keys that ties are unlikely
    size = type_of(x).size
    rounds = math.ceil(3 * math.log(max(1, size)) / math.log(2 ** 32 - 1))
    words = _words("permutation", key_words)
    for _ in range(rounds):
        words, subkey = _split_in_two(*words, partitionable)
        x = _sorted_by(_random_bits(*subkey, 32, type_of(x).shape, partitionable), x, axis)
    return x


def permutation(key: Any, x: Any, axis: int = 0, independent: bool = False) -> Any:
    """A random permutation of range(x) (an int x) or of x along `axis`, as
    `jax.random.permutation` (`independent`: each slice shuffled on its own)."""
    raw_key = _single_key("permutation", key)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return _shuffle(raw_key, gnp.arange(int(x)), 0, _partitionable())
    x = gnp.asarray(x)
    t = type_of(x)
    if not t.shape:
        raise _fail("permutation", f"x must be an int or an array of rank 1 or more, not {t}")
    axis = _axis("permutation", axis, t.ndim)
    if independent or t.ndim == 1:
        return _shuffle(raw_key, x, axis, _partitionable())
    order = _shuffle(raw_key, gnp.arange(t.shape[axis]), 0, _partitionable())
    return gnp.take(x, order, axis=axis)


def _axis(fn: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise _fail(fn, f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def _cumulative(p: Any) -> Any:
    n = type_of(p).shape[0]
    upto = gnp.arange(n)[None, :] <= gnp.arange(n)[:, None]
    return gnp.sum(gnp.where(upto, p[None, :], 0), axis=1)


def choice(key: Any, a: Any, shape: Sequence[int] = (), replace: bool = True, p: Any = None, axis: int = 0) -> Any:
    """Draws from range(a) (an int a) or from a's slices along `axis`, with or without
    replacement, uniformly or with probabilities p, as `jax.random.choice`."""
    shape = _shape("choice", shape)
    arr = gnp.asarray(a)
    t = type_of(arr)
    if t.shape:
        axis = _axis("choice", axis, t.ndim)
        n_inputs = t.shape[axis]
    elif isinstance(a, (int, np.integer)):
        n_inputs = int(a)
    else:
        raise _fail("choice", f"a must be an int or an array of rank 1 or more, not {t}")
    n_draws = math.prod(shape)
    if n_draws == 0:
        return gnp.zeros(shape, t.dtype.numpy)
    if n_inputs <= 0:
        raise _fail("choice", "a must be greater than 0 unless no samples are taken")
    if not replace and n_draws > n_inputs:
        raise _fail("choice", f"cannot take a larger sample (size {n_draws}) than the population "
                              f"(size {n_inputs}) when replace=False")
    if p is None:
        if replace:
            ind = randint(key, shape, 0, n_inputs)
        else:
            ind = permutation(key, n_inputs)[:n_draws]
    else:
        p = gnp.asarray(p)
        if not type_of(p).dtype.is_float:
            p = gnp.astype(p, dt.default_float())
        if type_of(p).shape != (n_inputs,):
            raise _fail("choice", f"p must have the shape of a's axis ({n_inputs},), not {type_of(p).shape}")
        if replace:
            cumulative = _cumulative(p)
            r = cumulative[-1] * (1 - uniform(key, shape, dtype=type_of(p).dtype))
            ind = gnp.sum(gnp.expand_dims(cumulative, tuple(range(len(shape)))) < gnp.expand_dims(r, -1),
                          axis=-1, dtype=dt.int32)
        else:
            g = gumbel(key, (n_inputs,), type_of(p).dtype) + gnp.log(p)
            ind = _top_k_indices(g, n_draws)
    ind = gnp.reshape(ind, shape)
    if not t.shape:
        return ind
    flat = gnp.take(arr, gnp.reshape(ind, (n_draws,)), axis=axis)
    return gnp.reshape(flat, t.shape[:axis] + shape + t.shape[axis + 1:])


def categorical(key: Any, logits: Any, axis: int = -1, shape: Sequence[int] | None = None,
                replace: bool = True) -> Any:
    """Category indices drawn with probabilities softmax(logits) along `axis` (by the Gumbel
    max trick), as `jax.random.categorical`."""
    logits = gnp.asarray(logits)
    t = type_of(logits)
    if not t.shape or not t.dtype.is_float:
        raise _fail("categorical", f"logits must be floats with at least one axis, not {t}")
    axis = _axis("categorical", axis, t.ndim) - t.ndim  # counted from the end
    batch = t.shape[:t.ndim + axis] + t.shape[t.ndim + axis + 1:]
    shape = batch if shape is None else _shape("categorical", shape, batch)
    prefix = shape[:len(shape) - len(batch)]
    if replace:
        logits_shape = list(shape[len(shape) - len(batch):])
        logits_shape.insert(axis % t.ndim, t.shape[axis])
        noise = gumbel(key, (*prefix, *logits_shape), t.dtype)
        return gnp.argmax(noise + gnp.reshape(logits, (1,) * len(prefix) + t.shape), axis=axis)
    draws = math.prod(prefix)
    if draws > t.shape[axis]:
        raise _fail("categorical", f"cannot draw {draws} categories of {t.shape[axis]} without replacement")
    scores = gnp.moveaxis(gumbel(key, t.shape, t.dtype) + logits, axis, -1)
    ind = _top_k_indices(scores, draws)  # (*batch, draws)
    return gnp.reshape(gnp.moveaxis(ind, -1, 0), prefix + batch)
