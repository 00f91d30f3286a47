"""Who serves each contraction of a program, and how: glue's own kernel in one of its tilings or
cuBLASLt in one of its algorithms, raced per shape.

A plan kernel with several variants (glue's "codegen"; for a large warpgroup product also its
other tilings that the cost model finds close, "codegen 128x192" and the like, see
`codegen.wgmma.raced_tilings`; the library's "library" and, for a TF32 weight gradient,
"library kmajor": see codegen/library.py) is timed each way on the GPU when the program loads, on random data in buffers of the program's types, and the fastest variant
runs; the choice is kept in the disk cache (namespace "gemm"), keyed by the kernel's structure
(`glue.backend.kernel_key`), the arch, the library's version and the variants' launch
strategies, so a later process does not race again, and the copies of a layer race once.
Each variant is timed as the step runs it, in a CUDA graph of runs back to back, replayed:
timed by events around direct launches, a small product's time would be the host's time to
queue it, which graph replays do not pay, and the library's call costs the host more than a
kernel launch. A library variant of a product of at least ALGORITHM_FLOPS is timed with each of
the first ALGORITHMS algorithms cuBLASLt's heuristics rank for it (as XLA's autotuner does: the
first is not always the fastest, e.g. for a transposed operand), and runs with the fastest.
The race is bounded in two rounds: every candidate (variant, algorithm) is probed with one
replay of one run, twice (in one order, then the other; the better probe counts); those within
PRUNE of the fastest probe are timed again, in graphs of as many runs (up to REPEATS) as make
about GRAPH_US of work, over RUNS replays. A large product's clear losers so cost a few runs
instead of REPEATS x (WARMUP + RUNS). `glue.config.gemm` forces
glue's kernel ("codegen") or the library's variants ("library", raced between themselves); with
`glue.config.autotune` off, a kernel takes the variant "library" where it has one, with its
first algorithm, and glue's kernel the cost model's tiling (no other is built). The choices and their timings are on the executable (`gemm_choices`,
`gemm_algorithms`, `gemm_timings`) and in GLUE_DEBUG's log.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from glue import profiler
from glue.backend.cache import DiskCache, digest
from glue.backend.kernel_key import aliases
from glue.errors import BackendError
from glue.backend_cuda.codegen.library import LIBRARY_VARIANTS
from glue.backend_cuda.runtime.device_array import DeviceBuffer
from glue.backend_cuda.runtime.graph import replay_us
from glue.backend_cuda.runtime.stream import Stream
from glue.backend_cuda.runtime.transfer import upload_repeating
from glue.ir import TensorType
from glue.scheduler.memory import ALIGNMENT
from glue.settings import config

if TYPE_CHECKING:
    from glue.backend_cuda.codegen import CudaProgram
    from glue.backend_cuda.executor import CudaExecutable

log = logging.getLogger("glue")
DISK = DiskCache("gemm")
WARMUP, RUNS, REPEATS = 1, 5, 8
PRUNE = 1.3     # candidates whose probe is slower than this times the fastest probe's are not timed again
GRAPH_US = 200  # the work a timing graph holds (it repeats a product up to REPEATS times to get there)
ALGORITHMS = 8             # cuBLASLt's candidates raced for one product (all its heuristics return)
# Below this a product's algorithms are not raced (the first serves). A small-output product
# (the small step's 256x1024x1024 weight gradients: 8 of cuBLASLt's 128x256 tiles for 132
# multiprocessors) is where a later candidate, splitting K, may win most.
ALGORITHM_FLOPS = 1 << 27
NOISE = 1 << 18  # distinct random values the race's stand-ins repeat


def _key(program: "CudaProgram", group: int) -> bytes:
    """The race's cache key: the plan kernel's structure (up to names, as its code is keyed, so
    a model's identical layers race once), the places its launches share, and their strategies."""
    from glue.backend_cuda import cublaslt

    launches = program.by_group[group]
    strategies = "|".join(f"{l.variant}:{l.strategy}" for l in launches)
    shared = aliases([place for l in launches for place in l.params])
    return digest("gemm choice, graph-timed, algorithms, structural", program.arch, cublaslt.version(),
                  program.keys(program.plan.kernels[group], shared).hex(), strategies)


def choose_variants(exe: "CudaExecutable", program: "CudaProgram") -> dict[int, str]:
    """The variant each plan kernel runs ("codegen" where it has only that); the library's
    algorithm for those that take one of its variants is set on their products
    (`exe.gemm_algorithms`)."""
    variants: dict[int, list[str]] = {}
    for launch in program.launches:
        if launch.variant not in variants.setdefault(launch.group, []):
            variants[launch.group].append(launch.variant)
    exe.gemm_timings, exe.gemm_algorithms = {}, {}
    for group, names in variants.items():
        for variant in [v for v in names if v in LIBRARY_VARIANTS]:
            why_not = _library_fails(exe, program, group, variant)
            if why_not is None:
                continue
            names.remove(variant)
            if not names:
                raise BackendError(f"cuda: {program.plan.kernels[group].name} runs only on cuBLASLt here "
                                   f"(GLUE_GEMM=library, or a large float32 product) and cuBLASLt refuses "
                                   f"it: {why_not}; GLUE_GEMM=codegen runs glue's own kernel")
            log.info("glue.cuda: %s runs without the variant %s: cuBLASLt refuses it (%s)",
                     program.plan.kernels[group].name, variant, why_not)
    choices = {g: v[0] for g, v in variants.items() if len(v) == 1}
    noise = None  # drawn when a race needs it
    if config.autotune and exe.arena is not None and any(len(v) > 1 for v in variants.values()):
        exe.arena.fill_bytes(0x3C)  # small finite floats wherever an intermediate would be
    for group in sorted(g for g in variants if g not in choices):
        names = variants[group]
        if not config.autotune:
            choices[group] = "library" if "library" in names else names[0]
            continue
        key = _key(program, group)
        choice, _, algorithm = (DISK.load(key) or b"").decode().partition(":")
        if choice in names:
            choices[group] = choice
            if choice in LIBRARY_VARIANTS:
                _use_algorithm(exe, program, group, choice, int(algorithm) if algorithm.isdigit() else 0)
            continue
        try:
            with profiler.span("compile", f"race {program.plan.kernels[group].name}"), profiler.suspended():
                noise = noise or Noise()
                times, algorithms = race(exe, program, group, names, noise)
        except BackendError as exc:  # the library failed to run it: glue's kernel serves
            if "codegen" not in names:
                raise BackendError(f"{exc}; {program.plan.kernels[group].name} has no kernel of glue's to "
                                   f"fall back on here (GLUE_GEMM=codegen gives it one)") from exc
            log.info("glue.cuda: %s runs on glue's own kernel: cuBLASLt failed on it (%s)",
                     program.plan.kernels[group].name, exc)
            choices[group] = "codegen"
            continue
        exe.gemm_timings[group] = times
        choice = choices[group] = min(times, key=times.get)
        if choice in LIBRARY_VARIANTS:
            _use_algorithm(exe, program, group, choice, algorithms[choice])
        DISK.store(key, f"{choice}:{algorithms.get(choice, 0)}".encode())
        log.debug("glue.cuda: %s: %s (%s)", program.plan.kernels[group].name, choice,
                  ", ".join(f"{v} {t:.1f} us" for v, t in times.items()))
    return choices


def choices_text(exe: "CudaExecutable", program: "CudaProgram") -> str:
    """A line per contraction with several variants: who serves it, and the race's timings
    (or that the disk cache or a setting chose)."""
    lines = []
    for group in sorted({l.group for l in program.launches if l.variant != "codegen"}):
        choice, times = exe.gemm_choices.get(group, "codegen"), exe.gemm_timings.get(group)
        how = f"{choice} (cuBLASLt algorithm {exe.gemm_algorithms.get(group, 0)})" if choice in LIBRARY_VARIANTS \
            else choice
        why = ", ".join(f"{v} {t:.1f} us" for v, t in times.items()) if times else \
            "from the disk cache, or as settings force"
        lines.append(f"  {program.plan.kernels[group].name}: {how}; {why}")
    return "\n".join(["contractions as the program loaded (raced in CUDA graphs):"] + lines) if lines else ""


def _matmuls(exe: "CudaExecutable", program: "CudaProgram", group: int, variant: str) -> list[Any]:
    """The planned cuBLASLt products of plan kernel `group`'s library `variant`."""
    return [exe._matmul(l, program.plan.streams.streams[group]).matmul for l in program.by_group[group]
            if l.variant == variant and l.library is not None]


def _use_algorithm(exe: "CudaExecutable", program: "CudaProgram", group: int, variant: str, algorithm: int) -> None:
    """Run the products of the group's `variant` with cuBLASLt's `algorithm`-th candidate (the
    first where a product has fewer)."""
    for matmul in _matmuls(exe, program, group, variant):
        matmul.choice = algorithm if algorithm < len(matmul.algos) else 0
    exe.gemm_algorithms[group] = algorithm


def _library_fails(exe: "CudaExecutable", program: "CudaProgram", group: int, variant: str) -> str | None:
    """None when cuBLASLt plans every product of the group's library `variant`; else its error."""
    from glue.backend_cuda.cublaslt import LibraryError

    for launch in program.by_group[group]:
        if launch.variant == variant and launch.library is not None:
            try:
                exe._matmul(launch, program.plan.streams.streams[group])
            except LibraryError as exc:
                return str(exc)
    return None


class Noise:
    """Random values for the race's stand-ins, cheaply: NOISE normal floats and small integers
    drawn once, repeated over each stand-in on the device. (Drawn afresh for each, the stand-ins
    of a GPT-width step's 15 races, its 6 M-float embedding table among them, took 0.55 s of a
    3 s compile.)"""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.floats = rng.standard_normal(NOISE, dtype=np.float32)
        self.integers = rng.integers(0, 16, NOISE)

    def fill(self, ptr: int, t: TensorType, stream: Stream) -> None:
        """Fill a stand-in of type `t` at device address `ptr`."""
        if t.dtype.is_float:
            pattern = self.floats.astype(t.dtype.numpy)
        else:
            pattern = (self.integers % 2 if t.dtype.kind == "bool" else self.integers).astype(t.dtype.numpy)
        upload_repeating(ptr, pattern, t.nbytes, stream)


class _Place:
    """A device address standing in for an argument or output in a race (0: none touches it)."""

    def __init__(self, ptr: int = 0):
        self.ptr = ptr


class _ArenaSpace:
    """The arena bytes the raced plan kernel's own values do not use, handed out first fit: the
    race's stand-ins for arguments and outputs live there, so racing takes no memory beside
    the program's own (the arena is free while the program loads)."""

    def __init__(self, exe: "CudaExecutable", program: "CudaProgram", group: int):
        kernel, placements = program.plan.kernels[group], program.plan.memory.placements
        used = sorted((p.slot, p.slot + p.type.nbytes) for b in kernel.inputs + kernel.outputs
                      if (p := placements.get(b.value_id)) is not None and p.kind == "arena")
        self.base = exe.arena.ptr if exe.arena is not None else 0
        self.free: list[list[int]] = []
        cursor = 0
        for lo, hi in used + [(program.arena_bytes, program.arena_bytes)]:
            if lo > cursor:
                self.free.append([cursor, lo])
            cursor = max(cursor, hi)

    def take(self, nbytes: int) -> int | None:
        """The address of `nbytes` of free arena (256-byte aligned), or None."""
        for gap in self.free:
            start = -(-gap[0] // ALIGNMENT) * ALIGNMENT
            if start + nbytes <= gap[1]:
                gap[0] = start + nbytes
                return self.base + start
        return None


def race(exe: "CudaExecutable", program: "CudaProgram", group: int, variants: list[str],
         noise: Noise) -> tuple[dict[str, float], dict[str, int]]:
    """Microseconds per run of each of `variants` of plan kernel `group` (its fastest candidate's),
    and each library variant's fastest algorithm, every launch on the executable's first stream:
    each candidate's probe, then for those within PRUNE of the fastest the median of RUNS
    replays of a graph of up to REPEATS runs, over its runs. The arguments and outputs
    the variants touch are made for the race, random (a GPT step's arguments are hundreds of
    megabytes, and each product reads a few of them), in arena space the kernel's own
    intermediates leave free."""
    stream = exe.stream
    steps = {variant: exe._build_steps(program, [l for l in program.by_group[group] if l.variant == variant])
             for variant in variants}
    touched = {base for variant_steps in steps.values() for step in variant_steps
               for base, _ in step.sources + ((step.copy[0], step.copy[1]) if step.copy else ())}
    space = _ArenaSpace(exe, program, group)

    def stand_in(t: TensorType, random: bool) -> _Place | DeviceBuffer:
        ptr = space.take(t.nbytes)
        place = _Place(ptr) if ptr is not None else DeviceBuffer(t.shape, t.dtype, stream)  # no room: its own
        if random:
            noise.fill(place.ptr, t, stream)
        return place

    n_args = len(program.arg_types)
    args = [stand_in(t, True) if i in touched else _Place()
            for i, t in enumerate(program.arg_types)]
    outs = [stand_in(t, False) if n_args + j in touched else _Place() for j, t in enumerate(program.output_types)]
    bases = exe._bases(args, outs)
    exe.ctx.synchronize()

    for variant_steps in steps.values():
        for step in variant_steps:
            step.stream, step.waits, step.record, step.dependent = stream, (), None, None
    products = {v: _matmuls(exe, program, group, v) for v in variants if v in LIBRARY_VARIANTS}
    candidates: list[tuple[str, int]] = []  # (variant, algorithm: -1 for glue's kernel)
    for variant in variants:
        if variant not in products:
            candidates.append((variant, -1))
            continue
        matmuls = products[variant]
        flops = sum(2 * m.problem.batches * m.problem.m * m.problem.n * m.problem.k for m in matmuls)
        count = min([ALGORITHMS] + [len(m.algos) for m in matmuls]) if flops >= ALGORITHM_FLOPS else 1
        candidates += [(variant, algorithm) for algorithm in range(count)]

    def time_candidate(variant: str, algorithm: int, repeats: int, warmup: int, runs: int) -> float:
        matmuls = products.get(variant, [])
        for matmul in matmuls:
            matmul.choice = algorithm
        try:
            return replay_us(stream, lambda: exe.run_steps(steps[variant], bases), repeats, warmup, runs)
        finally:
            for matmul in matmuls:
                matmul.choice = 0

    # Each candidate is probed twice, in one order and then the other, and keeps its faster
    # probe, so the first one probed does not alone pay for a GPU coming out of idle. (A likely
    # cause of one lost race: 8192^3 TF32's first tiling, 3.7 ms in an earlier race, was pruned
    # for a tiling that then ran at 5.1 ms.)
    probes = {c: time_candidate(*c, repeats=1, warmup=1, runs=1) for c in candidates}
    for c in reversed(candidates):
        probes[c] = min(probes[c], time_candidate(*c, repeats=1, warmup=1, runs=1))
    fastest = min(probes.values())
    measured = dict(probes)
    for c, probe in probes.items():
        if probe <= PRUNE * fastest:
            repeats = max(1, min(REPEATS, round(GRAPH_US / max(probe, 1e-3))))
            measured[c] = time_candidate(*c, repeats=repeats, warmup=WARMUP, runs=RUNS)
    times, algorithms = {}, {}
    for (variant, algorithm), us in measured.items():
        if variant not in times or us < times[variant]:
            times[variant] = us
            if algorithm >= 0:
                algorithms[variant] = algorithm
    return times, algorithms
