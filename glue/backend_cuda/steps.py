"""The steps a cuda program queues, planned without a GPU: every launch with the memory its
parameters point at, and every call kernel (control flow, a print) expanded into the launches
of its compiled bodies.

A step's parameters are `(base, byte offset)` pairs: an index into the call's list of base
addresses (arguments, outputs, the arena, each stream's scratch region, as the executor lays
them out) or into the *regions* appended after them, memory the executable keeps for its call
kernels: each body's arena and library scratch (owned by the body's own executable), the
scratch a call needs (a scan's second carry, a while's carries and predicate), constant
buffers for literal operands and for bodies that return a literal. All of it is allocated
once, so every call of the program sees the same addresses.

A call kernel runs by the scheduler's plan (glue.scheduler.calls). A scan with a static trip
count, a custom-derivative call or checkpoint (run once) and an optimization barrier (copies)
expand right here: a scan's steps are its body's steps repeated `length` times, each time
pointing at that iteration's slice of xs and ys, on the stream of the call kernel, so the whole
loop replays inside the program's one CUDA graph. A while_loop, a cond and a print need values
on the host between kernels; each becomes a *host step*, which the executor runs when it gets
there (reading the predicate, index or operands back after a synchronisation) by queueing the
steps `invocation_steps` gives for the chosen body. A program with a host step cannot be
captured as one CUDA graph: it launches directly.

Bodies are compiled with one stream; their steps run on the call kernel's stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from glue.backend_cuda.codegen.common import Launch, Place
from glue.ir import TensorType
from glue.scheduler.calls import (BodyLayout, CallPlan, Invocation, Ref, body_layout, body_operands,
                                  scan_invocations)

if TYPE_CHECKING:
    from glue.backend_cuda.codegen import CudaProgram

Source = tuple[int, int]  # (index into the bases, byte offset)


@dataclass(frozen=True)
class Region:
    """Memory a program keeps for its call kernels. `owner` is the BodyInfo whose executable
    holds it (`what` "arena" or "scratch" `slot`), or None: the executable allocates `nbytes`,
    filled with `fill` (a (type, value) pair) when given."""

    nbytes: int
    what: str = "scratch"
    slot: int = 0
    owner: "BodyInfo | None" = field(default=None, repr=False)
    fill: tuple[TensorType, Any] | None = None


@dataclass(eq=False)
class BodyInfo:
    """A compiled body at one call site: its program, the launches that run (one variant per
    contraction), where its arena and scratch live, and its own call sites."""

    program: "CudaProgram" = field(repr=False)
    launches: list[Launch] = field(repr=False)
    layout: BodyLayout
    arena: int | None = None
    scratch: list[int] = field(default_factory=list)
    fills: dict[int, int] = field(default_factory=dict)   # result -> region holding that literal
    calls: dict[int, "SiteInfo"] = field(default_factory=dict)  # launch index -> its call site
    runtime: Any = field(default=None, repr=False)  # what loaded it (the executor: its executable)


@dataclass(eq=False)
class SiteInfo:
    """A call kernel's plan and the regions it uses."""

    plan: CallPlan
    scratch: list[int]
    literals: list[int]
    bodies: list[BodyInfo]


@dataclass(frozen=True)
class HostCall:
    """A call kernel the executor runs itself (while, cond, print): its site and where its
    inputs and outputs are."""

    site: SiteInfo
    inputs: tuple[Source, ...]
    outputs: tuple[Source, ...]


@dataclass(frozen=True)
class StepPlan:
    """One step: a launch (of the program, or of a body when `owner` is set) with its
    parameters' sources, a copy (destination, source, bytes) done first, or a host call.
    `group` is the program's plan kernel the step belongs to, `stream` its stream."""

    group: int
    stream: int
    launch: Launch | None = None
    sources: tuple[Source, ...] = ()
    copy: tuple[Source, Source, int] | None = None
    owner: BodyInfo | None = None
    host: HostCall | None = None

    @property
    def name(self) -> str:
        if self.launch is not None:
            return self.launch.symbol
        return "host call" if self.host is not None else "copy"


