"""`python -m benchmarks compile`: how long glue takes to compile, cold and warm, beside jax.jit.

Programs: the step suite's GPT-style training step (benchmarks/step.py, configs small and gpt2)
at 2, 4, 8 and 16 layers, and chains of 100 to 10,000 ops: elementwise (a fused chain of adds,
multiplies and tanh) and reduction blocks (x - max(x) then a scale, four ops per block: every
block is a kernel boundary).

Every measurement runs in a fresh process, the way a user meets it: "cold" with an empty
GLUE_CACHE_DIR, "warm" in another new process on the disk cache the cold run filled. The time is
`jit(f).lower(*args).compile()` (tracing, scheduling, code generation, loading; for cuda also the
driver's JIT and the contraction races), reported with the compile stats' split (trace, passes,
fuse, plan, llvm build, LLVM work summed over the compile workers, ...), and as processor
seconds (this process's and the compile workers' LLVM work), which a machine busy with other
work does not inflate as it does the wall time. jax.jit's
`lower(...).compile()` is timed in a new process of its own when jax is importable. A run that
fails or exceeds --timeout is reported as such. "per layer" is the cold step time's growth from
the fewest to the most layers, per added layer.

    python -m benchmarks compile                         # cpu, the whole suite
    python -m benchmarks compile --backend cuda          # on the GPU host
    python -m benchmarks compile --configs small --layers 2,4 --chains 100,1000
    python -m benchmarks compile --configs small --layers 4 --precisions f32,bf16 --chains ''
"""
from __future__ import annotations

import argparse
import compileall
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

LAYERS = (2, 4, 8, 16)
CHAINS = (100, 1000, 10000)


# --- the programs (built in the child process) ------------------------------------------------

def _step_program(xp: Any, nn: Any, logsumexp: Any, grad: Any, config: str, layers: int, bf16: bool):
    from benchmarks import step

    cfg = replace(step.CONFIGS[config], layers=layers)

    def loss_fn(params, tokens, targets):
        return step.model_loss(xp, nn, logsumexp, cfg, params, tokens, targets, bf16)

    def fn(params, m, v, tokens, targets, c1, c2):
        loss, grads = grad(loss_fn)(params, tokens, targets)
        params, m, v = step.adamw(xp, params, grads, m, v, c1, c2)
        return params, m, v, loss

    import numpy as np
    params, tokens, targets = step.init(cfg)
    zeros = [np.zeros_like(p) for p in params]
    c1, c2 = step.corrections(1)
    return fn, (params, zeros, zeros, tokens, targets, c1, c2)


