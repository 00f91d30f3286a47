"""Contractions served by a library (cuBLASLt) or glue's own kernels: the GEMM description of a
contraction kernel, the launches of the library variant (operands written out where the library
cannot read them in place, the epilogue after the product), checked on the CPU emulator (which
computes a library product with NumPy) and, on a GPU, through cuBLASLt itself."""
import ml_dtypes
import numpy as np
import pytest

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend, cublaslt
from glue.reference import run_graph
from glue.reference.compare import mismatch, tolerance_dtypes
from glue.scheduler.gemm import gemm_spec, operand_kernel, product_of_written
from glue.scheduler.interpret import run_kernel
from tests.backend_cuda import emulator

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(11)
needs_cc = pytest.mark.skipif(not emulator.available(), reason="the emulator needs a C compiler")

CASES = {
    "NN f32": (lambda a, b: a @ b, [(40, 24), (24, 56)], np.float32),
    "NT bf16": (lambda a, b: a @ b.T, [(40, 32), (48, 32)], BF16),
    "TN f32": (lambda a, b: a.T @ b, [(24, 40), (24, 56)], np.float32),
    "TT f16": (lambda a, b: a.T @ b.T, [(32, 40), (48, 32)], np.float16),
    "batched bf16": (lambda a, b: a @ b, [(3, 40, 32), (3, 32, 24)], BF16),
    "broadcast weight": (lambda a, b: a @ b, [(3, 40, 32), (32, 24)], np.float32),
    "bias gelu": (lambda a, b, c: nn.gelu(a @ b + c), [(40, 24), (24, 56), (56,)], np.float32),
    "residual bf16 out": (lambda a, b, r: ((a @ b) + r).astype(gnp.bfloat16), [(40, 24), (24, 56), (40, 56)],
                          np.float32),
    "cast prologue": (lambda a, b: a.astype(gnp.bfloat16) @ b.astype(gnp.bfloat16), [(40, 32), (32, 24)], np.float32),
    # a weight's cast for the product with its transpose: written column-major, read transposed
    "transposed cast prologue": (lambda a, w: a.astype(gnp.bfloat16) @ w.T.astype(gnp.bfloat16),
                                 [(40, 32), (24, 32)], np.float32),
    "batched transposed cast": (lambda a, w: a.astype(gnp.bfloat16) @ gnp.swapaxes(w, 1, 2).astype(gnp.bfloat16),
                                [(3, 40, 32), (3, 24, 32)], np.float32),
    "attention scores": (lambda q, k: gnp.einsum("bthd,bshd->bhts", q, k) * 0.125, [(2, 16, 3, 8), (2, 16, 3, 8)], BF16),
    "weight gradient": (lambda x, g: gnp.einsum("btd,bte->de", x, g), [(2, 16, 8), (2, 16, 12)], np.float32),
    "vector": (lambda a, b: a @ b, [(32,), (32, 24)], np.float32),
}


def _args(shapes, dtype):
    return [(RNG.standard_normal(s) * 0.5).astype(dtype) for s in shapes]


def _compare(graph, args, outs, label, tf32):
    want = run_graph(graph, args, float64=True)
    for i, (got, w, d) in enumerate(zip(outs, want, tolerance_dtypes(graph, tf32=tf32))):
        problem = mismatch(got, w, d if d is not None else graph.out_types[i].dtype, scale=4.0)
        assert problem is None, f"{label}, output {i}: {problem}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_training_contraction_is_a_gemm(name):
    fn, shapes, dtype = CASES[name]
    plan = glue.jit(fn, backend="cpu").lower(*_args(shapes, dtype)).lowering["plan"]
    specs = [gemm_spec(k) for k in plan.kernels if k.kind == "contraction"]
    assert specs and all(s is not None for s in specs), name
    batches, m, n, k = specs[0].shape
    assert specs[0].flops == 2 * batches * m * n * k


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("sides", [("a",), ("b",), ("a", "b")])
def test_the_product_of_operands_written_k_major_is_the_kernels(name, sides):
    """`operand_kernel` writing operands K-major (A as [batch, m, k], B as [batch, n, k]) and
    `product_of_written` reading them there (as a TF32 product does before the warpgroup kernel)
    give what the contraction kernel gives, epilogue and all: both run on the kernel-IR
    interpreter, on the same random inputs."""
    fn, shapes, dtype = CASES[name]
    plan = glue.jit(fn, backend="cpu").lower(*_args(shapes, dtype)).lowering["plan"]
    for kernel in (k for k in plan.kernels if k.kind == "contraction"):
        spec = gemm_spec(kernel)
        inputs = [(RNG.standard_normal(b.type.shape) * 0.5).astype(b.type.dtype.numpy) for b in kernel.inputs]
        want = run_kernel(kernel, inputs)
        written = [run_kernel(operand_kernel(spec, side, "t", transposed=side == "b"), inputs)[0] for side in sides]
        batches, m, n, k = spec.shape
        assert [w.shape for w in written] == [(batches, m, k) if side == "a" else (batches, n, k) for side in sides]
        got = run_kernel(product_of_written(spec, sides), inputs + written)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6, atol=1e-6, err_msg=name)


