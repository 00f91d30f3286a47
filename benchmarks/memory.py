"""The memory suite: the planned memory of the transformer training step (benchmarks/step.py),
per config and precision, from lowering alone (no code is generated): the planned peak
(arguments + arena + fresh outputs), against the peers' measured peaks on the H200 (issue #17),
and what is live where the arena is fullest, by source line and by value.

`python -m benchmarks memory [--configs small,gpt2] [--precisions f32,bf16] [--top 12]`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.step import CONFIGS, Config, corrections, glue_step_fn, init

# Peak device memory (MiB) of the same step on the H200, measured by the step suite (issue #17).
PEERS = {("gpt2", "f32"): {"jax.jit": 2744, "torch.compile": 1788},
         ("gpt2", "bf16"): {"jax.jit": 2280, "torch.compile": 1606},
         ("small", "f32"): {"jax.jit": 307, "torch.compile": 232}}


def analyse(cfg: Config, bf16: bool, backend: str = "cpu"):
    """The step's MemoryAnalysis and the seconds lowering took (tracing, passes, fusion, plans)."""
    import glue
    from glue.codegen.analysis import analyse_memory

    params, tokens, targets = init(cfg)
    zeros = [np.zeros_like(p) for p in params]
    c1, c2 = corrections(1)
    start = time.perf_counter()
    lowered = glue.jit(glue_step_fn(cfg, bf16), backend=backend, donate_argnums=(0, 1, 2)).lower(
        params, zeros, zeros, tokens, targets, c1, c2)
    analysis = analyse_memory(lowered.lowering["plan"])
    return analysis, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="small,gpt2")
    parser.add_argument("--precisions", default="f32,bf16")
    parser.add_argument("--top", type=int, default=12, help="source lines and values listed per step")
    args = parser.parse_args(argv)
    mib = 2 ** 20
    rows = []
    for name in args.configs.split(","):
        for prec in args.precisions.split(","):
            m, seconds = analyse(CONFIGS[name], prec == "bf16")
            print(f"== {CONFIGS[name].name} {prec} (lowered in {seconds:.1f} s)\n{m.report(args.top)}\n", flush=True)
            peers = PEERS.get((name, prec), {})
            rows.append([CONFIGS[name].name, prec, f"{m.peak_bytes / mib:.0f}", f"{m.argument_bytes / mib:.0f}",
                         f"{m.arena_bytes / mib:.0f}", f"{m.live_peak_bytes / mib:.0f}",
                         f"{m.output_bytes / mib:.0f}", str(peers.get("jax.jit", "")),
                         str(peers.get("torch.compile", ""))])
    cols = ["config", "prec", "planned peak MiB", "arguments", "arena", "most live", "outputs",
            "jax.jit (H200)", "torch.compile (H200)"]
    print("| " + " | ".join(cols) + " |\n| " + " | ".join("---" for _ in cols) + " |")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
