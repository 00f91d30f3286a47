"""The transformer training step suite: one GPT-style step (token and position embeddings, pre-LN
blocks with causal attention written out by hand and a GELU MLP, a head tied to the token
embedding, cross-entropy, AdamW) in glue, jax.jit and torch.compile (+ fused AdamW), the same
math and initial weights in each, in float32 and in bf16 mixed precision (float32 master
weights cast to bfloat16 for the forward and backward, norms, softmax and the loss in float32).

Per implementation and config: ms/step (the median of 3 timed loops of STEPS steps, each step's
weights and optimizer state feeding the next, one sync per loop), tokens/s, compile seconds
(the first step: tracing, compiling, loading), peak device memory (glue: its allocator's peak
bytes in use during this config's run, loading included; torch: max_memory_allocated, reset per
run; jax: the device's peak_bytes_in_use, which cannot be reset: the highest of every jax run
in the process so far), and the loss
after STEPS steps from the same start, which should agree across implementations.

`python -m benchmarks cuda --suite step` runs it on the GPU; `python -m benchmarks step --cpu`
runs glue's cpu backend against jax.jit on the host.
"""
from __future__ import annotations

import argparse
import gc
import functools
import math
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Config:
    name: str
    d: int
    heads: int
    layers: int
    T: int
    B: int
    vocab: int


CONFIGS = {
    "small": Config("d=256 heads=4 layers=4 T=128 B=8 vocab=4096", 256, 4, 4, 128, 8, 4096),
    "gpt2": Config("d=768 heads=12 layers=4 T=512 B=8 vocab=8192", 768, 12, 4, 512, 8, 8192),
}
STEPS = 10
LR, BETA1, BETA2, EPS, WD = 3e-4, 0.9, 0.95, 1e-8, 0.1


