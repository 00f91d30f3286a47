"""`python -m benchmarks cpu`: glue's cpu backend against NumPy, and torch (eager and
torch.compile) and jax.jit when they are importable, on the workloads of
`../shared/anchors/peers_cpu.py` (bias+gelu, rmsnorm, layernorm, softmax on 2048x2048 f32;
cross-entropy against one-hot labels 1024x8192; the forward pass and loss of a B32/D256/4-layer
tanh MLP), all in one process.

Per workload and implementation: the median wall time of a call over at least ITERS calls
(and MIN_SECONDS) after warm-up, with outputs allocated per call as every implementation does
(for glue also through the compiled executable alone, without the jit frontend's dispatch);
GB/s counts the first input read once and the output written once (as the anchors count them),
next to a large copy (np.copyto of a 256 MiB array, read + write) measured in the same run as
the machine's practical ceiling; for glue, the cold compile time (tracing, scheduling, LLVM, no
disk cache) and the time to compile again from the disk cache. The markdown table is printed
and appended to benchmarks/RESULTS.md (or --results) with the date, machine and command.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

# Worker threads of torch's OpenMP runtime that spin between calls would steal the second core
# from whatever is measured next; they sleep instead (set before torch is imported).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import glue  # noqa: E402
import glue.nn as nn  # noqa: E402
import glue.numpy as gnp  # noqa: E402
from glue.frontend.pytree import tree_flatten  # noqa: E402

ITERS, MIN_SECONDS, WARMUP = 30, 1.5, 5
R, C = 2048, 2048


# --- the workloads ---------------------------------------------------------------------------

def g_bias_gelu(x, b):
    return nn.gelu(x + b)


def g_rmsnorm(x, w):
    return x / gnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def g_layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / gnp.sqrt(v + 1e-5) * w + b


def g_softmax(x):
    e = gnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def g_xent(logits, onehot):
    m = logits.max(-1, keepdims=True)
    lse = gnp.log(gnp.exp(logits - m).sum(-1, keepdims=True)) + m
    return ((lse - logits) * onehot).sum(-1).mean()


def g_mlp(ws, x, y):
    h = x
    for w in ws:
        h = gnp.tanh(h @ w)
    return ((h - y) ** 2).mean()


def n_bias_gelu(x, b):
    z = x + b
    return 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))


def n_rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def n_layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * w + b


def n_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def n_xent(logits, onehot):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1, keepdims=True)) + m
    return ((lse - logits) * onehot).sum(-1).mean()


def n_mlp(ws, x, y):
    h = x
    for w in ws:
        h = np.tanh(h @ w)
    return ((h - y) ** 2).mean()


def workloads() -> list[tuple[str, Callable, Callable, list[Any], int]]:
    """(label, glue fn, numpy fn, arguments, bytes moved)."""
    rng = np.random.default_rng(0)

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    x, w, b = f32(R, C), f32(C), f32(C)
    logits = f32(1024, 8192)
    onehot = np.eye(8192, dtype=np.float32)[rng.integers(0, 8192, 1024)]
    ws = [f32(256, 256, scale=0.05) for _ in range(4)]
    mx, my = f32(32, 256), f32(32, 256)
    tag = f"{R}x{C} f32"
    return [
        (f"bias+gelu {tag}", g_bias_gelu, n_bias_gelu, [x, b], 2 * x.nbytes),
        (f"rmsnorm {tag}", g_rmsnorm, n_rmsnorm, [x, w], 2 * x.nbytes),
        (f"layernorm {tag}", g_layernorm, n_layernorm, [x, w, b], 2 * x.nbytes),
        (f"softmax {tag}", g_softmax, n_softmax, [x], 2 * x.nbytes),
        ("xent 1024x8192 f32", g_xent, n_xent, [logits, onehot], 2 * logits.nbytes),
        ("mlp fwd B32 D256 L4 f32", g_mlp, n_mlp, [ws, mx, my], 0),
    ]


def torch_fns() -> dict[str, Callable] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)

    def layernorm(x, w, b):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) * torch.rsqrt(v + 1e-5) * w + b

    def xent(logits, onehot):
        m = logits.amax(-1, keepdim=True)
        lse = torch.log(torch.exp(logits - m).sum(-1, keepdim=True)) + m
        return ((lse - logits) * onehot).sum(-1).mean()

    def mlp(ws, x, y):
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return ((h - y) ** 2).mean()

    def softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    return {"bias+gelu": lambda x, b: F.gelu(x + b, approximate="tanh"),
            "rmsnorm": lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
            "layernorm": layernorm, "softmax": softmax, "xent": xent, "mlp": mlp}


def jax_fns() -> dict[str, Callable] | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def layernorm(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * w + b

    def xent(logits, onehot):
        m = logits.max(-1, keepdims=True)
        lse = jnp.log(jnp.exp(logits - m).sum(-1, keepdims=True)) + m
        return ((lse - logits) * onehot).sum(-1).mean()

    def mlp(ws, x, y):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return ((h - y) ** 2).mean()

    def softmax(x):
        e = jnp.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return {"bias+gelu": lambda x, b: jax.nn.gelu(x + b, approximate=True),
            "rmsnorm": lambda x, w: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
            "layernorm": layernorm, "softmax": softmax, "xent": xent, "mlp": mlp}


# --- timing ------------------------------------------------------------------------------------

def median_us(fn: Callable[[], Any]) -> float:
    for _ in range(WARMUP):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < ITERS or time.perf_counter() - start < MIN_SECONDS:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def copy_gbs() -> float:
    a = np.ones(256 * 2 ** 20 // 4, np.float32)
    out = np.empty_like(a)
    return 2 * a.nbytes / median_us(lambda: np.copyto(out, a)) / 1e3


def compile_seconds(fn: Callable, args: list) -> tuple[float, float]:
    """(cold: nothing cached, from the disk cache) seconds from a fresh jit to a first result."""
    saved = os.environ.get("GLUE_CACHE_DIR")
    times = []
    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["GLUE_CACHE_DIR"] = cache
            for _ in range(2):
                t0 = time.perf_counter()
                np.asarray(glue.jit(fn, backend="cpu")(*args))
                times.append(time.perf_counter() - t0)
    finally:
        if saved is None:
            os.environ.pop("GLUE_CACHE_DIR", None)
        else:
            os.environ["GLUE_CACHE_DIR"] = saved
    return times[0], times[1]


def _check(label: str, got: Any, want: Any) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max()))):
        raise AssertionError(f"{label}: glue disagrees with NumPy (max abs error {np.abs(got - want).max():.3g})")


def run(peers: set[str], only: str | None) -> tuple[list[dict], float]:
    """Measure glue and NumPy on every workload first, then torch, then JAX: a library whose
    worker threads keep spinning after it returns slows whatever runs next (NumPy's matmul
    after JAX took 200x its time here), so each library runs after the previous ones are done."""
    ceiling = copy_gbs()
    chosen = [w for w in workloads() if not only or only in w[0]]
    rows = []
    for label, gfn, nfn, args, nbytes in chosen:
        row: dict[str, Any] = {"workload": label, "bytes": nbytes}
        row["compile cold s"], row["compile cached s"] = compile_seconds(gfn, args)
        jitted = glue.jit(gfn, backend="cpu")
        _check(label, jitted(*args), nfn(*args))
        row["glue"] = median_us(lambda: jitted(*args))
        compiled, leaves = jitted.lower(*args).compile(), tree_flatten(list(args))[0]
        row["glue no-jit"] = median_us(lambda: compiled.call_flat(leaves))
        row["numpy"] = median_us(lambda: nfn(*args))
        rows.append(row)
        _progress(row)
    torch_impl = torch_fns() if "torch" in peers else None
    if torch_impl is not None:
        import torch
        for row, (label, _, _, args, _) in zip(rows, chosen):
            targs = [[torch.from_numpy(w) for w in a] if isinstance(a, list) else torch.from_numpy(a)
                     for a in args]
            tfn = torch_impl[label.split()[0]]
            row["torch eager"] = median_us(lambda: tfn(*targs))
            try:
                compiled = torch.compile(tfn)
                row["torch.compile"] = median_us(lambda: compiled(*targs))
            except Exception as exc:  # a peer that fails to compile is reported, not fatal
                print(f"torch.compile failed on {label}: {exc!r}"[:300], file=sys.stderr)
            _progress(row)
    jax_impl = jax_fns() if "jax" in peers else None
    if jax_impl is not None:
        import jax
        for row, (label, _, _, args, _) in zip(rows, chosen):
            jfn = jax.jit(jax_impl[label.split()[0]])
            jargs = [[jax.numpy.asarray(w) for w in a] if isinstance(a, list) else jax.numpy.asarray(a)
                     for a in args]
            row["jax.jit"] = median_us(lambda: jax.block_until_ready(jfn(*jargs)))
            _progress(row)
    return rows, ceiling


def _progress(row: dict) -> None:
    print(f"{row['workload']}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)),
          file=sys.stderr, flush=True)


PEERS = ("torch eager", "torch.compile", "jax.jit")


def table(rows: list[dict], ceiling: float) -> str:
    present = [p for p in PEERS if any(p in r for r in rows)]
    head = ["workload", "glue µs", "glue GB/s (% of copy)", "glue no-jit µs", "numpy µs"] + \
           [f"{p} µs" for p in present] + ["× vs numpy", "× vs best compiler", "compile cold / cached s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        gbs = r["bytes"] / r["glue"] / 1e3 if r["bytes"] else None
        compilers = [r[p] for p in ("torch.compile", "jax.jit") if p in r]
        cells = [r["workload"], f"{r['glue']:.0f}",
                 f"{gbs:.1f} ({100 * gbs / ceiling:.0f}%)" if gbs else "—", f"{r['glue no-jit']:.0f}",
                 f"{r['numpy']:.0f}"]
        cells += [f"{r[p]:.0f}" if p in r else "—" for p in present]
        cells += [f"{r['numpy'] / r['glue']:.2f}", f"{min(compilers) / r['glue']:.2f}" if compilers else "—",
                  f"{r['compile cold s']:.2f} / {r['compile cached s']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cores, load average {load:.1f} at the start"


def versions() -> str:
    found = [f"numpy {np.__version__}"]
    for name in ("torch", "jax"):
        module = sys.modules.get(name)
        if module is not None:
            found.append(f"{name} {module.__version__}")
    return ", ".join(found)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cpu")
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "RESULTS.md"),
                        help="markdown file the table is appended to ('' for none)")
    parser.add_argument("--peers", default="torch,jax", help="comma-separated peers to try: torch, jax")
    parser.add_argument("--only", help="run only workloads whose label contains this")
    args = parser.parse_args(argv)
    where = machine()
    rows, ceiling = run(set(filter(None, args.peers.split(","))), args.only)
    text = (f"## cpu — {datetime.date.today().isoformat()}\n\nMachine: {where}. Copy ceiling "
            f"(np.copyto 256 MiB, read + write): {ceiling:.1f} GB/s. {versions()}.\n"
            f"Command: `python -m benchmarks cpu {' '.join(argv or [])}`. Median wall time per call "
            f"(at least {ITERS} calls and {MIN_SECONDS} s after {WARMUP} warm-up calls); glue and NumPy "
            f"first, then torch (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}), then JAX.\n\n"
            f"{table(rows, ceiling)}\n")
    print(text)
    if args.results:
        new = not os.path.exists(args.results)
        with open(args.results, "a") as f:
            f.write(("# Benchmark results\n" if new else "") + "\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
