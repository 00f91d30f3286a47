"""`python -m benchmarks attention_cpu [T ...]`: causal attention on the CPU, glue's tiled
attention kernel (glue.nn.dot_product_attention, and the same attention written out by hand,
which the scheduler recognises) against the unfused program (recognition off: the T x T
scores in memory), forward and forward+backward, with each program's planned peak memory."""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import glue
import glue.nn as nn
import glue.numpy as gnp

B, N, H = 1, 4, 64


def written_out(q, k, v):
    s = q @ k.swapaxes(-1, -2) * (1 / math.sqrt(H))
    t = q.shape[-2]
    return nn.softmax(gnp.where(gnp.tril(gnp.ones((t, t), bool)), s, -1e9)) @ v


def fused(q, k, v):  # the same attention through the API: (B, T, N, H) in and out
    swap = lambda x: x.swapaxes(1, 2)  # noqa: E731
    return swap(nn.dot_product_attention(swap(q), swap(k), swap(v), is_causal=True))


def _loss(fn):
    return glue.grad(lambda q, k, v: gnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2))


def _time(f, args, repeats: int) -> float:
    glue.block_until_ready(f(*args))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        glue.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str]) -> None:
    lengths = [int(a) for a in argv] or [1024, 2048, 4096]
    print(f"causal attention, B={B} N={N} H={H} f32, cpu ({glue.config.cpu_threads or 'all'} threads); "
          "best of 5 after a warm-up call")
    print("| T | program | pass | ms | GFLOP/s | peak MiB |\n| ---: | --- | --- | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for t in lengths:
        args = [rng.standard_normal((B, N, t, H)).astype(np.float32) for _ in range(3)]
        flops = 4 * B * N * t * t * H / 2  # two products, causal half
        variants = [("glue.nn.dot_product_attention", fused, True), ("written out, recognised", written_out, True),
                    ("written out, unfused", written_out, False)]
        for name, fn, recognise in variants:
            with glue.config.override(recognize_attention=recognise):
                for kind, program, work in (("forward", fn, flops), ("fwd+bwd", _loss(fn), 3.5 * flops)):
                    jitted = glue.jit(program, backend="cpu")
                    peak = jitted.lower(*args).compile().memory_analysis().peak_bytes / 2 ** 20
                    seconds = _time(jitted, args, 5)
                    print(f"| {t} | {name} | {kind} | {seconds * 1e3:.1f} | {work / seconds / 1e9:.1f} | {peak:.0f} |")
                    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
