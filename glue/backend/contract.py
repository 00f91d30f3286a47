"""What every backend is: an ordered table of stages from a Graph to an Executable.

A backend (`Backend`) fills a `Lowering`'s stage table, as Triton's backends fill theirs with
`add_stages`: each stage builds one artifact from the artifacts of earlier stages (the scheduler's
Plan, an LLVM module, PTX, object code) and, unless it is internal, has a text form. Artifacts
are built on first use and kept, so printing a late stage builds exactly what it needs; the time
each stage took is recorded for `compile_stats`, and so is, per distinct kernel, where its code
came from (built, the disk cache, or this process's memory) and the seconds of each step of
building it (`KernelStats`). `Lowering.compile()` hands the finished table to the backend's
`load`, which makes the `Executable`.

An Executable runs the program on *raw buffers*: host NumPy arrays, the backend's own device
buffers, or Python/NumPy scalars and arrays it must upload. It returns raw buffers; the frontend
alone turns them into `glue.Array`s. Arguments at donated positions are glue-owned buffers the
executable may overwrite (the frontend copies anything else there first).

Options are a frozen dataclass per backend (`Backend.Options`), part of every cache key. A
backend may lower anywhere (the cuda backend prints LLVM IR and PTX on a machine without a GPU);
only `compile()` needs `Backend.can_run()`.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar, Protocol, Sequence

import numpy as np

from glue import profiler
from glue.codegen.analysis import CostAnalysis, MemoryAnalysis
from glue.errors import GlueError
from glue.backend.plan_cache import cached_plan, plan_key
from glue.ir import Graph
from glue.scheduler.plan import STAGES as PLAN_STAGES
from glue.scheduler.passes import optimize
from glue.scheduler.attention import AttentionPolicy
from glue.scheduler.plan import Plan, place, prepare


class Executable(Protocol):
    """A compiled program: call it with the arguments (constvars' values, then invars').

    It may also have a `lean_call(buffers, hosts) -> list | None`, which jit tries first: it
    runs a call on these argument buffers (of the program's argument types, which the caller
    has checked; host scalars at the positions `hosts`; at donated positions buffers the
    caller gives up) and returns the result buffers, when the call is a cheap one such as a
    loop's repeated call (CudaExecutable: one graph replay), and returns None having done
    nothing otherwise. A program of one argument whose results are its outputs may also have a
    `lean_call_one(buffer)`: `lean_call([buffer], ())` without building or comparing lists."""

    kernels: list[Any]

    def __call__(self, *args: Any) -> list[Any]: ...

    def memory_analysis(self) -> MemoryAnalysis: ...

    def cost_analysis(self) -> CostAnalysis: ...


@dataclass(frozen=True)
class Options:
    """Base of the backends' option dataclasses; `key` is their part of a cache key."""

    @property
    def key(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))


@dataclass(frozen=True)
class Stage:
    """One step of a lowering. `build(lowering)` makes the artifact from earlier ones; `text`
    prints it (None: an internal artifact, not a printable stage)."""

    name: str
    build: Callable[["Lowering"], Any]
    text: Callable[[Any], str] | None = str


@dataclass
class StageTime:
    seconds: float
    cached: bool = False  # served from a cache (in memory or on disk) rather than built


@dataclass
class KernelStats:
    """How one distinct kernel's code was made: `source` is "built", "disk" (the disk cache) or
    "memory" (already compiled in this process); `seconds` per step ("llvm build", "llvm
    optimise", "object emission", ...), steps run by compile workers counted in their time;
    `uses` is how many kernels of the program run this code."""

    symbol: str
    kind: str
    uses: int = 1
    source: str = "built"
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, step: str, seconds: float) -> None:
        self.seconds[step] = self.seconds.get(step, 0.0) + seconds


