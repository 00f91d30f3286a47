"""`python -m benchmarks host_call`: what one cached jitted call costs the host on the cuda backend.

Three loops, each call fed the previous call's results (issue #14's cached call):
- "tiny": `z = add(z)`, one float32[16] Array in, one out;
- "list step": the loops suite's 4-layer tanh MLP training step (benchmarks/cuda_loops.py),
  `ws, loss = step(ws, x, y)` (4 weights and two inputs in, 5 outputs);
- "donated step": the step suite's training step (benchmarks/step.py: params, AdamW moments,
  tokens, targets and the two bias corrections, NumPy scalars that change every step) at a tiny
  size, params and moments donated (`donate_argnums=(0, 1, 2)`).

Per loop: the bytecodes of glue's own code one call runs (`sys.settrace`'s opcode events in
files under glue/: deterministic, whatever the load), whether the lean call served it, and
the median over rounds of the host's us per call (rounds of `--calls` calls, nothing waited
for inside a round; the device is drained between rounds). `--stub` runs on
tests/backend_cuda/stub_driver.py (no GPU: its own Python adds about 0.6 us to each graph
launch). Its only glue internal is the counter (glue/testing/host.py): copied with it into
another checkout, it measures that one alike.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

import glue
from glue.testing.host import traced


def _tiny() -> tuple[Callable[[Any], Any], Any]:
    add = glue.jit(lambda v: v + 1, backend="cuda")
    return add, glue.device_put(np.ones(16, np.float32), "cuda")


def _list_step() -> tuple[Callable[[Any], Any], Any]:
    from benchmarks.cuda_loops import _mlp_data, _step

    jitted = glue.jit(_step, backend="cuda")
    ws, x, y = _mlp_data()
    ws = [glue.device_put(w, "cuda") for w in ws]
    x, y = glue.device_put(x, "cuda"), glue.device_put(y, "cuda")
    return (lambda state: jitted(state[0], x, y)), (ws, None)


def _donated_step() -> tuple[Callable[[Any], Any], Any]:
    from benchmarks.step import Config, corrections, glue_step_fn, init

    cfg = Config("tiny", d=32, heads=2, layers=4, T=16, B=2, vocab=64)
    jitted = glue.jit(glue_step_fn(cfg, False), backend="cuda", donate_argnums=(0, 1, 2))
    params, tokens, targets = init(cfg)
    put = lambda a: glue.device_put(a, "cuda")  # noqa: E731
    state = ([put(p) for p in params], [put(np.zeros_like(p)) for p in params],
             [put(np.zeros_like(p)) for p in params])
    tokens, targets = put(tokens), put(targets)
    # the bias corrections of steps 1..100, over and over (each call's are new scalars)
    scalars = [corrections(t) for t in range(1, 101)]
    t = [0]

    def call(state):
        t[0] += 1
        c1, c2 = scalars[t[0] % 100]
        params, m, v, loss = jitted(*state[:3], tokens, targets, c1, c2)
        return params, m, v, loss

    return call, state + (None,)


CASES = {"tiny": _tiny, "list step": _list_step, "donated step": _donated_step}


def measure(name: str, rounds: int, calls: int) -> dict:
    step, state = CASES[name]()
    for _ in range(8):  # compiled, its graphs captured, its output sets known
        state = step(state)
    codes = []
    for _ in range(5):
        state, names, n = traced(lambda: step(state))
        codes.append(n)
    lean = "Jitted._call" not in names
    from glue.backend_cuda.runtime import get_context

    ctx, times = get_context(), []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            state = step(state)
        times.append((time.perf_counter() - start) / calls * 1e6)
        ctx.synchronize()
    return {"case": name, "bytecodes": min(codes), "lean": lean, "us": statistics.median(times),
            "us_min": min(times)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks host_call", description=__doc__.split("\n")[0])
    parser.add_argument("--stub", action="store_true", help="run on the stub driver (no GPU)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.stub:
            from tests.backend_cuda import stub_driver

            stack.enter_context(stub_driver.installed())
        print(f"glue at {os.path.dirname(glue.__file__)}")
        print("| call | glue bytecodes | lean | median us per call | min |")
        print("| --- | ---: | --- | ---: | ---: |")
        for name in args.cases.split(","):
            r = measure(name, args.rounds, args.calls)
            print(f"| {r['case']} | {r['bytecodes']} | {'yes' if r['lean'] else 'no'} | {r['us']:.2f} | "
                  f"{r['us_min']:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