def init(cfg: Config, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Initial weights (a flat list, in the order `unpack` reads them), tokens and targets."""
    rng = np.random.default_rng(seed)
    d = cfg.d

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    params = [normal(cfg.vocab, d), normal(cfg.T, d)]
    for _ in range(cfg.layers):
        params += [np.ones(d, np.float32), np.zeros(d, np.float32),
                   normal(d, 3 * d), np.zeros(3 * d, np.float32),
                   normal(d, d, std=0.02 / math.sqrt(2 * cfg.layers)), np.zeros(d, np.float32),
                   np.ones(d, np.float32), np.zeros(d, np.float32),
                   normal(d, 4 * d), np.zeros(4 * d, np.float32),
                   normal(4 * d, d, std=0.02 / math.sqrt(2 * cfg.layers)), np.zeros(d, np.float32)]
    params += [np.ones(d, np.float32), np.zeros(d, np.float32)]
    tokens = rng.integers(0, cfg.vocab, (cfg.B, cfg.T)).astype(np.int32)
    # targets: the next token of a fixed random "text", so the loss can fall
    targets = np.roll(tokens, -1, axis=1)
    return params, tokens, targets


def layer_norm_xp(xp: Any, cast: Callable, x: Any, g: Any, b: Any) -> Any:
    """The step's layer norm in float32, its result cast to the activations' precision."""
    x32 = x.astype(xp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return cast((x32 - mean) / xp.sqrt(var + 1e-5) * g + b)


def embedded(xp: Any, cast: Callable, cfg: Config, params: list, tokens: Any) -> tuple[Any, Any, Any]:
    """The token table, the tokens' and positions' embeddings summed in the activations'
    precision, and the causal mask."""
    wte, wpe = params[0], params[1]
    return wte, cast(xp.take(wte, tokens, axis=0) + wpe[None, :, :]), xp.tril(xp.ones((cfg.T, cfg.T), dtype=bool))


def layer_params(params: list, layer: int) -> list:
    """A block's twelve parameters: its norms', attention's and MLP's weights and biases."""
    return params[2 + 12 * layer: 14 + 12 * layer]


def model_loss(xp: Any, nn: Any, logsumexp: Callable, cfg: Config, params: list, tokens: Any, targets: Any,
               bf16: bool) -> Any:
    """The GPT-style loss, written once for glue.numpy and jax.numpy (`xp`, `nn`)."""
    d, H = cfg.d, cfg.heads
    Dh = d // H
    low = xp.bfloat16 if bf16 else xp.float32
    cast = (lambda x: x.astype(low)) if bf16 else (lambda x: x)


    layer_norm = functools.partial(layer_norm_xp, xp, cast)
    wte, x, causal = embedded(xp, cast, cfg, params, tokens)
    for layer in range(cfg.layers):
        g1, b1, wqkv, bqkv, wo, bo, g2, b2, w1, bb1, w2, bb2 = layer_params(params, layer)
        h = layer_norm(x, g1, b1)
        qkv = h @ cast(wqkv) + cast(bqkv)
        qkv = qkv.reshape(cfg.B, cfg.T, 3, H, Dh).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = (q @ k.swapaxes(-1, -2)).astype(xp.float32) * (1.0 / math.sqrt(Dh))
        s = xp.where(causal, s, -1e9)
        p = cast(nn.softmax(s, axis=-1))
        o = (p @ v).transpose(0, 2, 1, 3).reshape(cfg.B, cfg.T, d)
        x = x + o @ cast(wo) + cast(bo)
        h = layer_norm(x, g2, b2)
        x = x + nn.gelu(h @ cast(w1) + cast(bb1), approximate=True) @ cast(w2) + cast(bb2)
    h = layer_norm(x, params[-2], params[-1])
    logits = (h @ cast(wte).T).astype(xp.float32)
    picked = xp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (logsumexp(logits, axis=-1) - picked).mean()


def adamw(xp: Any, params: list, grads: list, m: list, v: list, c1: Any, c2: Any) -> tuple[list, list, list]:
    """One AdamW step (decoupled weight decay), `c1`/`c2` the bias corrections 1/(1-beta^t)."""
    new_p, new_m, new_v = [], [], []
    for p, g, mi, vi in zip(params, grads, m, v):
        mi = BETA1 * mi + (1 - BETA1) * g
        vi = BETA2 * vi + (1 - BETA2) * g * g
        update = (mi * c1) / (xp.sqrt(vi * c2) + EPS)
        new_p.append(p - LR * (update + WD * p))
        new_m.append(mi)
        new_v.append(vi)
    return new_p, new_m, new_v


def corrections(t: int) -> tuple[np.float32, np.float32]:
    return np.float32(1 / (1 - BETA1 ** t)), np.float32(1 / (1 - BETA2 ** t))


@dataclass
class Result:
    impl: str
    ms: float
    compile_s: float
    peak_mib: float | None
    loss: float

    def row(self, cfg: Config, prec: str) -> dict:
        return {"config": cfg.name, "prec": prec, "impl": self.impl, "ms/step": round(self.ms, 3),
                "tok/s": round(cfg.B * cfg.T / self.ms * 1e3), "compile s": round(self.compile_s, 2),
                "peak MiB": None if self.peak_mib is None else round(self.peak_mib), "loss": round(self.loss, 5)}


def _timed_loops(run: Callable[[int], Any], sync: Callable[[Any], None], steps: int) -> float:
    """The median over 3 loops of `steps` steps of the wall ms per step (one sync per loop)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        sync(run(steps))
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times)


# --- glue ---------------------------------------------------------------------------------------

def glue_step_fn(cfg: Config, bf16: bool) -> Callable:
    """glue's training step `(params, m, v, tokens, targets, c1, c2) -> (params, m, v, loss)`."""
    import glue
    import glue.nn as gnn
    import glue.numpy as gnp

    def loss_fn(params, tokens, targets):
        return model_loss(gnp, gnn, gnn.logsumexp, cfg, params, tokens, targets, bf16)

    def step(params, m, v, tokens, targets, c1, c2):
        loss, grads = glue.value_and_grad(loss_fn)(params, tokens, targets)
        params, m, v = adamw(gnp, params, grads, m, v, c1, c2)
        return params, m, v, loss

    return step


