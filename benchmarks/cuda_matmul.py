"""The matmul suite of `python -m benchmarks cuda` (`--suite matmul`): glue's contractions served
by cuBLASLt ("library") and by glue's own kernels ("codegen"), against torch.matmul (cuBLAS) in
the same process: 4096^3 and 8192^3 in bf16, f16 and f32 (default precision, TF32, and
"highest"), the products of a GPT-2-width layer at 4096 tokens (qkv, attention out, MLP up, MLP
down, a head tied to an 8192-word embedding) with each one's input-gradient and weight-gradient
products, and attention's batched products (B=8, H=12, T=512, head dim 64).

Device time: CUDA events around BURST back-to-back replays of the CUDA graph one glue call
launches, median of 5 bursts; torch's product (torch.matmul on transposed views, as cuBLAS takes
them, into a preallocated output) is captured in a CUDA graph of its own and timed the same way,
so that neither side's time is the host's time to queue a small product (launched eagerly,
torch.matmul costs the host 20-40 us a call, more than the 10 us cuBLAS takes for a 4096x768x768
product). TFLOP/s = 2*M*N*K*batch over that time; % of cuBLAS compares with torch's in the same
dtype and precision. Each glue result is checked against a float64 NumPy product on the same
inputs.
"""
from __future__ import annotations

import statistics
import traceback
from typing import Any, Callable

import ml_dtypes
import numpy as np

import glue
import glue.numpy as gnp
from glue.backend_cuda.runtime import Event, get_context

BURST = 20
BF16 = ml_dtypes.bfloat16
D, TOKENS, VOCAB = 768, 4096, 8192


def products() -> list[tuple[str, str, tuple, str, str]]:
    """(label, einsum, (lhs shape, rhs shape), dtype name, precision)."""
    out = []
    for n in (4096, 8192):
        for dtype, precision in (("bf16", "default"), ("f16", "default"), ("f32", "default"), ("f32", "highest")):
            out.append((f"{n}^3 {dtype}{' highest' if precision == 'highest' else ''}", "mk,kn->mn",
                        ((n, n), (n, n)), dtype, precision))
    layer = {"qkv": 3 * D, "attn out": D, "mlp up": 4 * D, "mlp down": D, "head": VOCAB}
    inner = {"qkv": D, "attn out": D, "mlp up": D, "mlp down": 4 * D, "head": D}
    for name, width in layer.items():
        k = inner[name]
        out.append((f"{name} fwd {TOKENS}x{width}x{k}", "mk,kn->mn", ((TOKENS, k), (k, width)), "bf16", "default"))
        out.append((f"{name} dgrad {TOKENS}x{k}x{width}", "mn,kn->mk", ((TOKENS, width), (k, width)), "bf16", "default"))
        out.append((f"{name} wgrad {k}x{width}x{TOKENS}", "mk,mn->kn", ((TOKENS, k), (TOKENS, width)), "bf16", "default"))
    out.append(("attn q@k^T 96x512x512x64", "btd,bsd->bts", ((96, 512, 64), (96, 512, 64)), "bf16", "default"))
    out.append(("attn p@v 96x512x64x512", "bts,bsd->btd", ((96, 512, 512), (96, 512, 64)), "bf16", "default"))
    return out


_NUMPY = {"bf16": BF16, "f16": np.float16, "f32": np.float32}


def _flops(spec: str, shapes: tuple) -> int:
    lhs, rhs = spec.split("->")[0].split(",")
    sizes = {c: n for term, shape in zip((lhs, rhs), shapes) for c, n in zip(term, shape)}
    return 2 * int(np.prod(list(sizes.values())))


def _burst_us(run: Callable[[], Any]) -> float:
    """Median over 5 bursts of the device us per run; a slow product gets shorter bursts (about
    40 ms each) so that the suite stays within minutes."""
    stream = get_context().stream

    def burst(n: int) -> float:
        start, end = Event(stream.ctx, timing=True), Event(stream.ctx, timing=True)
        start.record(stream)
        for _ in range(n):
            run()
        end.record(stream)
        end.synchronize()
        return start.elapsed_ms(end) * 1e3 / n

    n = max(1, min(BURST, int(40e3 / max(burst(1), 1.0))))
    return statistics.median(burst(n) for _ in range(5))


# The variants a row may time: who serves the product, and the emitter settings it runs under
# ("mma.sync" is glue's own kernel with the warpgroup kernel of sm_90a left out: a named tile).
VARIANTS = {"library": ("library", {}), "codegen": ("codegen", {}),
            "mma.sync": ("codegen", {"cuda_mma_tile": "128x128x32/2x2"})}


