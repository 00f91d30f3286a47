"""Small-launch workloads of `python -m benchmarks cuda`: where host overhead, not bandwidth,
decides (the workloads of ../shared/anchors/peers_gpu_kernels_and_loops.py).

- "mlp loop": a 4-layer B32/D256 f32 tanh MLP training step (forward, backward by
  value_and_grad, SGD update), 100 steps back to back, each step's weights feeding the next,
  one sync at the end; the median over 5 loops of the time per step. glue runs it as written
  (like the jax.jit peer) and with the weights donated.
- "tiny add enqueue": a jitted 16-element add called 2000 times back to back, each result the
  next input, timed to the last result being ready: what one cached call costs the host.
- "tiny add call+sync": one such call and a wait for its result (median of many).

For glue each row also reports the host time per step (the loop without its final sync), the
kernels per step, the streams its plan uses, and how calls ran (graph replays / captures /
direct launches). Diagnostics printed before the table: the MLP step's device time alone (its
graphs replayed back to back), a cProfile of its host path, each kernel's time in a
`glue.profile` trace, and what each layer of a cached tiny call costs the host.
"""
from __future__ import annotations

import statistics
import time
import traceback
from typing import Any, Callable

import numpy as np

import glue
import glue.numpy as gnp


def device_put(x: np.ndarray) -> glue.Array:
    return glue.device_put(x, "cuda")

B, D, L, STEPS, LOOPS, TINY = 32, 256, 4, 100, 5, 2000
MLP = f"mlp loop B{B} D{D} L{L} f32 (per step)"
TINY_ENQUEUE = "tiny add enqueue (per call, no sync)"
TINY_SYNC = "tiny add call+sync (per call)"


def _loss(ws, x, y):
    h = x
    for w in ws:
        h = gnp.tanh(h @ w)
    return ((h - y) ** 2).mean()


def _step(ws, x, y):
    loss, gs = glue.value_and_grad(_loss)(ws, x, y)
    return [w - 0.01 * g for w, g in zip(ws, gs)], loss


def _mlp_data(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((D, D)) * 0.05).astype(np.float32) for _ in range(L)]
    return ws, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def _loop_us(run_steps: Callable[[int], Any], sync: Callable[[Any], None]) -> tuple[float, float]:
    """(median wall us per step with one sync per loop, median host us per step before it)."""
    sync(run_steps(10))
    walls, hosts = [], []
    for _ in range(LOOPS):
        t0 = time.perf_counter()
        out = run_steps(STEPS)
        t1 = time.perf_counter()
        sync(out)
        t2 = time.perf_counter()
        walls.append((t2 - t0) / STEPS * 1e6)
        hosts.append((t1 - t0) / STEPS * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def _carried(step: Callable[[Any], Any], state: Any) -> Callable[[int], Any]:
    """run(n): n calls of `step`, each on the previous call's result (the first on `state`),
    returning the last; the next run goes on from there."""
    box = [state]

    def run(n: int) -> Any:
        value = box[0]
        for _ in range(n):
            value = step(value)
        box[0] = value
        return value

    return run


def _tiny_us(add: Callable[[Any], Any], z: Any, sync: Callable[[Any], None]) -> tuple[float, float]:
    """(wall, host) us per call of `add`, called back to back on its own results."""
    run, per = _carried(add, z), TINY // STEPS
    wall, host = _loop_us(lambda n: run(per * n), sync)
    return wall / per, host / per


def glue_mlp(donate: bool) -> dict:
    step = glue.jit(_step, backend="cuda", donate_argnums=(0,) if donate else ())
    ws0, x0, y0 = _mlp_data()
    x, y = device_put(x0), device_put(y0)
    run_steps = _carried(lambda state: step(state[0], x, y), ([device_put(w.copy()) for w in ws0], None))
    # one step checked against NumPy first (on fresh weights, not the donated ones)
    (new, loss) = step([device_put(w) for w in ws0], x, y)
    want_new, want_loss = _numpy_step(ws0, x0, y0)
    err = max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(new, want_new))
    err = max(err, abs(float(loss) - want_loss))
    wall, host = _loop_us(run_steps, lambda out: out[1].block_until_ready())
    compiled = next(iter(step._compiled.values()))
    exe = compiled.executable
    stats = exe.graph_stats
    return {"workload": MLP, "peer": "glue donated" if donate else "glue", "us": wall, "host": host,
            "kernels": len(compiled.kernels), "streams": len(exe.streams), "max_abs_err": err,
            "runs": f"{stats.replays} replays / {stats.captures} captures / {stats.direct} direct"}


