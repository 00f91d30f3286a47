"""The cpu runtime and the code it runs: threads, vector instructions, analyses, donation,
reentrancy, argument errors, and the backend protocol."""
import re
import threading

import numpy as np
import pytest

import glue
from glue.settings import config
import glue.nn as nn
import glue.numpy as gnp
from glue.backend_cpu import CpuBackend, runtime, target
from glue.backend import default_backend_name
from glue.backend.workers import Jobs
from glue.errors import GlueError

RNG = np.random.default_rng(7)


def _compile(fn, *args, threads=None, monkeypatch=None, **kwargs):
    if threads is not None:
        monkeypatch.setenv("GLUE_CPU_THREADS", str(threads))
    return glue.jit(fn, backend="cpu", **kwargs).lower(*args).compile().executable


def _gelu_bias(x, b):
    return nn.gelu(x + b)


def _matmul_bias_tanh(x, w, b):
    return gnp.tanh(x @ w + b)


BIG = {
    "bias+gelu": (_gelu_bias, [(256, 512), (512,)]),
    "softmax": (nn.softmax, [(256, 600)]),
    "column sum": (lambda x: x.sum(0) * 2, [(300, 400)]),
    "matmul epilogue": (_matmul_bias_tanh, [(96, 128), (128, 160), (160,)]),
}


@pytest.mark.parametrize("name", sorted(BIG))
def test_results_are_identical_on_one_thread_and_on_all(name, monkeypatch):
    fn, shapes = BIG[name]
    args = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    with config.override(cpu_parallel_threshold=0):
        one = _compile(fn, *args, threads=1, monkeypatch=monkeypatch)
        many = _compile(fn, *args, threads=2, monkeypatch=monkeypatch)
    assert all(len(step.chunks) == 1 for step in one._steps)
    assert any(len(step.chunks) == 2 for step in many._steps), "the big kernel was not split"
    np.testing.assert_array_equal(np.asarray(one(*args)[0]), np.asarray(many(*args)[0]))


def test_chunks_cover_the_units_exactly_once_on_row_boundaries():
    from glue.backend_cpu.kernels import KernelFunction

    for units, row, threads in [(1000, 10, 2), (7, 7, 4), (1 << 20, 2048, 3), (5, 1000, 2)]:
        f = KernelFunction(None, "k", units, row, cost=1e12)
        chunks = runtime.split(f, threads)
        assert chunks[0][0] == 0 and chunks[-1][1] == units
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert len(chunks) <= threads
        if units // row >= threads:
            assert all(lo % row == 0 for lo, _ in chunks)


def _packed_float_ops(asm: str, symbol: str) -> list[str]:
    body = re.search(rf"^{re.escape(symbol)}:\n(.*?)^\.Lfunc_end", asm, re.S | re.M).group(1)
    width = "[yz]mm" if target.host().vector_bits >= 256 else "xmm"
    return re.findall(rf"^\s*v?(?:add|sub|mul|div|fmadd\w*|fmsub\w*|max|min)ps\s[^\n]*%{width}", body, re.M)


@pytest.mark.parametrize("fn, shapes", [(_gelu_bias, [(64, 256), (256,)]), (nn.softmax, [(64, 256)]),
                                        (_matmul_bias_tanh, [(64, 64), (64, 64), (64,)])],
                         ids=["bias+gelu", "softmax", "matmul"])
def test_hot_loops_use_packed_vector_instructions(fn, shapes):
    args = [np.ones(s, np.float32) for s in shapes]
    lowered = glue.jit(fn, backend="cpu").lower(*args)
    asm = lowered.as_text("asm")
    for kernel in lowered.compile().kernels:
        assert len(_packed_float_ops(asm, kernel.symbol)) >= 8, kernel.name


def test_llvm_stage_is_the_modules_and_asm_is_optimised_code():
    lowered = glue.jit(nn.softmax, backend="cpu").lower(np.ones((4, 8), np.float32))
    assert {"llvm", "asm", "kernels", "memory", "fusion", "optimized", "graph"} <= set(lowered.stages)
    llvm_ir = lowered.as_text("llvm")
    symbols = [source.symbol for source in lowered.lowering["program"].sources.values()]
    for symbol in symbols:
        assert re.search(rf'define void @"?{symbol}"?\(', llvm_ir)
        assert symbol in lowered.as_text("asm")
    assert "noalias" in llvm_ir and target.host().triple in llvm_ir


def test_memory_and_cost_analysis():
    x = np.ones((32, 64), np.float32)
    ws = [np.ones((64, 64), np.float32)] * 4
    def mlp(x, ws):
        for w in ws:
            x = gnp.tanh(x @ w)
        return x
    exe = _compile(mlp, x, ws)
    m = exe.memory_analysis()
    assert m.argument_bytes == x.nbytes + 4 * ws[0].nbytes
    assert m.output_bytes == x.nbytes
    assert m.peak_bytes == m.argument_bytes + m.arena_bytes + m.output_bytes < m.naive_bytes
    c = exe.cost_analysis()
    assert c.flops >= 4 * 2 * 32 * 64 * 64
    assert c.transcendentals == 4 * 32 * 64
    assert c.bytes_accessed >= m.argument_bytes + m.output_bytes


