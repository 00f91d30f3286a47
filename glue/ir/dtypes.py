"""Element types of the IR and the promotion rules that combine them.

Promotion follows JAX's lattice (its "standard" mode):

    bool < int* < {uint8 < uint16 < uint32 < uint64, int8 < int16 < int32 < int64} < float*
    uint8 < int16, uint16 < int32, uint32 < int64, uint64 < float*, int64 < float*
    float* < {float16, bfloat16} < float32 < float64

where int* and float* are the weakly typed Python int and float. Two dtypes promote to their
least upper bound: an unsigned type meets a signed one at the next wider signed type, and
uint64 meets any signed type at float* (which, like int*, becomes the default dtype of its kind
when it is the result). A Python scalar is weak: it takes the dtype of the array it meets (a
Python float meeting an integer array gives the default float).

As in JAX, 64-bit types exist in a traced program only with x64 enabled (`glue.config
.update("jax_enable_x64", True)` or JAX_ENABLE_X64=1): otherwise `canonical` narrows float64,
int64 and uint64 to their 32-bit kin, and the defaults are int32 and float32. The IR itself
(and `from_numpy`) keeps every width, so kernels over 64-bit values compile either way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from glue.settings import config


@dataclass(frozen=True, eq=False)
class DType:
    """An element type; `name` is its short IR spelling (f32, bf16, i32, u8, bool, ...).
    `signed` says whether its values compare and widen as signed numbers (floats and signed
    ints; bool and unsigned ints do not).

    There is one DType object per type (the constants below; unpickling gives them back), so
    equality and hashing are by identity: every type, literal and compiler table hashes one."""

    name: str
    kind: str  # "bool" | "int" | "float"
    bits: int
    numpy_name: str
    signed: bool = True

    def __reduce__(self):
        return _named, (self.name,)

    @property
    def numpy(self) -> np.dtype:
        if self.name == "bf16":
            # imported on first use, so that a process that never meets a bfloat16 array (a
            # compile worker) skips its import: over a second with ml_dtypes 0.7
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.numpy_name)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "int" and not self.signed

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


bool_ = DType("bool", "bool", 8, "bool", signed=False)
int8 = DType("i8", "int", 8, "int8")
int16 = DType("i16", "int", 16, "int16")
int32 = DType("i32", "int", 32, "int32")
int64 = DType("i64", "int", 64, "int64")
uint8 = DType("u8", "int", 8, "uint8", signed=False)
uint16 = DType("u16", "int", 16, "uint16", signed=False)
uint32 = DType("u32", "int", 32, "uint32", signed=False)
uint64 = DType("u64", "int", 64, "uint64", signed=False)
float16 = DType("f16", "float", 16, "float16")
bfloat16 = DType("bf16", "float", 16, "bfloat16")
float32 = DType("f32", "float", 32, "float32")
float64 = DType("f64", "float", 64, "float64")

SIGNED_INT_DTYPES: tuple[DType, ...] = (int8, int16, int32, int64)
UNSIGNED_INT_DTYPES: tuple[DType, ...] = (uint8, uint16, uint32, uint64)
INT_DTYPES: tuple[DType, ...] = SIGNED_INT_DTYPES + UNSIGNED_INT_DTYPES
FLOAT_DTYPES: tuple[DType, ...] = (float16, bfloat16, float32, float64)
ALL_DTYPES: tuple[DType, ...] = (bool_,) + INT_DTYPES + FLOAT_DTYPES
BY_NAME: dict[str, DType] = {d.name: d for d in ALL_DTYPES}


def _named(name: str) -> DType:
    """The DType called `name` (how a pickled DType comes back)."""
    return BY_NAME[name]


# bfloat16 joins on its first lookup (its NumPy dtype is ml_dtypes', imported then)
_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in ALL_DTYPES if d.name != "bf16"}
_BY_NUMPY_NAME: dict[str, DType] = {d.numpy_name: d for d in ALL_DTYPES}

DEFAULT_INT = int32
DEFAULT_FLOAT = float32


def from_numpy(dt) -> DType:
    """The glue dtype of a NumPy dtype (or anything `np.dtype` accepts, or a DType), of the
    same width: this is the IR's mapping, which x64 does not change (see `canonical`)."""
    if isinstance(dt, DType):
        return dt
    known = _BY_NUMPY.get(dt) if isinstance(dt, np.dtype) else None
    if known is not None:  # the per-call path of jit: one dict lookup
        return known
    if isinstance(dt, str) and (dt in BY_NAME or dt in _BY_NUMPY_NAME):
        return BY_NAME.get(dt) or _BY_NUMPY_NAME[dt]
    try:
        npdt = np.dtype(dt)
    except TypeError:
        npdt = None
    for d in ALL_DTYPES:
        if npdt is not None and d.numpy == npdt:
            _BY_NUMPY[npdt] = d
            return d
    from glue.errors import GlueTypeError

    raise GlueTypeError(f"glue does not support the NumPy dtype {npdt if npdt is not None else dt!r}")


