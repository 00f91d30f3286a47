"""The attention suite of `python -m benchmarks cuda` (`--suite attention`): bfloat16 attention
of B=4, H=16 heads, T in {1024, 2048, 4096, 8192}, head size D in {64, 128}, causal and not,
(B, T, H, D) layout, forward and forward+backward, in glue (`glue.nn.dot_product_attention`,
the flash kernels), torch (`scaled_dot_product_attention` on its flash backend) and jax.jit
(`jax.nn.dot_product_attention`), in one process; the peer "glue-mma" is glue with its flash
kernels on mma.sync (`GLUE_CUDA_WGMMA=0`), beside the warpgroup kernels an H100/H200 runs.

Per row: ms per call (the median of 3 loops of CALLS calls, one sync per loop, after a warm-up
call) and TFLOP/s counting 4 B H T^2 D for the forward's two products (half of it under the
causal rule) and 2.5 times that for the backward (FlashAttention's convention: its five
products). The backward is timed as the gradient of sum(out * w) with respect to q, k and v.
"""
from __future__ import annotations

import statistics
import time
import traceback
from typing import Any, Callable

import numpy as np

B, HEADS, CALLS = 4, 16, 20


def _timed(run: Callable[[], Any], sync: Callable[[Any], None]) -> float:
    sync(run())  # warm-up (compiles)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = None
        for _ in range(CALLS):
            out = run()
        sync(out)
        times.append((time.perf_counter() - start) / CALLS * 1e3)
    return statistics.median(times)


def _inputs(t: int, d: int) -> list[np.ndarray]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    return [(rng.standard_normal((B, t, HEADS, d)) * 0.5).astype(ml_dtypes.bfloat16) for _ in range(4)]


def _glue(t: int, d: int, causal: bool, backward: bool) -> float:
    import glue
    import glue.nn as nn
    import glue.numpy as gnp

    q, k, v, w = (glue.device_put(x, "cuda") for x in _inputs(t, d))

    def forward(q, k, v):
        return nn.dot_product_attention(q, k, v, is_causal=causal)

    def loss(q, k, v):
        return (forward(q, k, v).astype(gnp.float32) * w.astype(gnp.float32)).sum()

    fn = glue.jit(glue.grad(loss, argnums=(0, 1, 2)) if backward else forward, backend="cuda")
    return _timed(lambda: fn(q, k, v), lambda out: glue.block_until_ready(out))


def _glue_mma(t: int, d: int, causal: bool, backward: bool) -> float:
    """glue with its flash kernels on mma.sync, where the GPU has warpgroups too (`GLUE_CUDA_WGMMA=0`)."""
    import glue

    with glue.config.override(cuda_wgmma=False):  # (compiled inside: the first call)
        return _glue(t, d, causal, backward)


def _torch(t: int, d: int, causal: bool, backward: bool) -> float:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, w = (torch.tensor(x.astype(np.float32), device="cuda").to(torch.bfloat16).transpose(1, 2)
                  for x in _inputs(t, d))
    for x in (q, k, v):
        x.requires_grad_(backward)

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            return torch.autograd.grad((out.float() * w.float()).sum(), (q, k, v))
        return out

    return _timed(run, lambda _: torch.cuda.synchronize())


def _jax(t: int, d: int, causal: bool, backward: bool) -> float:
    import jax
    import jax.numpy as jnp

    q, k, v, w = (jnp.asarray(x) for x in _inputs(t, d))

    def forward(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    def loss(q, k, v):
        return (forward(q, k, v).astype(jnp.float32) * w.astype(jnp.float32)).sum()

    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)) if backward else forward)
    return _timed(lambda: fn(q, k, v), jax.block_until_ready)


IMPLS = {"glue": _glue, "glue-mma": _glue_mma, "torch": _torch, "jax": _jax}


def run(peers: set[str], lengths: list[int], heads: list[int]) -> list[dict]:
    rows = []
    for d in heads:
        for t in lengths:
            for causal in (False, True):
                flops = 4 * B * HEADS * t * t * d * (0.5 if causal else 1.0)
                for backward in (False, True):
                    for impl in ["glue"] + [p for p in ("glue-mma", "torch", "jax") if p in peers]:
                        try:
                            ms = IMPLS[impl](t, d, causal, backward)
                        except Exception:  # a peer that cannot run this shape: say so, go on
                            traceback.print_exc()
                            continue
                        work = flops * (3.5 if backward else 1.0)
                        row = {"T": t, "D": d, "causal": causal, "pass": "fwd+bwd" if backward else "forward",
                               "impl": impl, "ms": ms, "TFLOP/s": work / ms / 1e9}
                        print(row, flush=True)
                        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| T | D | causal | pass | impl | ms | TFLOP/s | vs torch |", "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: |"]
    torch_tf = {(r["T"], r["D"], r["causal"], r["pass"]): r["TFLOP/s"] for r in rows if r["impl"] == "torch"}
    for r in rows:
        peer = torch_tf.get((r["T"], r["D"], r["causal"], r["pass"]))
        ratio = f"{r['TFLOP/s'] / peer:.2f}" if peer else ""
        lines.append(f"| {r['T']} | {r['D']} | {r['causal']} | {r['pass']} | {r['impl']} | {r['ms']:.3f} | "
                     f"{r['TFLOP/s']:.1f} | {ratio} |")
    return "\n".join(lines)