@needs_cc
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("variant", ["library", "codegen"])
def test_library_and_codegen_variants_compute_the_reference(name, variant):
    fn, shapes, dtype = CASES[name]
    args = _args(shapes, dtype)
    closed = glue.make_ir(fn)(*args)
    program = CudaBackend().lower(closed.graph, name="gemm", gemm="auto" if cublaslt.available() else "codegen")["llvm"]
    if variant == "library" and not any(l.library for l in program.launches):
        pytest.skip("nvmath-python is not installed: no library variant")
    all_args = list(closed.consts) + args
    outs = emulator.run_program(program, all_args, variant=variant)
    _compare(closed.graph, all_args, outs, f"{name} ({variant})", tf32=True)


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_the_library_variant_writes_out_only_what_it_cannot_read_in_place():
    def launches(fn, shapes, dtype):
        closed = glue.make_ir(fn)(*_args(shapes, dtype))
        program = CudaBackend().lower(closed.graph, gemm="library")["llvm"]
        return [l.kernel.name.split("_")[0] if l.library is None else "gemm" for l in program.launches]

    assert launches(*CASES["NT bf16"]) == ["gemm"]
    assert launches(*CASES["bias gelu"]) == ["gemm", "epilogue"]
    assert launches(*CASES["cast prologue"]) == ["a", "b", "gemm"]


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_a_computed_operand_read_down_its_columns_is_written_column_major():
    fn, shapes, dtype = CASES["transposed cast prologue"]
    closed = glue.make_ir(fn)(*_args(shapes, dtype))
    program = CudaBackend().lower(closed.graph, gemm="library")["llvm"]
    (gemm,) = [l.library for l in program.launches if l.library is not None]
    operands = {l.kernel.name.split("_")[0]: l.kernel.outputs[0].type.shape for l in program.launches
                if l.library is None}
    assert operands == {"a": (1, 40, 32), "b": (1, 24, 32)}  # b is [k, n] = [32, 24], stored as [n, k]
    assert gemm.a.layout == "row" and gemm.b.layout == "col"


@pytest.mark.cuda
@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("gemm", ["library", "codegen", "auto"])
def test_on_the_gpu_every_variant_computes_the_reference(name, gemm):
    fn, shapes, dtype = CASES[name]
    args = _args(shapes, dtype)
    closed = glue.make_ir(fn)(*args)
    with glue.config.override(cuda_poison=0xFF):
        exe = CudaBackend().lower(closed.graph, name="gemm", gemm=gemm).compile()
        all_args = list(closed.consts) + args
        outs = [np.asarray(o) for o in exe(*all_args)]
    _compare(closed.graph, all_args, outs, f"{name} ({gemm})", tf32=True)
    if gemm == "library":
        assert any(step.library is not None for step in exe._steps)