def mlp_kernel_times() -> list[tuple[str, float]]:
    """Each kernel of the MLP step and its device time (us, median of 5 profiled steps, launched
    directly with timing events: see glue.profile)."""
    import json
    import os
    import tempfile

    step = glue.jit(_step, backend="cuda")
    ws0, x0, y0 = _mlp_data()
    ws, x, y = [device_put(w) for w in ws0], device_put(x0), device_put(y0)
    ws, loss = step(ws, x, y)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        with glue.profile(path):
            for _ in range(5):
                ws, loss = step(ws, x, y)
            loss.block_until_ready()
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
    durations: dict[str, list[float]] = {}
    for e in trace:
        if e.get("cat") == "kernel":
            durations.setdefault(e["name"], []).append(e["dur"])
    calls = [e for e in trace if e.get("cat") == "call"]
    rows = [(name, statistics.median(v)) for name, v in durations.items()]
    rows.append(("(step, host call, profiled)", statistics.median(e["dur"] for e in calls)))
    return rows


def mlp_diagnostics(donate: bool) -> list[tuple[str, float]]:
    """The MLP step's device time alone (its graph replayed back to back, timed with events) and
    where a step's host time goes (cProfile of 200 steps: the functions with most own time)."""
    import cProfile
    import io
    import pstats

    from glue.backend_cuda.runtime import Event, get_context

    step = glue.jit(_step, backend="cuda", donate_argnums=(0,) if donate else ())
    ws0, x0, y0 = _mlp_data()
    ws, x, y = [device_put(w) for w in ws0], device_put(x0), device_put(y0)
    graphs = []
    for _ in range(5):  # a loop's outputs alternate between two blocks: two graphs
        ws, loss = step(ws, x, y)
        graphs = (graphs + [next(iter(step._compiled.values())).executable.last_graph])[-2:]
    ctx = get_context()
    rows = []
    for label, order in (("one graph", graphs[-1:]), ("two graphs alternating", graphs)):
        start, end = Event(ctx, timing=True), Event(ctx, timing=True)
        start.record(ctx.stream)
        for i in range(STEPS):
            order[i % len(order)].launch(ctx.stream)
        end.record(ctx.stream)
        end.synchronize()
        rows.append((f"device us per step ({label} replayed)", start.elapsed_ms(end) * 1000 / STEPS))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        ws, loss = step(ws, x, y)
    profile.disable()
    loss.block_until_ready()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue()[-4000:], flush=True)
    return rows