def glue_step(cfg: Config, backend: str, bf16: bool) -> Result:
    import glue

    # The previous config's step, its arena and its state go before this one's peak is measured.
    GLUE_STEPS.clear()
    gc.collect()
    if backend == "cuda":
        from glue.backend_cuda.runtime import get_context

        get_context().allocator.reset_peak_stats()
    jitted = glue.jit(glue_step_fn(cfg, bf16), backend=backend, donate_argnums=(0, 1, 2))
    GLUE_STEPS.append(jitted)
    params0, tokens, targets = init(cfg)

    def put(x):
        return glue.device_put(x, backend)

    state = [[put(p) for p in params0], [put(np.zeros_like(p)) for p in params0],
             [put(np.zeros_like(p)) for p in params0]]
    tokens, targets = put(tokens), put(targets)
    t = [0]

    def run(steps: int):
        loss = None
        for _ in range(steps):
            t[0] += 1
            c1, c2 = corrections(t[0])
            *new, loss = jitted(*state, tokens, targets, c1, c2)
            state[:] = new
        return loss

    start = time.perf_counter()
    loss = run(1)
    loss.block_until_ready()
    compile_s = time.perf_counter() - start
    # restart from the same weights so the reported loss is comparable with the peers' (the
    # first call's results go first: the peak is one step's, not two states side by side)
    state.clear()
    gc.collect()
    state += [[put(p) for p in params0], [put(np.zeros_like(p)) for p in params0],
              [put(np.zeros_like(p)) for p in params0]]
    t[0] = 0
    final = float(run(STEPS))
    ms = _timed_loops(run, lambda loss: loss.block_until_ready(), STEPS)
    peak = None
    if backend == "cuda":
        peak = get_context().allocator.stats().peak_bytes_in_use / 2 ** 20
        exe = next(iter(jitted._compiled.values())).executable
        choices = list(getattr(exe, "gemm_choices", {}).values())
        library = sum(c.startswith("library") for c in choices)
        print(f"glue contractions: {library} on cuBLASLt ({choices.count('library kmajor')} after a K-major "
              f"copy), {choices.count('codegen')} on glue's own kernels", flush=True)
        graphs = exe.graph_stats
        print(f"glue calls: {graphs.replays} graph replays, {graphs.captures} captures, {graphs.direct} direct "
              f"launches", flush=True)
        memory = jitted_memory(jitted)
        print(f"glue memory: {memory.report(0).splitlines()[0]}; the allocator's peak {peak:.1f} MiB, "
              f"{peak - (memory.peak_bytes + memory.scratch_bytes) / 2 ** 20:+.1f} beside the plan's peak and scratch",
              flush=True)
    return Result("glue", ms, compile_s, peak, final)


# --- jax ----------------------------------------------------------------------------------------

def jax_step(cfg: Config, bf16: bool) -> Result:
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    def loss_fn(params, tokens, targets):
        return model_loss(jnp, jax.nn, logsumexp, cfg, params, tokens, targets, bf16)

    def step(params, m, v, tokens, targets, c1, c2):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        params, m, v = adamw(jnp, params, grads, m, v, c1, c2)
        return params, m, v, loss

    jitted = jax.jit(step, donate_argnums=(0, 1, 2))
    params0, tokens, targets = init(cfg)

    def fresh():
        return [[jnp.asarray(p) for p in params0], [jnp.zeros_like(p) for p in params0],
                [jnp.zeros_like(p) for p in params0]]

    state = fresh()
    tokens, targets = jnp.asarray(tokens), jnp.asarray(targets)
    t = [0]

    def run(steps: int):
        loss = None
        for _ in range(steps):
            t[0] += 1
            c1, c2 = corrections(t[0])
            *new, loss = jitted(*state, tokens, targets, c1, c2)
            state[:] = new
        return loss

    start = time.perf_counter()
    jax.block_until_ready(run(1))
    compile_s = time.perf_counter() - start
    state[:] = fresh()
    t[0] = 0
    final = float(run(STEPS))
    ms = _timed_loops(run, jax.block_until_ready, STEPS)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return Result("jax.jit", ms, compile_s, None if peak is None else peak / 2 ** 20, final)


# --- torch --------------------------------------------------------------------------------------