@pytest.mark.cuda
@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_on_the_gpu_the_race_times_the_librarys_algorithms_and_a_new_process_reuses_its_choice(tmp_path):
    """A product past ALGORITHM_FLOPS races glue's kernel against cuBLASLt's first algorithms;
    the choice (and the algorithm) comes back from the disk cache without a race, and both
    runs compute the reference."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2)]
    closed = glue.make_ir(lambda x, y: x @ y)(*args)
    with glue.config.override(cache_dir=str(tmp_path), autotune=True):
        first = CudaBackend().lower(closed.graph, name="race", gemm="auto").compile()
        (group, times), = first.gemm_timings.items()
        assert set(times) == {"codegen", "library"} and all(t > 0 for t in times.values())
        assert "us, library" in first.loaded_text("kernels")
        again = CudaBackend().lower(closed.graph, name="race", gemm="auto").compile()
        assert again.gemm_timings == {} and again.gemm_choices == first.gemm_choices
        assert "from the disk cache" in again.loaded_text("kernels")
        assert again.gemm_algorithms == first.gemm_algorithms
        if first.gemm_choices[group] == "library":
            chosen = {step.library.matmul.choice for step in again._steps if step.library is not None}
            assert chosen == {first.gemm_algorithms[group]}
        for exe in (first, again):
            _compare(closed.graph, args, [np.asarray(o) for o in exe(*args)], "1024^3 f32", tf32=True)


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_large_float32_products_are_not_raced_against_glues_kernel():
    """From LIBRARY_ONLY_FLOPS on, a float32 product (TF32 or full precision) runs on cuBLASLt
    without a codegen variant to race or compile; a bf16 one as large, a float32 one just
    smaller, and any under GLUE_GEMM=codegen keep glue's kernel. Lowered without a GPU."""
    from glue.backend_cuda.codegen.library import LIBRARY_ONLY_FLOPS

    def variants(dtype, m, precision=None, gemm="auto"):
        a, b = np.zeros((m, 1024), dtype), np.zeros((1024, 1024), dtype)
        closed = glue.make_ir(lambda x, y: gnp.matmul(x, y, precision=precision))(a, b)
        program = CudaBackend().lower(closed.graph, name="big", gemm=gemm)["llvm"]
        return {l.variant for l in program.launches}

    assert 2 * 2048 * 1024 * 1024 == LIBRARY_ONLY_FLOPS
    assert "codegen" not in variants(np.float32, 2048)
    assert "codegen" not in variants(np.float32, 2048, precision="highest")
    assert "codegen" in variants(np.float32, 1024)  # half the threshold
    assert {"codegen", "library"} <= variants(BF16, 2048)
    assert variants(np.float32, 2048, gemm="codegen") == {"codegen"}


def test_identical_contractions_share_one_race_and_different_ones_do_not():
    """The race's cache key is the kernel's structure, as its code's is: a model's layers race
    once (the first layer's choice serves the rest from the disk cache). Lowered without a GPU."""
    from glue.backend_cuda.gemm_choice import _key

    x, w1, w2 = (RNG.standard_normal(s).astype(np.float32) for s in [(64, 32), (32, 48), (32, 48)])
    w3 = RNG.standard_normal((32, 40)).astype(np.float32)
    closed = glue.make_ir(lambda x, w1, w2, w3: (nn.relu(x @ w1), nn.relu(x @ w2), nn.relu(x @ w3)))(x, w1, w2, w3)
    program = CudaBackend().lower(closed.graph, name="layers", arch="sm_90a")["llvm"]
    groups = [i for i, k in enumerate(program.plan.kernels) if k.kind == "contraction"]
    assert len(groups) == 3
    first, second, third = (_key(program, g) for g in groups)
    assert first == second != third


def _kmajor_program(fn, shapes, dtype, monkeypatch, **lower):
    """The cuda program of `fn` lowered with every TF32 product big enough for the variant
    "library kmajor" (its threshold lowered to 0)."""
    from glue.backend_cuda.codegen import library

    monkeypatch.setattr(library, "KMAJOR_COPY_FLOPS", 0)
    args = _args(shapes, dtype)
    closed = glue.make_ir(fn)(*args)
    return closed, args, CudaBackend().lower(closed.graph, name="kmajor", **lower)["llvm"]


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_a_tf32_weight_gradient_may_copy_its_smaller_operand_k_major(monkeypatch):
    """Both operands MN-major at TF32 (a weight gradient over the tokens): the variant "library
    kmajor" writes the smaller operand K-major first (x^T: [d, tokens] row-major), and cuBLASLt
    reads it as a row-major view; the plain "library" variant still reads both in place."""
    _, _, program = _kmajor_program(*CASES["weight gradient"], monkeypatch)
    by_variant = {}
    for launch in program.launches:
        by_variant.setdefault(launch.variant, []).append(launch)
    assert set(by_variant) == {"codegen", "library", "library kmajor"}
    assert [l.library is not None for l in by_variant["library"]] == [True]
    copy, gemm = by_variant["library kmajor"]
    assert copy.kernel.outputs[0].type.shape == (1, 8, 32) and gemm.library.a.layout == "row"
    assert gemm.library.b == by_variant["library"][0].library.b
    assert gemm.symbol != by_variant["library"][0].symbol  # planned as a product of its own
    # B the smaller: copied column-major, i.e. [n, k]
    _, _, program = _kmajor_program(lambda x, g: gnp.einsum("btd,bte->de", x, g), [(2, 16, 12), (2, 16, 8)],
                                    np.float32, monkeypatch)
    copy = next(l for l in program.launches if l.variant == "library kmajor" and l.library is None)
    assert copy.kernel.outputs[0].type.shape == (1, 8, 32)


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_a_computed_operand_is_the_one_written_k_major(monkeypatch):
    """The qkv weight gradient's output gradient is a concatenation (computed): the variant
    "library" writes it row-major, i.e. MN-major beside x^T; "library kmajor" writes it
    column-major ([n, k]) instead and reads x^T in place."""
    concat = lambda x, g1, g2: gnp.einsum("td,te->de", x, gnp.concatenate([g1, g2], axis=1))
    _, _, program = _kmajor_program(concat, [(64, 40), (64, 24), (64, 24)], np.float32, monkeypatch)
    operand = {l.variant: l.kernel.outputs[0].type.shape for l in program.launches
               if l.variant.startswith("library") and l.library is None}
    assert operand == {"library": (1, 64, 48), "library kmajor": (1, 48, 64)}
    (gemm,) = [l.library for l in program.launches if l.variant == "library kmajor" and l.library is not None]
    assert gemm.a.layout == "col" and gemm.b.layout == "col"