def _numpy_step(ws: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[list[np.ndarray], float]:
    hs = [x.astype(np.float64)]
    for w in ws:
        hs.append(np.tanh(hs[-1] @ w))
    diff = hs[-1] - y
    loss = float((diff ** 2).mean())
    g = 2 * diff / diff.size
    new = [None] * len(ws)
    for i in reversed(range(len(ws))):
        g = g * (1 - hs[i + 1] ** 2)
        new[i] = ws[i] - 0.01 * (hs[i].T @ g)
        g = g @ ws[i].T
    return new, loss


def glue_tiny() -> list[dict]:
    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = device_put(np.ones(16, np.float32))
    wall, host = _tiny_us(add, add(z), lambda out: out.block_until_ready())
    sync = _median_us(lambda: add(z).block_until_ready())
    stats = next(iter(add._compiled.values())).executable.graph_stats
    runs = f"{stats.replays} replays / {stats.captures} captures / {stats.direct} direct"
    return [{"workload": TINY_ENQUEUE, "peer": "glue", "us": wall, "host": host, "runs": runs},
            {"workload": TINY_SYNC, "peer": "glue", "us": sync}]


def host_path() -> list[tuple[str, float]]:
    """Where a cached call's host time goes, for the tiny add and the MLP step: each layer of
    the call path alone, and the driver calls it makes (median us over many calls, nothing
    waited for)."""
    from glue.backend_cuda.runtime import DeviceBuffer, Event, driver, get_context

    add = glue.jit(lambda v: v + 1, backend="cuda")
    z = device_put(np.ones(16, np.float32))
    for _ in range(3):
        z = add(z)
    compiled = next(iter(add._compiled.values()))
    exe = compiled.executable
    graph = exe.last_graph
    ctx = get_context()
    s0 = ctx.stream
    d = driver.load()
    stream_obj = d.CUstream(s0.handle)

    def _median_us(fn: Callable[[], Any], n: int) -> float:  # the device drained every 100 calls
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if i % 100 == 99:
                ctx.synchronize()
        return statistics.median(times) * 1e6

    rows = [
        ("jit call (whole path)", _median_us(lambda: add(z), 5000)),
        ("lean call (frontend + executable)", _median_us(lambda: compiled.lean((z,), None), 5000)),
        ("executable lean_call", _median_us(lambda: exe.lean_call([z.buffer]), 5000)),
        ("Compiled.call_tree (usual path)", _median_us(lambda: compiled.call_tree([z]), 5000)),
        ("executable call (usual path)", _median_us(lambda: exe(z.buffer), 5000)),
        ("graph launch (glue)", _median_us(lambda: graph.launch(s0), 5000)),
        ("cuGraphLaunch, CUstream object", _median_us(lambda: d.cuGraphLaunch(graph.exec, stream_obj), 5000)),
        ("cuEventRecord (glue Event)", _median_us(lambda: Event(ctx).record(s0), 5000)),
        ("DeviceBuffer alloc + free", _median_us(lambda: DeviceBuffer((16,), np.float32, s0), 5000)),
        ("glue.Array wrap", _median_us(lambda: glue.Array(z.buffer, z.aval), 5000)),
    ]
    step = glue.jit(_step, backend="cuda")
    ws0, x0, y0 = _mlp_data()
    state = [[device_put(w) for w in ws0], device_put(x0), device_put(y0)]
    for _ in range(5):
        state[0] = step(*state)[0]
    compiled = next(iter(step._compiled.values()))
    leaves = [*state[0], state[1], state[2]]
    buffers = [a.buffer for a in leaves]
    graph = compiled.executable.last_graph
    rows += [
        ("mlp step: jit call (whole path)", _median_us(lambda: step(*state), 2000)),
        ("mlp step: Compiled.call_tree", _median_us(lambda: compiled.call_tree(leaves), 2000)),
        ("mlp step: executable call", _median_us(lambda: compiled.executable(*buffers), 2000)),
        ("mlp step: graph launch", _median_us(lambda: graph.launch(s0), 2000)),
    ]
    ctx.synchronize()
    return rows


def _median_us(fn: Callable[[], Any], n: int = 500) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def torch_rows() -> list[dict]:
    import torch

    def step_t(ws, x, y):
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        loss = ((h - y) ** 2).mean()
        gs = torch.autograd.grad(loss, ws)
        with torch.no_grad():
            for w, g in zip(ws, gs):
                w -= 0.01 * g
        return loss

    ws0, x0, y0 = _mlp_data()
    rows = []
    for peer, step in (("torch eager", step_t),
                       ("torch.compile default", torch.compile(step_t)),
                       ("torch.compile reduce-overhead", torch.compile(step_t, mode="reduce-overhead"))):
        ws = [torch.from_numpy(w).cuda().requires_grad_(True) for w in ws0]
        x, y = torch.from_numpy(x0).cuda(), torch.from_numpy(y0).cuda()
        run_steps = _carried(lambda loss, step=step, ws=ws: step(ws, x, y), None)  # updates ws in place
        try:
            wall, host = _loop_us(run_steps, lambda out: torch.cuda.synchronize())
        except Exception as exc:  # a broken peer must not stop the others
            print(f"{MLP} / {peer}: failed: {exc!r}"[:400], flush=True)
            continue
        rows.append({"workload": MLP, "peer": peer, "us": wall, "host": host})
    z = torch.ones(16, device="cuda")
    wall, host = _tiny_us(lambda v: v + 1, z, lambda out: torch.cuda.synchronize())
    rows.append({"workload": TINY_ENQUEUE, "peer": "torch eager", "us": wall, "host": host})

    def call_sync() -> None:
        z.add(1)
        torch.cuda.synchronize()

    rows.append({"workload": TINY_SYNC, "peer": "torch eager", "us": _median_us(call_sync)})
    return rows


def jax_rows() -> list[dict]:
    import jax
    import jax.numpy as jnp

    def loss_j(ws, x, y):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return ((h - y) ** 2).mean()

    @jax.jit
    def step_j(ws, x, y):
        loss, gs = jax.value_and_grad(loss_j)(ws, x, y)
        return [w - 0.01 * g for w, g in zip(ws, gs)], loss

    ws0, x0, y0 = _mlp_data()
    x, y = jnp.asarray(x0), jnp.asarray(y0)
    run_steps = _carried(lambda state: step_j(state[0], x, y), ([jnp.asarray(w) for w in ws0], None))
    wall, host = _loop_us(run_steps, jax.block_until_ready)
    rows = [{"workload": MLP, "peer": "jax.jit", "us": wall, "host": host}]
    add = jax.jit(lambda v: v + 1)
    z = add(jnp.ones(16))
    wall, host = _tiny_us(add, z, jax.block_until_ready)
    rows.append({"workload": TINY_ENQUEUE, "peer": "jax.jit", "us": wall, "host": host})
    rows.append({"workload": TINY_SYNC, "peer": "jax.jit", "us": _median_us(lambda: add(z).block_until_ready())})
    return rows


def run(peers: set[str], only: str | None) -> list[dict]:
    rows: list[dict] = []
    measures: list[tuple[str, Callable[[], Any]]] = [
        ("glue mlp", lambda: [glue_mlp(False)]), ("glue mlp donated", lambda: [glue_mlp(True)]),
        ("glue tiny", glue_tiny)]
    if peers & {"torch", "torch.compile"}:
        measures.append(("torch", torch_rows))
    if "jax" in peers:
        measures.append(("jax", jax_rows))
    for donate in (False, True):
        try:
            for name, us in mlp_diagnostics(donate):
                print(f"mlp {'donated' if donate else ''}: {name}: {us:.2f} us", flush=True)
        except Exception:
            print(f"mlp diagnostics: failed:\n{traceback.format_exc()}"[-3000:], flush=True)
    try:
        for name, us in mlp_kernel_times():
            print(f"mlp kernel: {name}: {us:.2f} us", flush=True)
    except Exception:
        print(f"mlp kernels: failed:\n{traceback.format_exc()}"[-3000:], flush=True)
    try:
        for name, us in host_path():
            print(f"host path: {name}: {us:.2f} us", flush=True)
    except Exception:
        print(f"host path: failed:\n{traceback.format_exc()}"[-3000:], flush=True)
    for who, measure in measures:
        try:
            got = measure()
        except Exception:  # a missing or broken peer must not stop the others
            print(f"loops / {who}: failed:\n{traceback.format_exc()}"[-3000:], flush=True)
            continue
        rows += [r for r in got if not only or only in r["workload"]]
        for r in got:
            print(r, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    jax_us = {r["workload"]: r["us"] for r in rows if r["peer"] == "jax.jit"}
    lines = ["| workload | peer | us | vs jax.jit | host us | kernels | streams | calls ran as | check |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        ratio = f"{r['us'] / jax_us[r['workload']]:.2f}x" if r["workload"] in jax_us else ""
        host = f"{r['host']:.1f}" if "host" in r else ""
        err = f"{r['max_abs_err']:.1e}" if "max_abs_err" in r else ""
        lines.append(f"| {r['workload']} | {r['peer']} | {r['us']:.1f} | {ratio} | {host} | "
                     f"{r.get('kernels', '')} | {r.get('streams', '')} | {r.get('runs', '')} | {err} |")
    return "\n".join(lines)
