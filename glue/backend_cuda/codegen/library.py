"""A contraction served by a library (cuBLASLt): the launches that compute it that way.

The scheduler's `GemmSpec` says what the product is. Operands the library can read in place
(views with contiguous rows or columns) it reads where they are; computed ones (a rounding
cast, a gather, batch dims that do not flatten) are first written by a pointwise kernel of
glue's own into this stream's scratch region, row-major, or column-major where the kernel would
read its sources down the operand's columns (a weight's cast for the product with its
transpose), so that it copies contiguous memory. The product is written straight into
the kernel's output when its epilogue is only that (`GemmSpec.direct`, with contiguous columns),
else into scratch, and glue's own epilogue kernel (bias, activation, residual, casts: the
contraction kernel's stores) reads it from there. The variant "library" of a plan kernel is
these launches in order; the variant "codegen" is glue's own kernel, and the executor runs one
of them.

A float32 product on TF32 tensor cores whose operands cuBLASLt would both read MN-major (a
weight gradient: activations and output gradients stored token-major, summed over the tokens)
is its slow case, since TF32 tensor cores read only K-major tiles: on the H200, 768x3072x4096
takes 106 us against 72 with one operand K-major, the tied head's 8192x768x4096 217 against
147. Such a product (of at least KMAJOR_COPY_FLOPS) gets a second library variant, "library
kmajor", that writes one operand K-major into scratch first (`kmajor_copy_side`: a computed one
transposed as it is written, else the smaller one copied); the race decides whether it pays.

A float32 product of at least LIBRARY_ONLY_FLOPS has no variant "codegen" unless glue's kernel
is asked for (`library_only`). In full float32 glue's kernel reaches two fifths of cuBLASLt's
speed ("highest": 21 against 51 TFLOP/s at 4096^3 and 8192^3). On TF32 the warpgroup kernel
reaches four fifths (the matmul suite on an H100: 4096^3 314 against 403 TFLOP/s, 8192^3 290
against 364, each MN-major operand first copied K-major, wgmma.py), and a training step's
forward products would copy their weights that way on every call. Whether a fused epilogue
makes up that fifth and the copies has not been measured; until it is, float32 products this
large stay on the library alone, which also keeps their kernels out of the compile.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from glue.backend_cuda.codegen.common import WARP, Launch, Place, flat_index, moves_in_runs
from glue.codegen.scope import Analysis
from glue.ir import TensorType
from glue.ir import dtypes as dt
from glue.scheduler.gemm import GemmSpec, View, epilogue_kernel, operand_kernel, product_type
from glue.scheduler.kernel_ir import Kernel, loads_under

ALIGN = 256  # bytes: scratch pieces start where the allocator's blocks would
KMAJOR_COPY_FLOPS = 1 << 32  # below this a copy costs about what it saves (768x768x4096: even)
LIBRARY_ONLY_FLOPS = 1 << 32  # float32 products this large are not raced against glue's kernel
LIBRARY_VARIANTS = ("library", "library kmajor")


@dataclass(frozen=True)
class LibraryGemm:
    """What one library launch computes: `spec`'s product from the views `a` and `b` into `d`
    (offsets relative to the launch's places `(a, b, d)`), at its kernel's precision."""

    spec: GemmSpec
    a: View
    b: View
    d: View


def _row_major(shape: tuple[int, int, int], dtype) -> View:
    batches, rows, cols = shape
    return View(-1, dtype, 0, rows * cols if batches > 1 else 0, cols, 1)


def _column_major(shape: tuple[int, int, int], dtype) -> View:
    """The view of a [batches, cols, rows] buffer as the [batches, rows, cols] operand."""
    batches, cols, rows = shape
    return View(-1, dtype, 0, rows * cols if batches > 1 else 0, 1, rows)


def _reads_down_columns(kernel: Kernel) -> bool:
    """Whether a row-major operand kernel reads its sources down its columns (a weight's cast
    for the product with its transpose): written column-major instead, the kernel copies
    contiguous memory, and the library reads the operand transposed."""
    analysis = Analysis()
    flats = [flat_index(ld.index, kernel.inputs[ld.input].type.shape)
             for ld in loads_under([s.value for s in kernel.stores])]
    # (along runs of a warp's 32 points: attention's heads read back as rows move so)
    return not any(moves_in_runs(f, 2, WARP, analysis) for f in flats) and \
        any(moves_in_runs(f, 1, WARP, analysis) for f in flats)


def _written_column_major(spec: GemmSpec, side: str, symbol: str = "") -> bool:
    """Whether the variant "library" writes computed operand `side` column-major."""
    return _reads_down_columns(operand_kernel(spec, side, symbol))


def _k_major(spec: GemmSpec, side: str) -> bool:
    """Whether the variant "library" has cuBLASLt read operand `side` K-major: A [m, k] with
    contiguous rows of k, B [k, n] with contiguous columns of k, in place or as written out."""
    view = spec.a if side == "a" else spec.b
    if view is not None and view.layout != "strided":
        return view.layout == ("row" if side == "a" else "col")
    return _written_column_major(spec, side) == (side == "b")


def kmajor_copy_side(spec: GemmSpec) -> str | None:
    """The operand ("a" or "b") that the variant "library kmajor" writes K-major, or None where
    the product has no such variant: not on TF32, too small, or with an operand the variant
    "library" already reads K-major. A computed operand is the one, as it is written out
    either way; else the smaller."""
    if spec.operand_dtype != dt.float32 or not spec.kernel.allows_tf32 or spec.flops < KMAJOR_COPY_FLOPS:
        return None
    if _k_major(spec, "a") or _k_major(spec, "b"):
        return None
    computed = [side for side, view in (("a", spec.a), ("b", spec.b)) if view is None or view.layout == "strided"]
    if computed:
        return computed[0]
    _, m, n, _ = spec.shape
    return "a" if m <= n else "b"


def library_only(spec: GemmSpec) -> bool:
    """Whether the product runs on the library without racing glue's kernel (see the module
    docstring): float32 operands, TF32 or full precision alike, and at least LIBRARY_ONLY_FLOPS."""
    return spec.operand_dtype == dt.float32 and spec.flops >= LIBRARY_ONLY_FLOPS


def scratch_bytes(t: TensorType) -> int:
    """The bytes a value of type `t` takes in a stream's scratch region: up to the next piece's
    ALIGN-aligned start."""
    return -(-t.nbytes // ALIGN) * ALIGN


Emit = Callable[[Kernel, list[Place], list[Place], str], Launch]


def library_launches(spec: GemmSpec, group: int, symbol: str, inputs: list[Place], outputs: list[Place],
                     stream: int, emit: Emit, variant: str = "library") -> tuple[list[Launch], int]:
    """The launches of plan kernel `group` (places `inputs`/`outputs`) served by the library as
    `variant` (one of LIBRARY_VARIANTS), and the scratch bytes they use in stream `stream`'s
    region. `emit(kernel, inputs, outputs, symbol)` generates one of glue's own kernels."""
    copied = kmajor_copy_side(spec) if variant == "library kmajor" else None
    launches: list[Launch] = []
    offset = 0

    def scratch(t: TensorType) -> Place:
        nonlocal offset
        place = Place("scratch", stream, offset)
        offset += scratch_bytes(t)
        return place

    views = {}
    for side, view in (("a", spec.a), ("b", spec.b)):
        if view is not None and view.layout != "strided" and side != copied:
            views[side] = (inputs[view.buffer], view)
            continue
        # K-major: A row-major [b, m, k], B column-major (stored [b, n, k])
        transposed = side == "b" if side == copied else _written_column_major(spec, side, symbol)
        kernel = operand_kernel(spec, side, symbol, transposed=transposed)
        out = kernel.outputs[0].type
        place = scratch(out)
        launches.append(emit(kernel, inputs, [place], f"{symbol}_{side}"))
        views[side] = (place, _column_major(out.shape, out.dtype) if transposed else _row_major(out.shape, out.dtype))
    direct = spec.direct
    if direct is not None and direct.col_stride == 1:
        d_place, d_view = outputs[direct.buffer], direct
        epilogue = None
    else:
        product = product_type(spec)
        d_place, d_view = scratch(product), _row_major(product.shape, product.dtype)
        epilogue = epilogue_kernel(spec, symbol)
    (a_place, a_view), (b_place, b_view) = views["a"], views["b"]
    gemm = LibraryGemm(spec, a_view, b_view, d_view)
    suffix = f"_k{copied}" if copied else ""
    launches.append(Launch(f"cublaslt_{symbol}{suffix}", spec.kernel, 0, 0, (a_place, b_place, d_place),
                           f"cuBLASLt {spec.describe()}", library=gemm))
    if epilogue is not None:
        launches.append(emit(epilogue, inputs + [d_place], outputs, f"{symbol}_epilogue"))
    return [replace(launch, group=group, variant=variant) for launch in launches], offset


__all__ = ["KMAJOR_COPY_FLOPS", "LIBRARY_ONLY_FLOPS", "LIBRARY_VARIANTS", "LibraryGemm", "kmajor_copy_side",
           "library_launches", "library_only", "scratch_bytes"]