# --- x64 ------------------------------------------------------------------------------------

_NARROWED = {float64: float32, int64: int32, uint64: uint32}


def x64_enabled() -> bool:
    return config.enable_x64


def canonical(dtype: DType) -> DType:
    """The dtype a value of `dtype` has in a traced program: itself with x64 enabled, else
    64-bit types narrowed to 32 bits (as JAX's canonicalize_dtype)."""
    if dtype not in _NARROWED or x64_enabled():
        return dtype
    return _NARROWED[dtype]


def default_int() -> DType:
    return int64 if x64_enabled() else int32


def default_uint() -> DType:
    return uint64 if x64_enabled() else uint32


def default_float() -> DType:
    return float64 if x64_enabled() else float32


# --- the lattice ----------------------------------------------------------------------------

# The weakly typed Python scalars' places in the lattice.
WEAK_INT, WEAK_FLOAT = "int*", "float*"

_ABOVE: dict[DType | str, tuple[DType | str, ...]] = {
    bool_: (WEAK_INT,),
    WEAK_INT: (uint8, int8),
    uint8: (uint16, int16), uint16: (uint32, int32), uint32: (uint64, int64), uint64: (WEAK_FLOAT,),
    int8: (int16,), int16: (int32,), int32: (int64,), int64: (WEAK_FLOAT,),
    WEAK_FLOAT: (float16, bfloat16),
    float16: (float32,), bfloat16: (float32,), float32: (float64,), float64: (),
}


def _upper_set(node: DType | str) -> frozenset:
    out, todo = {node}, [node]
    while todo:
        for up in _ABOVE[todo.pop()]:
            if up not in out:
                out.add(up)
                todo.append(up)
    return frozenset(out)


_UPPER = {node: _upper_set(node) for node in _ABOVE}


def _join(a: DType | str, b: DType | str) -> DType | str:
    """The least upper bound of two lattice nodes (the lattice makes it unique)."""
    if a == b:  # most operands already share a dtype
        return a
    common = _UPPER[a] & _UPPER[b]
    return next(n for n in common if _UPPER[n] == common)


def _strong(node: DType | str) -> DType:
    """A join that landed on a weak node: the default dtype of its kind."""
    if node == WEAK_INT:
        return default_int()
    if node == WEAK_FLOAT:
        return default_float()
    return node


def promote(a: DType, b: DType) -> DType:
    """The dtype two strongly typed operands are converted to."""
    return a if a == b else _strong(_join(a, b))


def result_type(*operands) -> DType:
    """The dtype elementwise operands promote to in a traced program: DTypes are strong,
    Python scalars weak. The join is taken over all of them before a weak result becomes a
    default dtype, as in JAX (so int8, uint64 and float16 give float16, where pairwise
    promotion would give float32), and the result is `canonical` (uint32 and int32 meet at
    int64, which is int32 without x64)."""
    nodes = [op if isinstance(op, DType) else _weak_node(op) for op in operands]
    out = nodes[0]
    for node in nodes[1:]:
        out = _join(out, node)
    return canonical(_strong(out))


def weak_scalar_dtype(value) -> DType:
    """The dtype a Python scalar takes when it stands alone."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return default_int()
    return default_float()


def _weak_node(value) -> DType | str:
    if isinstance(value, (bool, np.bool_)):
        return bool_  # Python bools are not weak in JAX: bool is the bottom anyway
    return WEAK_INT if isinstance(value, (int, np.integer)) else WEAK_FLOAT