@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_only_tf32_products_with_both_operands_mn_major_get_the_copy_variant(monkeypatch):
    def variants(fn, shapes, dtype):
        _, _, program = _kmajor_program(fn, shapes, dtype, monkeypatch)
        return {l.variant for l in program.launches if l.kernel.kind == "contraction" or l.library}

    assert "library kmajor" in variants(*CASES["TN f32"])
    for name in ("NN f32", "TT f16", "NT bf16", "batched bf16"):
        assert "library kmajor" not in variants(*CASES[name]), name
    highest = lambda x, g: gnp.einsum("btd,bte->de", x, g, precision="highest")
    assert "library kmajor" not in variants(highest, [(2, 16, 8), (2, 16, 12)], np.float32)
    monkeypatch.undo()
    fn, shapes, dtype = CASES["weight gradient"]
    program = CudaBackend().lower(glue.make_ir(fn)(*_args(shapes, dtype)).graph)["llvm"]
    assert "library kmajor" not in {l.variant for l in program.launches}  # too small to pay


@needs_cc
@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
@pytest.mark.parametrize("name", ["weight gradient", "TN f32", "concatenated gradient"])
def test_the_kmajor_copy_variant_computes_the_reference(name, monkeypatch):
    cases = dict(CASES, **{"concatenated gradient": (
        lambda x, g1, g2: gnp.einsum("td,te->de", x, gnp.concatenate([g1, g2], axis=1)),
        [(64, 40), (64, 24), (64, 24)], np.float32)})
    closed, args, program = _kmajor_program(*cases[name], monkeypatch)
    assert any(l.variant == "library kmajor" for l in program.launches)
    all_args = list(closed.consts) + args
    outs = emulator.run_program(program, all_args, variant="library kmajor")
    _compare(closed.graph, all_args, outs, f"{name} (library kmajor)", tf32=True)


@pytest.mark.cuda
@pytest.mark.skipif(not cublaslt.available(), reason="nvmath-python is not installed")
def test_on_the_gpu_the_race_times_every_library_variant_and_the_kmajor_one_computes_the_reference(
        monkeypatch, tmp_path):
    """A weight gradient races glue's kernel, cuBLASLt in place and cuBLASLt after the K-major
    copy; made to win, the copy variant computes the reference through cuBLASLt."""
    from glue.backend_cuda import gemm_choice

    real = gemm_choice.race

    def kmajor_wins(exe, program, group, variants, rng):
        times, algorithms = real(exe, program, group, variants, rng)
        assert set(times) == {"codegen", "library", "library kmajor"} and all(t > 0 for t in times.values())
        return {v: t + (0 if v == "library kmajor" else 1e6) for v, t in times.items()}, algorithms

    monkeypatch.setattr(gemm_choice, "race", kmajor_wins)
    closed, args, _ = _kmajor_program(*CASES["weight gradient"], monkeypatch)
    with glue.config.override(cache_dir=str(tmp_path), autotune=True, cuda_poison=0xFF):
        exe = CudaBackend().lower(closed.graph, name="kmajor", gemm="auto").compile()
        assert set(exe.gemm_choices.values()) == {"library kmajor"}
        assert "library kmajor (cuBLASLt algorithm" in exe.loaded_text("kernels")
        all_args = list(closed.consts) + args
        _compare(closed.graph, all_args, [np.asarray(o) for o in exe(*all_args)], "kmajor", tf32=True)