def chosen_launches(program: "CudaProgram", choices: dict[int, str] | None = None) -> list[Launch]:
    """The launches that run: for each plan kernel the variant `choices` names, else glue's own
    kernel where there is one."""
    variants: dict[int, set[str]] = {}
    for launch in program.launches:
        variants.setdefault(launch.group, set()).add(launch.variant)
    pick = {g: (choices or {}).get(g) or ("codegen" if "codegen" in v else "library") for g, v in variants.items()}
    return [launch for launch in program.launches if pick[launch.group] == launch.variant]


Loader = Callable[[Any], tuple[list[Launch], Any]]


def plain_load(lowering: Any) -> tuple[list[Launch], Any]:
    """A body's launches without loading it anywhere: glue's own kernels where there are any."""
    return chosen_launches(lowering["llvm"]), None


class Planner:
    """Plans a program's steps and the regions they need (`regions`, in base order after the
    program's own `n_bases`). `load(lowering)` loads a body for one call site, giving the
    launches that run and what holds them (the executor: the body's own executable)."""

    def __init__(self, n_bases: int, load: Loader = plain_load):
        self.n_bases = n_bases
        self.load = load
        self.regions: list[Region] = []

    def region(self, region: Region) -> int:
        self.regions.append(region)
        return self.n_bases + len(self.regions) - 1

    def site(self, plan: CallPlan, bodies: Sequence[Any]) -> SiteInfo:
        """The regions of a call site; `bodies` are its bodies' lowerings (with a "llvm" stage)."""
        scratch = [self.region(Region(t.nbytes)) for t in plan.scratch]
        literals = [self.region(Region(a.type.nbytes, fill=(a.type, a.value))) for a in plan.literals]
        return SiteInfo(plan, scratch, literals, [self.body(lowering) for lowering in bodies])

    def body(self, lowering: Any) -> BodyInfo:
        program: CudaProgram = lowering["llvm"]
        launches, runtime = self.load(lowering)
        info = BodyInfo(program, launches, body_layout(program.results), runtime=runtime)
        if program.arena_bytes:
            info.arena = self.region(Region(program.arena_bytes, "arena", owner=info))
        info.scratch = [self.region(Region(n, "scratch", s, owner=info)) for s, n in enumerate(program.scratch)]
        results = program.results
        info.fills = {r: self.region(Region(results[r].type.nbytes, fill=(results[r].type, value)))
                      for r, value in info.layout.fills}
        for i, launch in enumerate(info.launches):
            if launch.call is not None:
                info.calls[i] = self.site(launch.call, program.bodies[launch.group])
        return info

    # --- steps --------------------------------------------------------------------------

    def program_steps(self, program: "CudaProgram", launches: Sequence[Launch],
                      source: Callable[[Place], Source]) -> list[StepPlan]:
        """The steps of `launches` of the program, whose places `source` resolves."""
        streams = program.plan.streams.streams
        steps: list[StepPlan] = []
        for launch in launches:
            k = launch.group
            if launch.call is not None:
                site = self.site(launch.call, program.bodies[k])
                where = [source(p) for p in launch.params]
                steps += self.call_steps(site, where[:len(launch.kernel.inputs)], where[len(launch.kernel.inputs):],
                                         k, streams[k])
            else:
                steps.append(_launch_step(launch, source, k, streams[k], None))
        return steps

    def call_steps(self, site: SiteInfo, inputs: Sequence[Source], outputs: Sequence[Source], group: int,
                   stream: int) -> list[StepPlan]:
        """A call kernel's steps, or one host step where it needs the host."""
        plan = site.plan

        def resolve(ref: Ref) -> Source:
            return _resolve(site, inputs, outputs, ref)

        if plan.kind == "scan":
            steps = []
            for inv in scan_invocations(plan):
                steps += self._invocation(site, inv, resolve, group, stream)
            return steps
        if plan.kind == "body":
            return self.invocation_steps(site, 0, [resolve(r) for r in body_operands(plan)],
                                         [resolve(r) for r in plan.results], group, stream)
        if plan.kind == "copy":
            return [_copy(resolve(s), resolve(t), v.type.nbytes, group, stream)
                    for s, t, v in zip(plan.operands, plan.results, plan.eqn.outvars)]
        return [StepPlan(group, stream, host=HostCall(site, tuple(inputs), tuple(outputs)))]

    def _invocation(self, site: SiteInfo, inv: Invocation, resolve: Callable[[Ref], Source], group: int,
                    stream: int) -> list[StepPlan]:
        if inv.body is None:
            return [_copy(resolve(s), resolve(t), ty.nbytes, group, stream)
                    for s, t, ty in zip(inv.args, inv.results, inv.types)]
        return self.invocation_steps(site, inv.body, [resolve(r) for r in inv.args], [resolve(r) for r in inv.results],
                                     group, stream)

    def invocation_steps(self, site: SiteInfo, body: int, args: Sequence[Source], results: Sequence[Source],
                         group: int, stream: int) -> list[StepPlan]:
        """The steps of one run of body `body` of `site` on `args`, writing `results`."""
        info = site.bodies[body]
        layout = info.layout

        def source(place: Place) -> Source:
            if place.kind == "argument":
                base, offset = args[place.slot]
            elif place.kind == "output":
                base, offset = results[layout.slot_result[place.slot]]
            elif place.kind == "arena":
                base, offset = info.arena, 0
            else:
                base, offset = info.scratch[place.slot], 0
            return base, offset + place.offset

        steps: list[StepPlan] = []
        for i, launch in enumerate(info.launches):
            if launch.call is not None:
                where = [source(p) for p in launch.params]
                n_in = len(launch.kernel.inputs)
                steps += self.call_steps(info.calls[i], where[:n_in], where[n_in:], group, stream)
            else:
                steps.append(_launch_step(launch, source, group, stream, info))
        types = [r.type for r in info.program.results]
        for (kind, i), r in layout.copies:
            steps.append(_copy(args[i] if kind == "argument" else results[i], results[r], types[r].nbytes, group, stream))
        for r, region in info.fills.items():
            steps.append(_copy((region, 0), results[r], types[r].nbytes, group, stream))
        return steps