def torch_step(cfg: Config, bf16: bool, compiled: bool) -> Result:
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True  # as jax.jit's default precision does
    torch.backends.cudnn.allow_tf32 = True
    params0, tokens_np, targets_np = init(cfg)
    d, H = cfg.d, cfg.heads
    Dh = d // H
    low = torch.bfloat16 if bf16 else torch.float32

    def layer_norm(x, g, b):
        x32 = x.float()
        mean = x32.mean(-1, keepdim=True)
        var = ((x32 - mean) ** 2).mean(-1, keepdim=True)
        return ((x32 - mean) / torch.sqrt(var + 1e-5) * g + b).to(low)

    causal = torch.tril(torch.ones(cfg.T, cfg.T, dtype=torch.bool, device=dev))

    def loss_fn(params, tokens, targets):
        c = [p.to(low) for p in params]
        x = (F.embedding(tokens, params[0]) + params[1][None]).to(low)
        for layer in range(cfg.layers):
            g1, b1, wqkv, bqkv, wo, bo, g2, b2, w1, bb1, w2, bb2 = range(2 + 12 * layer, 14 + 12 * layer)
            h = layer_norm(x, params[g1], params[b1])
            qkv = (h @ c[wqkv] + c[bqkv]).reshape(cfg.B, cfg.T, 3, H, Dh).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            s = (q @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(Dh))
            s = torch.where(causal, s, torch.tensor(-1e9, device=dev))
            p = torch.softmax(s, dim=-1).to(low)
            o = (p @ v).transpose(1, 2).reshape(cfg.B, cfg.T, d)
            x = x + o @ c[wo] + c[bo]
            h = layer_norm(x, params[g2], params[b2])
            x = x + F.gelu(h @ c[w1] + c[bb1], approximate="tanh") @ c[w2] + c[bb2]
        h = layer_norm(x, params[-2], params[-1])
        logits = (h @ c[0].T).float()
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1).long())

    params = [torch.tensor(p, device=dev, requires_grad=True) for p in params0]
    tokens = torch.tensor(tokens_np, device=dev)
    targets = torch.tensor(targets_np, device=dev)
    opt = torch.optim.AdamW(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WD, fused=True)
    fn = torch.compile(loss_fn) if compiled else loss_fn

    def run(steps: int):
        loss = None
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = fn(params, tokens, targets)
            loss.backward()
            opt.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run(1)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        for p, p0 in zip(params, params0):
            p.copy_(torch.tensor(p0, device=dev))
    opt = torch.optim.AdamW(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WD, fused=True)
    final = float(run(STEPS))
    ms = _timed_loops(run, lambda loss: torch.cuda.synchronize(), STEPS)
    peak = torch.cuda.max_memory_allocated() / 2 ** 20
    return Result("torch.compile" if compiled else "torch eager", ms, compile_s, peak, final)


def jitted_memory(jitted: Any) -> Any:
    """The MemoryAnalysis of a glue step's executable (its plan, and what it holds on the device)."""
    return next(iter(jitted._compiled.values())).executable.memory_analysis()


GLUE_STEPS: list[Any] = []  # the jitted steps glue_step made, for `breakdown`