class Lowering:
    """One program lowered for one backend with fixed options: its stage table and artifacts."""

    def __init__(self, backend: "Backend", graph: Graph, donated: Sequence[int], name: str,
                 options: Options):
        self.backend = backend
        self.graph = graph
        self.donated = tuple(donated)
        self.name = name
        self.options = options
        self._table: dict[str, Stage] = {}
        self._artifacts: dict[str, Any] = {}
        self.timings: dict[str, StageTime] = {}
        self.kernel_stats: dict[str, KernelStats] = {}
        self._cached: set[str] = set()
        self._nested = 0.0
        backend.add_stages(self)

    def add_stage(self, name: str, build: Callable[["Lowering"], Any],
                  text: Callable[[Any], str] | None = str) -> None:
        if name in self._table:
            raise ValueError(f"stage {name!r} added twice")
        self._table[name] = Stage(name, build, text)

    def __getitem__(self, name: str) -> Any:
        """The artifact of stage `name`, built (with every stage it needs) on first use."""
        if name not in self._artifacts:
            stage = self._table.get(name)
            if stage is None:
                raise KeyError(name)
            self._artifacts[name] = self._timed(name, lambda: stage.build(self))
        return self._artifacts[name]

    def _timed(self, name: str, build: Callable[[], Any]) -> Any:
        """Run `build`, recording its own time: the stages it builds on the way count for
        themselves, not for it."""
        outer, self._nested = self._nested, 0.0
        start = time.perf_counter()
        try:
            with profiler.span("compile", f"{name} {self.name}", backend=self.backend.name):
                return build()
        finally:
            elapsed = time.perf_counter() - start
            self.timings[name] = StageTime(elapsed - self._nested, name in self._cached)
            self._nested = outer + elapsed

    def built(self, name: str) -> bool:
        """Whether stage `name`'s artifact exists yet."""
        return name in self._artifacts

    def provide(self, name: str, artifact: Any) -> None:
        """Stage `name`'s artifact, built elsewhere (a cpu program builds the code of its call
        kernels' bodies in its own batch): it took none of this lowering's time."""
        if name not in self._table:
            raise KeyError(name)
        self._artifacts[name] = artifact
        self.timings[name] = StageTime(0.0, name in self._cached)

    def note_cached(self, name: str) -> None:
        """Mark stage `name` as served from a cache (its builder calls this)."""
        self._cached.add(name)

    def kernel(self, symbol: str, kind: str) -> KernelStats:
        """The stats of distinct kernel `symbol`, made on first use."""
        stats = self.kernel_stats.get(symbol)
        if stats is None:
            stats = self.kernel_stats[symbol] = KernelStats(symbol, kind)
        return stats

    @property
    def stages(self) -> tuple[str, ...]:
        """The printable stages, in pipeline order."""
        return tuple(name for name, stage in self._table.items() if stage.text is not None)

    def as_text(self, stage: str) -> str:
        entry = self._table.get(stage)
        if entry is None or entry.text is None:
            raise GlueError(f"stage {stage!r} is not produced by the {self.backend.name} backend; "
                            f"stages: {self.stages}")
        return entry.text(self[stage])

    def compile(self) -> Executable:
        if not self.backend.can_run():
            raise GlueError(f"backend {self.backend.name!r} cannot run programs here "
                            f"({self.backend.why_not()}); lowering and printing its stages "
                            f"({', '.join(self.stages)}) work without it")
        return self._timed("load", lambda: self.backend.load(self))


