"""`python -m benchmarks cuda`: glue's cuda backend against torch eager, torch.compile and jax.jit
on the glue workloads of `../shared/anchors/peers_gpu.py` (bias+gelu, rmsnorm, layernorm, softmax
on 8192x4096 in f32 and bf16; cross-entropy 4096x32000 f32) and softmaxes over 65536- and
262144-wide rows (too long for registers: the looping variant), with a 1 GiB device copy as the
bandwidth ceiling, all in one process on one GPU; then the small-launch loops of
`cuda_loops.py` (an MLP training loop, a tiny add). `--suite` picks one of the two, or the
contractions (`cuda_matmul.py`), the training step (`step.py`) or attention (`cuda_attention.py`).

Per workload and peer:
- per call: host wall clock from the call to its result being ready (median of ITERS calls);
- kernel: device time per call, from CUDA events around BURST back-to-back replays of the CUDA
  graph a glue call launches, or BURST back-to-back calls (torch), or the wall clock of such a
  burst (jax, which has no events), divided by BURST;
- GB/s: the workload's bytes (inputs read once, output written once, as the anchors count them)
  over the kernel time, and that as a percentage of the copy ceiling;
- host: for glue, the host time until a call returns with its work queued (no waiting);
- no-jit call: for glue, the per-call time through the compiled executable, without the jit
  frontend's argument handling (what the backend itself costs).
The table is printed and appended to benchmarks/RESULTS.md (or --results) with date, machine and
command. Inputs live on the device before timing; glue's output is checked against NumPy.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any, Callable

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import glue  # noqa: E402
import glue.nn as nn  # noqa: E402
import glue.numpy as gnp  # noqa: E402
from glue.backend_cuda.runtime import DeviceBuffer, Event, driver, get_context  # noqa: E402

from benchmarks import cuda_attention, cuda_loops, cuda_matmul, step  # noqa: E402
from benchmarks.cuda_loops import device_put  # noqa: E402

ITERS, BURST, WARMUP = 50, 20, 5
R, C = 8192, 4096
BF16 = np.dtype(ml_dtypes.bfloat16)


# --- the workloads, in glue and for the peers ----------------------------------------------------

def bias_gelu(x, b):
    return nn.gelu(x + b)


def rmsnorm(x, w):
    return x * (1 / gnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)) * w


def layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * (1 / gnp.sqrt(v + 1e-5)) * w + b


def softmax(x):
    e = gnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def xent(logits, onehot):
    m = logits.max(-1, keepdims=True)
    lse = gnp.log(gnp.exp(logits - m).sum(-1, keepdims=True)) + m
    return ((lse - logits) * onehot).sum(-1).mean()


def numpy_reference(name: str, args: list[np.ndarray]) -> np.ndarray:
    a = [x.astype(np.float64) for x in args]
    if name == "bias+gelu":
        z = a[0] + a[1]
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    if name == "rmsnorm":
        return a[0] / np.sqrt((a[0] ** 2).mean(-1, keepdims=True) + 1e-6) * a[1]
    if name == "layernorm":
        m = a[0].mean(-1, keepdims=True)
        return (a[0] - m) / np.sqrt(((a[0] - m) ** 2).mean(-1, keepdims=True) + 1e-5) * a[1] + a[2]
    if name == "softmax":
        e = np.exp(a[0] - a[0].max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    m = a[0].max(-1, keepdims=True)
    lse = np.log(np.exp(a[0] - m).sum(-1, keepdims=True)) + m
    return np.asarray(((lse - a[0]) * a[1]).sum(-1).mean())


def torch_fns() -> dict[str, Callable]:
    import torch
    import torch.nn.functional as F

    def t_xent(logits, onehot):
        m = logits.amax(-1, keepdim=True)
        lse = torch.log(torch.exp(logits - m).sum(-1, keepdim=True)) + m
        return ((lse - logits) * onehot).sum(-1).mean()

    def t_layernorm(x, w, b):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) * torch.rsqrt(v + 1e-5) * w + b

    def t_softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    return {"bias+gelu": lambda x, b: F.gelu(x + b, approximate="tanh"),
            "rmsnorm": lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
            "layernorm": t_layernorm, "softmax": t_softmax, "xent": t_xent}


def jax_fns() -> dict[str, Callable]:
    import jax
    import jax.numpy as jnp

    def j_xent(logits, onehot):
        m = logits.max(-1, keepdims=True)
        lse = jnp.log(jnp.exp(logits - m).sum(-1, keepdims=True)) + m
        return ((lse - logits) * onehot).sum(-1).mean()

    def j_layernorm(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * w + b

    def j_softmax(x):
        e = jnp.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return {"bias+gelu": lambda x, b: jax.nn.gelu(x + b, approximate=True),
            "rmsnorm": lambda x, w: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
            "layernorm": j_layernorm, "softmax": j_softmax, "xent": j_xent}


GLUE_FNS = {"bias+gelu": bias_gelu, "rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax, "xent": xent}


def workloads() -> list[tuple[str, str, list[tuple[int, ...]], Any, int]]:
    """(name, label, input shapes, dtype, bytes moved)."""
    out = []
    for dtype, size in ((np.float32, 4), (BF16, 2)):
        tag = "f32" if dtype == np.float32 else "bf16"
        for name, shapes in (("bias+gelu", [(R, C), (C,)]), ("rmsnorm", [(R, C), (C,)]),
                             ("layernorm", [(R, C), (C,), (C,)]), ("softmax", [(R, C)])):
            out.append((name, f"{name} {R}x{C} {tag}", shapes, dtype, 2 * R * C * size))
    out.append(("xent", "xent 4096x32000 f32", [(4096, 32000), (4096, 32000)], np.float32, 2 * 4096 * 32000 * 4))
    # rows too long to hold in registers (a large vocabulary): glue's looping variant, in three
    # passes over the row and, for the longer rows, with the online max and sum
    for rows, cols in ((2048, 65536), (512, 262144)):
        out.append(("softmax", f"softmax {rows}x{cols} f32", [(rows, cols)], np.float32, 2 * rows * cols * 4))
    return out


# --- timing -------------------------------------------------------------------------------------

def median_us(fn: Callable[[], Any], iters: int = ITERS) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def glue_times(f: Callable, exe: Any, args: list) -> dict[str, float]:
    """Per call through the jitted function; kernel time from events around a burst of replays
    of the CUDA graph the executable's calls launch (the program's device work alone: no host
    code between the replays), or of calls of the executable where it launches directly."""
    stream = get_context().stream
    for _ in range(WARMUP):
        f(*args).block_until_ready()
    per_call = median_us(lambda: f(*args).block_until_ready())
    buffers = [a.buffer for a in args]  # the executable takes raw buffers
    out = exe(*buffers)
    graph = exe.last_graph if exe.graph_stats.direct == 0 else None
    run = (lambda: graph.launch(stream)) if graph is not None else (lambda: exe(*buffers))
    bursts = []
    for _ in range(5):
        start, end = Event(stream.ctx, timing=True), Event(stream.ctx, timing=True)
        start.record(stream)
        for _ in range(BURST):
            run()
        end.record(stream)
        end.synchronize()
        bursts.append(start.elapsed_ms(end) * 1e3 / BURST)
    del out
    host = []
    for _ in range(ITERS):
        t0 = time.perf_counter()
        out = f(*args)
        host.append(time.perf_counter() - t0)
        out.block_until_ready()
    return {"per_call": per_call, "kernel": statistics.median(bursts), "host": statistics.median(host) * 1e6}


def torch_times(fn: Callable, args: list) -> dict[str, float]:
    import torch

    for _ in range(WARMUP):
        fn(*args)
    torch.cuda.synchronize()

    def call():
        fn(*args)
        torch.cuda.synchronize()

    per_call = median_us(call)
    bursts = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(BURST):
            fn(*args)
        e.record()
        e.synchronize()
        bursts.append(s.elapsed_time(e) * 1e3 / BURST)
    return {"per_call": per_call, "kernel": statistics.median(bursts)}


def jax_times(fn: Callable, args: list) -> dict[str, float]:
    import jax

    for _ in range(WARMUP):
        jax.block_until_ready(fn(*args))
    per_call = median_us(lambda: jax.block_until_ready(fn(*args)))
    bursts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(BURST):
            out = fn(*args)
        jax.block_until_ready(out)
        bursts.append((time.perf_counter() - t0) * 1e6 / BURST)
    return {"per_call": per_call, "kernel": statistics.median(bursts)}


def copy_ceiling_us() -> float:
    """A 1 GiB device-to-device copy through the driver, timed with events (median of 10)."""
    ctx = get_context()
    stream = ctx.stream
    n = 1 << 30
    src, dst = DeviceBuffer((n // 4,), np.float32, stream), DeviceBuffer((n // 4,), np.float32, stream)
    copy = driver.load().cuMemcpyDtoDAsync
    times = []
    for i in range(13):
        s, e = Event(ctx, timing=True), Event(ctx, timing=True)
        s.record(stream)
        driver.check(copy(dst.ptr, src.ptr, n, stream.handle), "cuMemcpyDtoDAsync")
        e.record(stream)
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_ms(e) * 1e3)
    return statistics.median(times)


# --- the run ------------------------------------------------------------------------------------

def run(peers: set[str], only: str | None) -> tuple[list[dict], float]:
    rows: list[dict] = []
    copy_us = copy_ceiling_us()
    ceiling = 2 * (1 << 30) / copy_us / 1e3
    rows.append({"workload": "copy 1GiB", "peer": "cuMemcpyDtoD", "per_call": copy_us, "kernel": copy_us,
                 "GB/s": ceiling})
    print(f"copy ceiling: {copy_us:.1f} us, {ceiling:.0f} GB/s", flush=True)
    tfns = jfns = None
    if peers & {"torch", "torch.compile"}:
        import torch

        tfns = torch_fns()
    if "jax" in peers:
        import jax
        import jax.numpy as jnp

        jfns = jax_fns()
    rng = np.random.default_rng(0)
    for name, label, shapes, dtype, nbytes in workloads():
        if only and only not in label:
            continue
        host = [rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in shapes]
        attempt(rows, label, "glue", lambda: glue_row(name, host), nbytes)
        if tfns is not None:
            tdt = torch.float32 if dtype == np.float32 else torch.bfloat16
            targs = [torch.from_numpy(a.astype(np.float32)).to("cuda").to(tdt) for a in host]
            if "torch" in peers:
                attempt(rows, label, "torch eager", lambda: torch_times(tfns[name], targs), nbytes)
            if "torch.compile" in peers:
                attempt(rows, label, "torch.compile", lambda: torch_times(torch.compile(tfns[name]), targs), nbytes)
            del targs
            torch.cuda.empty_cache()
        if jfns is not None:
            jdt = jnp.float32 if dtype == np.float32 else jnp.bfloat16
            jargs = [jnp.asarray(a.astype(np.float32)).astype(jdt) for a in host]
            attempt(rows, label, "jax.jit", lambda: jax_times(jax.jit(jfns[name]), jargs), nbytes)
            del jargs
    return rows, ceiling


def glue_row(name: str, host: list[np.ndarray]) -> dict:
    f = glue.jit(GLUE_FNS[name], backend="cuda")
    dargs = [device_put(a) for a in host]
    got = np.asarray(f(*dargs)).astype(np.float64)
    want = numpy_reference(name, host)
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    compiled = next(iter(f._compiled.values()))  # the program the calls run
    exe = compiled.executable
    times = glue_times(f, exe, dargs)
    buffers = [a.buffer for a in dargs]
    times["exe"] = median_us(lambda: exe(*buffers)[0].block_until_ready())
    return {**times, "rel_err": err, "kernels": "; ".join(k.strategy for k in compiled.kernels)}


def attempt(rows: list[dict], label: str, peer: str, measure: Callable[[], dict], nbytes: int) -> None:
    """Measure one peer on one workload (`nbytes` moved per call); a peer that fails is reported
    and skipped."""
    try:
        t = measure()
    except Exception as exc:  # a missing or broken peer must not stop the others
        print(f"{label} / {peer}: failed: {exc!r}"[:500], flush=True)
        return
    rows.append({"workload": label, "peer": peer, **t, "GB/s": nbytes / t["kernel"] / 1e3})
    print(rows[-1], flush=True)


def table(rows: list[dict], ceiling: float) -> str:
    head = "| workload | peer | per call us | kernel us | GB/s | % of copy | host us | no-jit call us | rel err |\n" \
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    lines = [head]
    for r in rows:
        host = f"{r['host']:.1f}" if "host" in r else ""
        exe = f"{r['exe']:.1f}" if "exe" in r else ""
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        lines.append(f"| {r['workload']} | {r['peer']} | {r['per_call']:.1f} | {r['kernel']:.1f} | "
                     f"{r['GB/s']:.0f} | {100 * r['GB/s'] / ceiling:.0f}% | {host} | {exe} | {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cuda", description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "RESULTS.md"),
                        help="markdown file the table is appended to")
    parser.add_argument("--peers", default="torch,torch.compile,jax",
                        help="comma-separated peers: torch, torch.compile, jax, glue-mma (attention suite: "
                             "glue's mma.sync flash kernels) (or none)")
    parser.add_argument("--only", default=None, help="run the workloads whose label contains this")
    parser.add_argument("--suite", default="all", choices=("all", "bandwidth", "loops", "matmul", "step", "attention"),
                        help="the memory-bound kernels, the small-launch loops (cuda_loops.py), both (all), "
                             "the contractions (cuda_matmul.py) or the training step (step.py)")
    parser.add_argument("--variants", default="library,codegen",
                        help="matmul suite: who serves glue's products (library, codegen, mma.sync)")
    parser.add_argument("--configs", default="small,gpt2", help="step suite: configs of benchmarks/step.py")
    parser.add_argument("--precisions", default="f32,bf16", help="step suite: f32, bf16 or both")
    parser.add_argument("--profile", action="store_true", help="step suite: where glue's step spends its time")
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="attention suite: sequence lengths")
    parser.add_argument("--heads", default="64,128", help="attention suite: head sizes")
    args = parser.parse_args(argv)
    peers = set(p for p in args.peers.split(",") if p and p != "none")
    sections = []
    if args.suite in ("all", "bandwidth"):
        rows, ceiling = run(peers, args.only)
        glue_rows = [r for r in rows if r["peer"] == "glue"]
        kernels = "\n".join(f"- {r['workload']}: {r['kernels']}" for r in glue_rows)
        sections.append(f"{table(rows, ceiling)}\n\nglue kernels:\n{kernels}")
    if args.suite in ("all", "loops"):
        sections.append(cuda_loops.table(cuda_loops.run(peers, args.only)))
    if args.suite == "matmul":
        variants = tuple(args.variants.split(","))
        sections.append(cuda_matmul.table(cuda_matmul.run(peers, args.only, variants)))
    if args.suite == "attention":
        sections.append(cuda_attention.table(cuda_attention.run(peers, [int(t) for t in args.lengths.split(",")],
                                                                [int(d) for d in args.heads.split(",")])))
    if args.suite == "step":
        sections.append(step.table(step.run(args.configs.split(","), args.precisions.split(","), peers,
                                            profile=args.profile)))
    text = "\n\n".join(sections)
    print(text)
    device = glue.devices()[0]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with open(args.results, "a") as f:
        f.write(f"\n## cuda, {stamp}\n\nMachine: {device} (driver {driver.version()}). Command: "
                f"`python -m benchmarks cuda {' '.join(argv if argv is not None else sys.argv[2:])}`\n\n"
                f"{text}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