def _chain_program(xp: Any, kind: str, ops: int):
    import numpy as np

    def elementwise(x):
        for i in range(ops // 3):
            x = xp.tanh(x * 1.0001 + 0.01 * (i % 7))
        return x

    def reduction(x):
        for _ in range(ops // 4):
            x = (x - x.max(-1, keepdims=True)) * 0.5
        return x

    x = np.linspace(-1, 1, 64 * 256, dtype=np.float32).reshape(64, 256)
    return (elementwise if kind == "elementwise" else reduction), (x,)


def _program(spec: dict, impl: str):
    if impl == "jax":
        import jax
        import jax.numpy as jnp
        from jax.scipy.special import logsumexp
        xp, nn, grad = jnp, jax.nn, jax.value_and_grad
    else:
        import glue
        import glue.nn as gnn
        import glue.numpy as gnp
        xp, nn, logsumexp, grad = gnp, gnn, gnn.logsumexp, glue.value_and_grad
    if spec["program"] == "step":
        return _step_program(xp, nn, logsumexp, grad, spec["config"], spec["layers"],
                             spec.get("precision") == "bf16")
    return _chain_program(xp, spec["program"], spec["ops"])


def child(spec: dict) -> dict:
    """Compile one program in this (fresh) process; its time and where it went."""
    fn, args = _program(spec, spec["impl"])  # imports the framework: not part of the time
    start = time.perf_counter()
    if spec["impl"] == "jax":
        import jax
        jax.jit(fn).lower(*args).compile()
        return {"seconds": time.perf_counter() - start}
    import glue
    donate = (0, 1, 2) if spec["program"] == "step" else ()
    cpu_start = time.process_time()
    compiled = glue.jit(fn, backend=spec["backend"], donate_argnums=donate).lower(*args).compile()
    seconds = time.perf_counter() - start
    stats = compiled.compile_stats()
    from glue.backend import workers

    # processor seconds: this process's, plus the LLVM work of the compile workers if it ran there
    cpu = time.process_time() - cpu_start + (stats["steps"].get("llvm cpu", 0.0) if workers.started() else 0.0)
    return {"seconds": seconds, "cpu": cpu, "stages": {k: v["seconds"] for k, v in stats["stages"].items()},
            "steps": stats["steps"], "cache": stats["cache"], "launches": len(compiled.kernels),
            "eqns": len(compiled.lowered.closed.graph.eqns)}


def _run_child(spec: dict, cache_dir: str, timeout: float) -> dict:
    # (the CUDA driver keeps the machine code it JIT-compiles from PTX in a cache of its own)
    env = dict(os.environ, GLUE_CACHE_DIR=cache_dir, CUDA_CACHE_PATH=os.path.join(cache_dir, "cuda-driver"))
    command = [sys.executable, "-m", "benchmarks", "compile", "--child", json.dumps(spec)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
        return {"error": last[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _jax_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True)
    return done.returncode == 0


def measure(spec: dict, timeout: float, jax: bool) -> dict:
    """Cold and warm glue compiles of `spec`, and jax's, each in a new process."""
    with tempfile.TemporaryDirectory(prefix="glue-compile-bench-") as cache:
        row = {"cold": _run_child(dict(spec, impl="glue"), cache, timeout)}
        row["warm"] = _run_child(dict(spec, impl="glue"), cache, timeout) if "error" not in row["cold"] else {}
    if jax:
        with tempfile.TemporaryDirectory() as cache:
            row["jax"] = _run_child(dict(spec, impl="jax"), cache, timeout)
    return row


# --- the report --------------------------------------------------------------------------------

def _label(spec: dict) -> str:
    if spec["program"] == "step":
        return f"step {spec['config']} {spec.get('precision', 'f32')} {spec['layers']} layers"
    return f"{spec['program']} chain {spec['ops']} ops"


def _seconds(result: dict) -> str:
    if not result:
        return "—"
    return f"error: {result['error']}" if "error" in result else f"{result['seconds']:.2f}"


def _where(result: dict) -> str:
    """A compile's split: stages, and the LLVM work (over all workers)."""
    if "stages" not in result:
        return "—"
    stages, steps = result["stages"], result["steps"]
    parts = [f"{name} {stages[name]:.2f}" for name in ("trace", "passes", "fuse", "plan") if name in stages]
    code = [name for name in ("object", "llvm", "ptx", "cubin", "load") if name in stages]
    parts += [f"{name} {stages[name]:.2f}" for name in code]
    llvm = sum(steps.get(s, 0.0) for s in ("llvm optimise", "object emission", "ptx emission"))
    if "llvm build" in steps:
        parts.append(f"(llvm build {steps['llvm build']:.2f}, LLVM {llvm:.2f})")
    return ", ".join(parts)


def table(rows: list[tuple[dict, dict]], jax: bool) -> str:
    head = ["program", "eqns", "kernels (distinct)", "glue cold s", "glue warm s", "cold / warm CPU s"] + \
           (["jax.jit s"] if jax else []) + ["cold: where the time went (s)", "warm: where the time went (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, row in rows:
        cold = row["cold"]
        kernels = f"{cold['launches']} ({sum(cold['cache'].values())})" if "launches" in cold else "—"
        cpu = " / ".join(f"{r['cpu']:.2f}" if "cpu" in r else "—" for r in (cold, row["warm"]))
        cells = [_label(spec), str(cold.get("eqns", "—")), kernels, _seconds(cold), _seconds(row["warm"]), cpu]
        cells += [_seconds(row.get("jax", {}))] if jax else []
        cells += [_where(cold), _where(row["warm"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_layer(rows: list[tuple[dict, dict]]) -> list[str]:
    """Per config and precision: the cold compile's growth per added layer, between the fewest
    and most layers."""
    notes = []
    for config, precision in dict.fromkeys((s["config"], s.get("precision", "f32")) for s, _ in rows
                                           if s["program"] == "step"):
        done = sorted((s["layers"], r["cold"]["seconds"]) for s, r in rows
                      if s.get("config") == config and s.get("precision", "f32") == precision
                      and "seconds" in r["cold"])
        if len(done) >= 2:
            (l0, t0), (l1, t1) = done[0], done[-1]
            notes.append(f"{config} {precision}: {(t1 - t0) / (l1 - l0):.2f} s per added layer "
                         f"({l0} -> {l1} layers, cold)")
    return notes


def _machine() -> str:
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, load average {os.getloadavg()[0]:.1f} at the start"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks compile", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--configs", default="small,gpt2", help="step configs ('' for none)")
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)))
    parser.add_argument("--precisions", default="f32", help="step precisions: f32, bf16 (mixed precision)")
    parser.add_argument("--chains", default=",".join(map(str, CHAINS)), help="chain lengths in ops ('' for none)")
    parser.add_argument("--kinds", default="elementwise,reduction", help="chain kinds")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per compile")
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--results", default="", help="markdown file to append the table to")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    specs = [{"program": "step", "config": c, "layers": int(n), "backend": args.backend, "precision": p}
             for c in filter(None, args.configs.split(",")) for p in filter(None, args.precisions.split(","))
             for n in filter(None, args.layers.split(","))]
    specs += [{"program": kind, "ops": int(n), "backend": args.backend}
              for kind in filter(None, args.kinds.split(",")) for n in filter(None, args.chains.split(","))]
    jax = not args.no_jax and _jax_available()
    # Bytecode for glue's modules first, as installing the package writes it: else the first
    # measured process would also compile every module it imports (a second on a fresh machine).
    compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "glue"),
                           quiet=1)
    where = _machine()
    rows = []
    for spec in specs:
        rows.append((spec, measure(spec, args.timeout, jax)))
        print(_label(spec), json.dumps(rows[-1][1]), file=sys.stderr, flush=True)
    text = (f"## compile ({args.backend}) — {datetime.date.today().isoformat()}\n\nMachine: {where}. "
            f"Command: `python -m benchmarks compile {' '.join(argv or [])}`. Seconds for "
            f"`jit(f).lower(*args).compile()` in a new process: cold (empty GLUE_CACHE_DIR), warm (the disk "
            f"cache the cold run filled){', and jax.jit cold' if jax else ''}.\n\n{table(rows, jax)}\n\n"
            + "".join(f"- {note}\n" for note in per_layer(rows)))
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