def breakdown(jitted: Any, top: int = 40, repeats: int = 8) -> str:
    """Where one glue step's device time goes: every launch of the step timed alone as the
    step runs it, in a CUDA graph of `repeats` back-to-back runs (median of 7 replays; a
    profile's event pairs around direct launches would time small kernels' enqueue instead),
    on random arguments, with the bytes its plan kernel reads and writes and the time of a
    `cuMemcpyDtoDAsync` moving as many bytes (half read, half written), timed the same way; then
    the launches summed by kind and by symbol, the largest first, each kind's time against that
    copy's. (On the H200 the driver's copy reaches 2.6-3.8 TB/s at these sizes, below glue's
    own streaming kernels: a yardstick, not a bound.)"""
    import collections

    from glue.backend_cuda.gemm_choice import Noise
    from glue.backend_cuda.runtime import driver as drv
    from glue.backend_cuda.runtime.device_array import DeviceBuffer
    from glue.backend_cuda.runtime.graph import replay_us
    from glue.backend_cuda.steps import chosen_launches

    exe = next(iter(jitted._compiled.values())).executable
    program, stream = exe.program, exe.stream
    noise, args = Noise(), [DeviceBuffer(t.shape, t.dtype, stream) for t in program.arg_types]
    for buf, t in zip(args, program.arg_types):
        noise.fill(buf.ptr, t, stream)
    outs = [DeviceBuffer(t.shape, t.dtype, stream) for t in program.output_types]
    if exe.arena is not None:
        exe.arena.fill_bytes(0x3C)  # small finite floats wherever an intermediate would be
    bases = exe._bases(args, outs)
    exe.ctx.synchronize()
    launches = [l for l in chosen_launches(program, getattr(exe, "gemm_choices", None)) if l.call is None]
    sizes = [sum(b.type.nbytes for b in l.kernel.inputs + l.kernel.outputs) for l in launches]
    half = max(sizes, default=0) // 2 + 256
    source, target = (DeviceBuffer((half,), np.uint8, stream) for _ in range(2))
    memcpy = drv.load().cuMemcpyDtoDAsync
    ceilings: dict[int, float] = {}

    def copy_us(nbytes: int) -> float:
        if nbytes not in ceilings:
            ceilings[nbytes] = replay_us(stream, lambda: drv.check(
                memcpy(target.ptr, source.ptr, nbytes // 2, stream.handle), "cuMemcpyDtoDAsync"), repeats)
        return ceilings[nbytes]

    rows = []
    for launch, nbytes in zip(launches, sizes):
        steps = exe._build_steps(program, [launch])
        for st in steps:
            st.stream, st.waits, st.record, st.dependent = stream, (), None, None
        us = replay_us(stream, lambda: exe.run_steps(steps, bases), repeats)
        rows.append((us, copy_us(nbytes), nbytes, launch.kernel.kind,
                     f"{launch.variant}:{launch.strategy} g{launch.grid}x{launch.block}", launch.symbol))
    total = sum(r[0] for r in rows)
    kinds: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    symbols: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, 0.0, 0, "", ""])
    for us, ceiling, nbytes, kind, strategy, symbol in rows:
        kinds[kind][0] += us
        kinds[kind][1] += ceiling
        kinds[kind][2] += 1
        entry = symbols[symbol]
        entry[0] += us
        entry[1] += 1
        entry[2] += ceiling
        entry[3:] = [nbytes, kind, strategy]
    lines = [f"glue step: {len(rows)} launches, alone in graphs {total / 1e3:.3f} ms; by kind (us, launches, "
             "% of a driver copy of their bytes): "
             + ", ".join(f"{k} {v[0]:.1f} x{v[2]} {100 * v[1] / v[0]:.0f}%"
                         for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0]))]
    for symbol, (us, count, ceiling, nbytes, kind, strategy) in sorted(symbols.items(), key=lambda kv: -kv[1][0])[:top]:
        each = us / count
        lines.append(f"  {us:8.1f} us = {count:2d} x {each:6.1f}  {nbytes / 2 ** 20:7.2f} MiB "
                     f"{nbytes / each / 1e3:6.0f} GB/s {100 * ceiling / us:4.0f}% of memcpy  {kind:11s} "
                     f"{strategy[:60]:60s} {symbol[:70]}")
    return "\n".join(lines)


def run(configs: list[str], precisions: list[str], peers: set[str], backend: str = "cuda",
        profile: bool = False) -> list[dict]:
    rows = []
    for name in configs:
        cfg = CONFIGS[name]
        for prec in precisions:
            bf16 = prec == "bf16"
            attempts = [("glue", lambda: glue_step(cfg, backend, bf16))]
            if "jax" in peers:
                attempts.append(("jax.jit", lambda: jax_step(cfg, bf16)))
            if "torch.compile" in peers:
                attempts.append(("torch.compile", lambda: torch_step(cfg, bf16, compiled=True)))
            if "torch" in peers:
                attempts.append(("torch eager", lambda: torch_step(cfg, bf16, compiled=False)))
            for impl, attempt in attempts:
                try:
                    rows.append(attempt().row(cfg, prec))
                    if impl == "glue" and profile:
                        print(breakdown(GLUE_STEPS[-1]), flush=True)
                except Exception as exc:  # a peer failing must not lose the others' numbers
                    traceback.print_exc()
                    rows.append({"config": cfg.name, "prec": prec, "impl": impl, "error": repr(exc)[:200]})
                print(rows[-1], flush=True)
                gc.collect()
    return rows


def table(rows: list[dict]) -> str:
    cols = ["config", "prec", "impl", "ms/step", "tok/s", "compile s", "peak MiB", "loss"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['prec']} | {r['impl']} | error: {r['error']} |  |  |  |  |")
        else:
            lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks step", description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="small,gpt2")
    parser.add_argument("--precisions", default="f32,bf16")
    parser.add_argument("--peers", default="jax")
    parser.add_argument("--cpu", action="store_true", help="glue's cpu backend (peers: jax on the host)")
    args = parser.parse_args(argv)
    peers = {p for p in args.peers.split(",") if p and p != "none"}
    rows = run(args.configs.split(","), args.precisions.split(","), peers, "cpu" if args.cpu else "cuda")
    print(table(rows))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
