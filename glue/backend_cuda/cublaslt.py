"""Matrix products through cuBLASLt, NVIDIA's library, via nvmath-python's bindings (raw device
pointers and streams in, so calls run on glue's streams, use glue's memory and are captured in
glue's CUDA graphs). An optional extra (`pip install 'glue[cuda]'`): without it, `available()`
is False and glue runs its own kernels.

cuBLASLt's matrices are column-major; glue's views are row-major products
`C[b, m, n] = A[b, m, k] @ B[b, k, n]`. A row-major C is a column-major Cᵀ (n x m, the same
memory), and Cᵀ = Bᵀ Aᵀ, so cuBLASLt's first operand is glue's B and its second glue's A. A view
whose columns are contiguous ("row" layout) is, read column-major, its own transpose (op N);
one whose rows are contiguous ("col") is read as stored with op T.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from glue.errors import BackendError
from glue.ir import dtypes as dt
from glue.ir.dtypes import DType
from glue.scheduler.gemm import GemmSpec, View

log = logging.getLogger("glue")

# nvmath's cuBLASLt bindings (the optional extra), imported by the first `available()`: nvmath
# imports CUDA's Python packages and ml_dtypes, a second or more, which a process that imports
# this module without running products (a compile worker emitting kernels) never pays.
_lt: Any = None
_imported = False

WORKSPACE_BYTES = 32 << 20  # what NVIDIA recommends giving cuBLASLt on Hopper
_HEURISTICS = 8

# cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h)
_DATA_TYPE = {"bf16": 14, "f16": 2, "f32": 0, "f64": 1}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_OP_N, _OP_T = 0, 1


def available() -> bool:
    """Whether nvmath-python's cuBLASLt bindings import here (a GPU is needed to use them)."""
    global _lt, _imported
    if not _imported:
        try:
            from nvmath.bindings import cublasLt as _lt
        except ImportError:  # pragma: no cover - depends on the installation
            _lt = None
        _imported = True
    return _lt is not None


def version() -> str:
    """cuBLASLt's version where the library loads, else nvmath's bindings' (part of cache keys)."""
    if not available():
        return "none"
    try:
        return str(_lt.get_version())
    except Exception:  # no libcublasLt here: the bindings load it lazily
        return "unloaded"


def can_serve(spec: GemmSpec) -> str | None:
    """None when cuBLASLt can run this product as described; else why not."""
    if spec.operand_dtype not in (dt.bfloat16, dt.float16, dt.float32, dt.float64):
        return f"cuBLASLt has no {spec.operand_dtype} product"
    for name, view in (("A", spec.a), ("B", spec.b)):
        if view is not None and view.layout == "strided":
            return f"operand {name} has neither contiguous rows nor columns"
    return None


def served_view(view: View | None) -> bool:
    """Whether cuBLASLt reads this operand view in place (else it is first written out)."""
    return view is not None and view.layout != "strided"


class LibraryError(BackendError):
    """cuBLASLt refused a product (its status, and the product's description)."""


@dataclass(frozen=True)
class Problem:
    """One product as cuBLASLt runs it: sizes, each side's dtype, op, leading dim and batch
    stride (elements), and whether float32 may use TF32."""

    batches: int
    m: int
    n: int
    k: int
    a_dtype: DType
    a_op: int
    a_ld: int
    a_batch: int
    b_dtype: DType
    b_op: int
    b_ld: int
    b_batch: int
    d_dtype: DType
    d_ld: int
    d_batch: int
    tf32: bool


def _side(view: View, rows: int, cols: int) -> tuple[int, int]:
    """(op, leading dim) of a (rows x cols) view read column-major: with contiguous columns it is
    its own transpose (op N, stored cols x rows); with contiguous rows it is itself (op T)."""
    if view.col_stride == 1:
        return _OP_N, max(view.row_stride, cols)
    return _OP_T, max(view.col_stride, rows)


def problem(spec: GemmSpec, a: View, b: View, d: View) -> Problem:
    """The cuBLASLt problem for `spec` with operand and output views (computed operands already
    written out as row-major [batch, rows, cols] buffers, whose views the caller makes), on TF32
    where the kernel's precision allows it."""
    batches, m, n, k = spec.shape
    a_op, a_ld = _side(a, m, k)
    b_op, b_ld = _side(b, k, n)
    tf32 = spec.operand_dtype == dt.float32 and spec.kernel.allows_tf32
    return Problem(batches, m, n, k, a.dtype, a_op, a_ld, a.batch_stride, b.dtype, b_op, b_ld, b.batch_stride,
                   d.dtype, max(d.row_stride, n), d.batch_stride, tf32)


def _set(setter: Any, handle: int, attr: Any, value: Any, ctype: Any) -> None:
    box = ctype(value)
    setter(handle, int(attr), ctypes.addressof(box), ctypes.sizeof(box))


