"""The race between a contraction's variants (backend_cuda/gemm_choice.py), on the stub driver
(tests/backend_cuda/stub_driver.py) with scripted timings: what it picks when the GPU's first
timing is slow, as a GPU coming out of idle makes it. No GPU needed."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import glue
from glue.backend_cuda import gemm_choice
from glue.backend_cuda.executor import CudaExecutable
from tests.backend_cuda import stub_driver

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_a_slow_first_timing_does_not_lose_the_fastest_variant_its_race(monkeypatch, tmp_path):
    """Each variant runs at a steady speed (the first one timed the fastest), but the very
    first timing of the race takes twice as long. Probed once, the fastest variant would be
    pruned on that timing alone; probed twice, in both orders, it wins."""
    seen: list[int] = []  # the variants' steps, by identity, in the order first timed
    timed: list = []
    real_run_steps = CudaExecutable.run_steps

    def run_steps(self, steps, bases):
        timed.append(id(steps))
        real_run_steps(self, steps, bases)

    monkeypatch.setattr(CudaExecutable, "run_steps", run_steps)

    def scripted_replay_us(stream, enqueue, repeats, warmup=2, runs=7) -> float:
        enqueue()
        variant = timed[-1]
        if variant not in seen:
            seen.append(variant)
        steady = {0: 100.0, 1: 120.0, 2: 110.0}.get(seen.index(variant), 130.0)
        return 2 * steady if len(seen) == 1 and timed.count(variant) == 1 else steady

    monkeypatch.setattr(gemm_choice, "replay_us", scripted_replay_us)
    a, b = np.ones((4096, 4096), BF16), np.ones((4096, 4096), BF16)
    with stub_driver.installed(), glue.config.override(cache_dir=str(tmp_path), autotune=True, gemm="codegen"):
        exe = glue.jit(lambda x, y: x @ y, backend="cuda").lower(a, b).compile().executable
        (group, times), = exe.gemm_timings.items()
    assert len(times) >= 3, times  # glue's kernel in three tilings
    assert times[exe.gemm_choices[group]] == 100.0, (exe.gemm_choices, times)