def test_donated_argument_buffers_hold_the_outputs():
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    kept = x.copy()
    f = glue.jit(lambda x: gnp.tanh(x * 2), backend="cpu", donate_argnums=0)
    out = f(x)  # a NumPy argument is copied in, never written
    np.testing.assert_array_equal(x, kept)
    np.testing.assert_allclose(np.asarray(out), np.tanh(x * 2), rtol=2e-6)
    donor = glue.device_put(x, "cpu")
    buffer = donor.buffer
    again = f(donor)  # a glue.Array's buffer becomes the output's
    assert np.shares_memory(np.asarray(again), buffer) and donor.is_deleted
    np.testing.assert_allclose(np.asarray(again), np.tanh(x * 2), rtol=2e-6)
    assert f.lower(x).compile().memory_analysis().output_bytes == 0


def test_concurrent_calls_of_one_executable_do_not_interfere():
    exe = _compile(nn.softmax, np.ones((128, 300), np.float32))
    inputs = [RNG.standard_normal((128, 300)).astype(np.float32) * (i + 1) for i in range(6)]
    expected = [np.asarray(exe(x)[0]) for x in inputs]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(5):
            results[i] = np.asarray(exe(inputs[i])[0])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_bad_arguments_raise_glue_errors():
    exe = CpuBackend().lower(glue.make_ir(lambda x: x + 1)(np.ones(3, np.float32)).graph).compile()
    with pytest.raises(GlueError, match="takes 1 arguments"):
        exe(np.ones(3), np.ones(3))
    with pytest.raises(GlueError, match=r"shape \(4,\)"):
        exe(np.ones(4, np.float32))


def test_cpu_is_the_default_backend_without_a_gpu():
    from glue.backend_cuda import CudaBackend

    if CudaBackend.can_run():
        pytest.skip("a GPU is present")
    assert CpuBackend.can_run()
    assert default_backend_name() in ("cpu",) or "GLUE_BACKEND" in __import__("os").environ


def test_code_calling_a_missing_function_is_refused_not_run():
    ir_text = (f'target triple = "{target.host().triple}"\n'
               "declare void @glue_no_such_function()\n"
               "define void @f() {\n  call void @glue_no_such_function()\n  ret void\n}\n")
    code, _ = Jobs(1).submit(*target.Pipeline().job(ir_text)).result()
    assert target.undefined_symbols(code) == ["glue_no_such_function"]
    with pytest.raises(GlueError, match="glue_no_such_function"):
        target.LoadedCode([code], ["f"])


def _scale_shift(x, w):
    return x * w + 1.0


@pytest.mark.parametrize("fn, shape", [(_scale_shift, (37, 300)), (nn.softmax, (16, 512))],
                         ids=["pointwise", "softmax"])
def test_large_outputs_are_written_with_non_temporal_stores(fn, shape, monkeypatch):
    if not target.host().triple.startswith("x86_64"):
        pytest.skip("non-temporal stores are emitted for x86-64 only")
    args = [RNG.standard_normal(shape).astype(np.float32)] + ([RNG.standard_normal(shape[-1:]).astype(np.float32)]
                                                               if fn is _scale_shift else [])
    lowered = glue.jit(fn, backend="cpu").lower(*args)
    with config.override(cpu_stream_bytes=0):
        assert re.search(r"\bv?movnt(ps|dq)\b", lowered.as_text("asm"))
    got = np.asarray(lowered.compile()(*args))
    want = np.asarray(glue.jit(fn, backend="reference")(*args))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_every_kernel_class_gets_the_lean_pipeline():
    """Every class, the blocked matmul included, runs at most O2, lean, without strength
    reduction; the matmul's micro-kernel still runs MICRO_UNROLL steps an iteration, which the
    lean pipeline makes because the loop asks for them."""
    from glue.backend_cpu.matmul import MICRO_UNROLL, MR
    from glue.backend_cpu.target import Pipeline, assembly

    x, w = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    for opt_level, expected in ((3, Pipeline(2, False, lean=True)), (1, Pipeline(1, False, lean=True))):
        program = glue.jit(lambda x, w: nn.softmax(x @ w), backend="cpu",
                           backend_options={"opt_level": opt_level}).lower(x, w).lowering["program"]
        modules = {program.sources[k].kernel.kind: program.module(k) for k in program.sources}
        assert {kind: m.pipeline for kind, m in modules.items()} == {"contraction": expected, "reduction": expected}
    features = target.host().features
    if "+fma" in features or "+neon" in features:  # (a host without fused multiply-adds calls fmaf)
        code = assembly(modules["contraction"].text, modules["contraction"].pipeline)
        fmas = len(re.findall(r"\b(vfmadd\w*|fmla|fmadd)\b", code))
        assert fmas >= MR * MICRO_UNROLL, fmas


def test_long_bodies_fold_their_loop_tails():
    """A kernel of hundreds of fused ops compiles its body into the vector loop only (masked
    for the last partial vector), not again for remainder loops; every length still computes
    every element."""
    from glue.backend_cpu.program import LONG_BODY, body_size

    def chain(x):
        for i in range(60):
            x = gnp.tanh(x * 1.0001 + 0.01 * (i % 7))
        return x

    for shape in ((3, 37), (1, 1), (5, 301)):
        x = RNG.standard_normal(shape).astype(np.float32)
        lowered = glue.jit(chain, backend="cpu").lower(x)
        program = lowered.lowering["program"]
        key, = program.sources  # one fused kernel
        assert body_size(program.sources[key].kernel) >= LONG_BODY and program.module(key).pipeline.fold_tail
        np.testing.assert_allclose(np.asarray(lowered.compile()(x)), np.asarray(glue.jit(chain, backend="reference")(x)),
                                   rtol=1e-5, atol=1e-6)
    if target.host().triple.startswith("x86_64") and "+avx512f" in target.host().features.split(","):
        assert not re.search(r"vfmadd\w+ss", lowered.as_text("asm"))  # no scalar remainder loop