class Backend(ABC):
    """A target glue compiles for. Subclasses set `name` and `Options` and fill the stage table."""

    name: ClassVar[str]
    Options: ClassVar[type[Options]] = Options
    # Whether float32 contractions of precision "default"/"high" may run on TF32 tensor cores
    # (which keep 10 mantissa bits): tests then compare them at float16's tolerance.
    rounds_to_tf32: ClassVar[bool] = False

    @classmethod
    def can_run(cls) -> bool:
        """Whether programs compiled for this backend can run here (never raises)."""
        return True

    @classmethod
    def why_not(cls) -> str:
        """Why `can_run()` is False, in a few words."""
        return "unavailable"

    def options(self, **overrides: Any) -> Options:
        """This backend's options: its defaults (from glue.config) with `overrides`."""
        return replace(self.default_options(), **overrides) if overrides else self.default_options()

    def default_options(self) -> Options:
        return self.Options()

    def lower(self, graph: Graph, *, donated: Sequence[int] = (), name: str = "fn",
              **options: Any) -> Lowering:
        try:
            chosen = self.options(**options)
        except TypeError as exc:
            raise GlueError(f"backend {self.name!r}: bad options {sorted(options)}: {exc}") from None
        return Lowering(self, graph, donated, name, chosen)

    @abstractmethod
    def add_stages(self, lowering: Lowering) -> None:
        """Fill `lowering`'s stage table (`lowering.add_stage`)."""

    @abstractmethod
    def load(self, lowering: Lowering) -> Executable:
        """The Executable of a lowering (may build its remaining stages)."""

    def before_scheduling(self, lowering: Lowering) -> None:
        """Called as `lowering`'s Plan is about to be built rather than read from the disk
        cache, a sign of a cold compile: a backend may start what that will need."""

    def holds(self, buffer: Any) -> bool:
        """Whether `buffer` is already in this backend's memory (a glue-made buffer of it)."""
        return isinstance(buffer, np.ndarray)

    def device_put(self, value: Any) -> Any:
        """A new buffer of this backend's memory holding `value`, which nothing else refers to
        (host memory: a copy, as `jax.device_put` makes)."""
        return np.array(value)

    def private_copy(self, value: Any) -> Any:
        """What a donated position gets when the caller's buffer must not be written."""
        return self.device_put(value)


def add_plan_stages(lowering: Lowering, max_streams: int = 1, attention: AttentionPolicy = AttentionPolicy()) -> None:
    """The scheduler's stages, shared by the compiling backends, each timed on its own: the
    internal "passes" (the optimized Graph), "attention" (attention recognised and tiled, then
    the graph rematerialised: `glue.scheduler.plan.prepare`, as the backend's `attention`
    policy says), "fuse" (kernels) and "plan"
    (streams and memory too), and the Plan's printable views. A large program's Plan is read
    from the disk cache when a process planned it before (glue/backend/plan_cache.py): then
    the stages before "plan" never run."""
    lowering.add_stage("passes", lambda lw: optimize(lw.graph), text=None)
    lowering.add_stage("attention", lambda lw: prepare(lw["passes"], attention), text=None)
    lowering.add_stage("fuse", lambda lw: lw["attention"].fused(), text=None)
    lowering.add_stage("plan", lambda lw: _plan(lw, max_streams, attention), text=None)
    for stage in PLAN_STAGES:
        lowering.add_stage(stage, lambda lw: lw["plan"], text=_plan_text(stage))


def _plan(lowering: Lowering, max_streams: int, attention: AttentionPolicy) -> Plan:
    """`glue.scheduler.plan.schedule`, from the stages before it (or from the disk cache)."""
    scheduler = f"streams={max_streams} flash={attention.native is not None} unfused={attention.unfused_bytes}"
    key = plan_key(lowering.graph, lowering.backend.name, lowering.options.key, lowering.donated, scheduler)
    def schedule() -> Plan:
        lowering.backend.before_scheduling(lowering)
        return place(lowering["attention"].graph, lowering["fuse"], lowering.donated, max_streams)

    plan, cached = cached_plan(key, schedule)
    if cached:
        lowering.note_cached("plan")
    return plan


def _plan_text(stage: str) -> Callable[[Plan], str]:
    return lambda plan: plan.as_text(stage)


__all__ = ["Backend", "CostAnalysis", "Executable", "KernelStats", "Lowering", "MemoryAnalysis", "Options",
           "Stage", "StageTime", "add_plan_stages"]