class Matmul:
    """A planned product: its descriptors and the algorithm cuBLASLt's heuristics chose.
    `run` queues it on a stream; everything it needs lives as long as this object."""

    def __init__(self, handle: int, p: Problem):
        try:
            self._plan(handle, p)
        except _lt.cuBLASLtError as exc:
            raise LibraryError(f"cuBLASLt cannot plan {p}: {exc}") from None

    def _plan(self, handle: int, p: Problem) -> None:
        lt = _lt
        self.problem = p
        scale = np.float64 if p.d_dtype == dt.float64 else np.float32
        self._alpha, self._beta = np.ones(1, scale), np.zeros(1, scale)
        compute = _COMPUTE_64F if p.a_dtype == dt.float64 else _COMPUTE_32F_FAST_TF32 if p.tf32 else _COMPUTE_32F
        self.desc = lt.matmul_desc_create(compute, _DATA_TYPE["f64" if scale is np.float64 else "f32"])
        attr = lt.MatmulDescAttribute
        # cuBLASLt's first operand is glue's B (see the module docstring), its second glue's A.
        _set(lt.matmul_desc_set_attribute, self.desc, attr.TRANSA, p.b_op, ctypes.c_int32)
        _set(lt.matmul_desc_set_attribute, self.desc, attr.TRANSB, p.a_op, ctypes.c_int32)
        first = self._layout(p.b_dtype, (p.n, p.k) if p.b_op == _OP_N else (p.k, p.n), p.b_ld, p.b_batch, p.batches)
        second = self._layout(p.a_dtype, (p.k, p.m) if p.a_op == _OP_N else (p.m, p.k), p.a_ld, p.a_batch, p.batches)
        out = self._layout(p.d_dtype, (p.n, p.m), p.d_ld, p.d_batch, p.batches)
        self.layouts = (first, second, out)
        # A model's layers repeat their products: cuBLASLt's heuristics are asked once for each.
        algos = _algorithms.get((handle, p))
        if algos is None:
            algos = _algorithms[handle, p] = self._heuristics(handle, p)
        self.algos = algos
        self.choice = 0
        self.handle = handle

    def _heuristics(self, handle: int, p: Problem) -> np.ndarray:
        """cuBLASLt's candidate algorithms for this product, best first."""
        lt = _lt
        first, second, out = self.layouts
        pref = lt.matmul_preference_create()
        _set(lt.matmul_preference_set_attribute, pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
             WORKSPACE_BYTES, ctypes.c_uint64)
        results = np.zeros(_HEURISTICS, lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(handle, self.desc, first, second, out, out, pref, _HEURISTICS,
                                     results.ctypes.data, count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        if count[0] == 0:
            raise LibraryError(f"cuBLASLt has no algorithm for {p}")
        return results[:count[0]]

    @staticmethod
    def _layout(dtype: DType, shape: tuple[int, int], ld: int, batch_stride: int, batches: int) -> int:
        lt = _lt
        rows, cols = shape
        layout = lt.matrix_layout_create(_DATA_TYPE[dtype.name], rows, cols, max(ld, rows))
        if batches > 1:
            attr = lt.MatrixLayoutAttribute
            _set(lt.matrix_layout_set_attribute, layout, attr.BATCH_COUNT, batches, ctypes.c_int32)
            _set(lt.matrix_layout_set_attribute, layout, attr.STRIDED_BATCH_OFFSET, batch_stride, ctypes.c_int64)
        return layout

    @property
    def workspace_bytes(self) -> int:
        return int(self.algos[self.choice]["workspace_size"])

    def run(self, a: int, b: int, d: int, workspace: int, stream: int) -> None:
        """Queue D = A @ B on `stream` (device addresses of the operands' first elements)."""
        first, second, out = self.layouts
        algo = self.algos[self.choice:self.choice + 1]
        try:
            _lt.matmul(self.handle, self.desc, self._alpha.ctypes.data, b, first, a, second,
                       self._beta.ctypes.data, d, out, d, out, algo.ctypes.data, workspace, WORKSPACE_BYTES, stream)
        except _lt.cuBLASLtError as exc:
            raise LibraryError(f"cuBLASLt failed on {self.problem}: {exc}") from None

    def __del__(self) -> None:
        lt = _lt
        if lt is None:
            return
        for layout in getattr(self, "layouts", ()):
            lt.matrix_layout_destroy(layout)
        if getattr(self, "desc", None):
            lt.matmul_desc_destroy(self.desc)


_handles: dict[int, int] = {}
_algorithms: dict[tuple[int, Problem], np.ndarray] = {}  # (handle, product) -> its heuristics' candidates
_lock = threading.Lock()


def handle_for(ctx: Any) -> int:
    """The cuBLASLt handle of a context (made once, with the context current)."""
    key = id(ctx)
    with _lock:
        found = _handles.get(key)
        if found is None:
            ctx.make_current()
            found = _handles[key] = _lt.create()
    return found


__all__ = ["LibraryError", "Matmul", "Problem", "WORKSPACE_BYTES", "available", "can_serve", "handle_for", "problem",
           "served_view"]