def reference(spec: str, arrays: list[np.ndarray]) -> np.ndarray:
    """The product in float64 (through BLAS: einsum's own loops take a minute at 4096^3)."""
    return np.einsum(spec, *(a.astype(np.float64) for a in arrays), optimize=True)


def glue_row(label: str, spec: str, arrays: list[np.ndarray], precision: str, variant: str,
             want: np.ndarray) -> dict:
    gemm, settings = VARIANTS[variant]
    with glue.config.override(**settings):
        return _glue_row(label, spec, arrays, precision, gemm, variant, want)


def _glue_row(label: str, spec: str, arrays: list[np.ndarray], precision: str, gemm: str, variant: str,
              want: np.ndarray) -> dict:
    f = glue.jit(lambda a, b: gnp.einsum(spec, a, b, precision=precision), backend="cuda",
                 backend_options={"gemm": gemm})
    args = [glue.device_put(a, "cuda") for a in arrays]
    out = f(*args)
    got = np.asarray(out).astype(np.float64)
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    compiled = next(iter(f._compiled.values()))
    exe = compiled.executable
    for _ in range(3):
        f(*args).block_until_ready()
    graph = exe.last_graph
    buffers = [a.buffer for a in args]
    run = (lambda: graph.launch(get_context().stream)) if graph is not None else (lambda: exe(*buffers))
    us = _burst_us(run)
    kernels = "; ".join(k.strategy for k in exe.kernels)
    return {"label": label, "impl": f"glue {variant}", "us": us, "rel_err": err, "tiles": kernels}


# torch.matmul's form of each product (operands as cuBLAS reads them: transposes are views)
TORCH_PRODUCTS = {
    "mk,kn->mn": lambda a, b: (a, b),
    "mn,kn->mk": lambda a, b: (a, b.T),
    "mk,mn->kn": lambda a, b: (a.T, b),
    "btd,bsd->bts": lambda a, b: (a, b.transpose(-1, -2)),
    "bts,bsd->btd": lambda a, b: (a, b),
}


def torch_row(label: str, spec: str, arrays: list[np.ndarray], dtype: str, precision: str,
              want: np.ndarray) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = precision != "highest"
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    x, y = TORCH_PRODUCTS[spec](*(torch.tensor(v.astype(np.float32), device="cuda").to(tdt) for v in arrays))
    out = torch.matmul(x, y)
    side = torch.cuda.Stream()  # captured on a side stream, as torch.cuda.graphs asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.matmul(x, y, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.matmul(x, y, out=out)
    torch.cuda.synchronize()

    def burst(n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / n

    n = max(1, min(BURST, int(40e3 / max(burst(1), 1.0))))
    us = statistics.median(burst(n) for _ in range(5))
    got = out.float().cpu().numpy().astype(np.float64)
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    return {"label": label, "impl": "torch (cuBLAS)", "us": us, "rel_err": err}


def run(peers: set[str], only: str | None = None, variants: tuple[str, ...] = ("library", "codegen")) -> list[dict]:
    rows = []
    rng = np.random.default_rng(5)
    for label, spec, shapes, dtype, precision in products():
        if only and only not in label:
            continue
        arrays = [rng.standard_normal(s).astype(np.float32).astype(_NUMPY[dtype]) for s in shapes]
        flops = _flops(spec, shapes)
        found = []
        want = reference(spec, arrays)
        attempts = [(f"glue {v}", lambda v=v: glue_row(label, spec, arrays, precision, v, want)) for v in variants]
        if "torch" in peers:
            attempts.append(("torch (cuBLAS)", lambda: torch_row(label, spec, arrays, dtype, precision, want)))
        for impl, attempt in attempts:
            try:
                row = attempt()
            except Exception as exc:
                traceback.print_exc()
                row = {"label": label, "impl": impl, "error": repr(exc)[:160]}
            if "us" in row:
                row["TFLOP/s"] = flops / row["us"] / 1e6
            found.append(row)
        ref = next((r["TFLOP/s"] for r in found if r["impl"].startswith("torch") and "TFLOP/s" in r), None)
        for r in found:
            if ref and "TFLOP/s" in r:
                r["% of cuBLAS"] = 100 * r["TFLOP/s"] / ref
            print(r, flush=True)
        rows += found
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| product | impl | us | TFLOP/s | % of cuBLAS | rel err | tiles |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['impl']} | error: {r['error']} |  |  |  |  |")
            continue
        pct = f"{r['% of cuBLAS']:.1f}%" if "% of cuBLAS" in r else ""
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        lines.append(f"| {r['label']} | {r['impl']} | {r['us']:.1f} | {r['TFLOP/s']:.1f} | {pct} | {err} | "
                     f"{r.get('tiles', '')} |")
    return "\n".join(lines)