def _resolve(site: SiteInfo, inputs: Sequence[Source], outputs: Sequence[Source], ref: Ref) -> Source:
    if ref.kind in ("input", "output"):
        base, offset = (inputs if ref.kind == "input" else outputs)[ref.index]
        return base, offset + ref.offset
    regions = site.scratch if ref.kind == "scratch" else site.literals
    return regions[ref.index], ref.offset


def resolve_ref(host: HostCall, ref: Ref) -> Source:
    """Where a Ref of a host call's plan is."""
    return _resolve(host.site, host.inputs, host.outputs, ref)


def _launch_step(launch: Launch, source: Callable[[Place], Source], group: int, stream: int,
                 owner: BodyInfo | None) -> StepPlan:
    copy = (source(launch.copy[0]), source(launch.copy[1]), launch.copy[2]) if launch.copy else None
    return StepPlan(group, stream, launch, tuple(source(p) for p in launch.params), copy, owner)


def _copy(source: Source, target: Source, nbytes: int, group: int, stream: int) -> StepPlan:
    return StepPlan(group, stream, copy=(target, source, nbytes))


def plan_program(program: "CudaProgram", launches: Sequence[Launch], n_bases: int,
                 source: Callable[[Place], Source], load: Loader = plain_load) -> tuple[list[StepPlan], Planner]:
    """The steps of `launches` (the program's chosen launches) and the planner holding the
    regions they need."""
    planner = Planner(n_bases, load)
    return planner.program_steps(program, launches, source), planner
