"""Running a compiled CudaProgram on the device: streams, graphs, and a lean call path.

Compiling loads the module (through the context's module cache), looks up every kernel, binds
one parameter pack per launch, allocates the program's arena once and turns the plan's stream
stage into steps: each launch knows its stream, the events it waits for and the event it
records. A call then:

1. takes its arguments to the device: a `DeviceBuffer` of this context (what a device
   `glue.Array` holds) is used as is; anything else is uploaded on the context's copy stream;
2. allocates the fresh outputs from the caching allocator;
3. runs the launches, in one of two ways:
   - replay (the default): the launches were captured once as a CUDA graph for these buffer
     addresses and the call is a single graph launch. Graphs are cached by the addresses of
     the arguments, outputs and arena, so a loop whose outputs become the next call's inputs
     replays from the cache (the allocator hands the same blocks back). A program whose
     addresses keep changing, or whose capture fails, launches directly instead, with the
     reason logged on the `glue` logger;
   - direct: stream 0 forks to the other streams, each launch waits for the events of its
     producers on other streams (and for arguments still being uploaded, just before the
     first kernel that reads them), and the streams join back into stream 0;
   On sm_90 and later, a kernel that follows another kernel of the program on its stream is
   a dependent launch (programmatic stream serialization): the GPU places it while its
   predecessor still runs and it waits there (`griddepcontrol.wait`), so the launch latency
   between the two overlaps work. `GLUE_CUDA_PDL=0` turns this off;
4. marks the outputs written on stream 0 and returns their `DeviceBuffer`s without waiting
   (the frontend wraps them as `glue.Array`s): reading one (`np.asarray`) or
   `block_until_ready()` waits. No event is recorded
   per call: an output's event is recorded when something first waits for it (see
   `DeviceBuffer.ready_event`).

A call's outputs live in one block from the executable's slab pool, which keeps a few blocks
back as their outputs die, so a loop's calls see the same addresses and rarely reach the
allocator.

The lean call (`lean_call`, which jit's frontend tries first) serves a loop's call whose
arguments sit where an earlier graph call's did, already ordered on stream 0, while one of that
call's output sets is free again: it replays that call's graph into that set and does nothing
else (no argument conversion, no output carving, no result assembly). Any other call gets None,
with nothing done, and takes the path above; `_lean_call` says what it checks and why.

A graph launch waits for all of its arguments at once; the direct path lets kernels start
while unrelated inputs are still in transit. Calls of one executable run in order on stream 0,
so they share the arena. Programs queue their launches under the context's `enqueue_lock`, so
a graph being captured takes in no other thread's work. While a `glue.profile` is open, calls
launch directly with timing events around each kernel. `glue.config.cuda_graphs` (GLUE_CUDA_GRAPHS=0)
turns replay off. `poison` (`glue.config.cuda_poison`, GLUE_CUDA_POISON=0xff) fills outputs and
the arena with that byte before each call, so tests catch elements no kernel writes.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from operator import attrgetter
from sys import getrefcount
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from glue import profiler
from glue.backend.results import assemble, direct_picks
from glue.backend_cuda.codegen import CudaProgram, Launch, Place
from glue.backend_cuda.gemm_choice import choices_text, choose_variants
from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.context import get_context
from glue.backend_cuda.runtime.device_array import DeviceBuffer, OutputSets
from glue.backend_cuda.runtime.graph import Graph, capture
from glue.backend_cuda.runtime import tensor_map
from glue.backend_cuda.runtime.module import ArgPack, Kernel
from glue.backend_cuda.runtime.stream import Event, Stream, device_span
from glue.backend_cuda.runtime.transfer import DIRECT_MAX, download, upload
from glue.backend_cuda.steps import HostCall, Region, StepPlan, plan_program, resolve_ref
from glue.codegen.analysis import CostAnalysis, MemoryAnalysis, analyse_memory, estimate_cost
from glue.errors import BackendError
from glue.ir import TensorType
from glue.scheduler.calls import Ref, run_call
from glue.scheduler.plan import Result
from glue.scheduler.memory import ALIGNMENT, own_donors
from glue.settings import config

log = logging.getLogger("glue")
_PTR, _SHAPE, _DTYPE, _STREAM, _WAITED_ON = map(attrgetter, ("ptr", "shape", "dtype", "stream", "waited_on"))

GRAPH_CACHE = 8  # graphs kept per executable (distinct sets of buffer addresses)
# Host values (a step count, a learning rate, a small batch) up to this size are copied into a
# buffer the executable keeps for that argument, on stream 0 just before the launch: the call's
# addresses stay the same, so its graph replays. A fresh buffer per call would make every call a
# new capture, and past a few of those the program launches its kernels one by one.
STAGED_BYTES = DIRECT_MAX
SCALAR_SLOT = 16  # bytes between the slots of a program's host scalars (see `_ScalarSlots`)
LIST_CHECKS = 8  # arguments from which a call checks them a list at a time (see `_arguments`)


@dataclass
class _Step:
    name: str
    stream: Stream
    kernel: Kernel | None
    pack: ArgPack | None
    sources: tuple[tuple[int, int], ...]   # per parameter: (index into the call's bases, offset)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    copy: tuple[tuple[int, int], tuple[int, int], int] | None
    waits: tuple[Event, ...]               # events of producers on other streams
    record: Event | None                   # recorded after this step: another stream waits for it
    first_args: tuple[int, ...]            # arguments this stream reads first here
    dependent: Any = None                  # launch configuration letting it start before its
                                           # predecessor on the stream (a kernel of this program) ends
    library: Any = None                    # a cuBLASLt product (cublaslt.Matmul) instead of a kernel
    host: HostCall | None = None           # a call kernel the host runs (while, cond, print)
    shared: int = 0                        # dynamic shared memory bytes of its launch
    tensor_maps: tuple = ()                # TMA descriptors (hopper.TensorMap) after the pointers

    def arguments(self, bases: list[int]) -> list:
        """The kernel's parameters at these base addresses: its pointers, then its tensor maps
        (if any) encoded from the pointers they view."""
        pointers = [bases[b] + off for b, off in self.sources]
        if self.tensor_maps:
            pointers += [tensor_map.encode(m.dtype, m.dims, m.strides, m.box, pointers[m.param] + m.offset)
                         for m in self.tensor_maps]
        return pointers


class _ScalarSlots:
    """Where a program's host scalars (a step count, a learning rate, AdamW's bias corrections)
    are copied in: a slot per 0-d argument that is not a donated result, all carved from one
    block, and that block's bytes on the host (`host`, typed by `views`). A usual call copies a
    scalar into its slot (`_to_device` stages it there); a lean call writes its scalars into the
    host bytes and copies the whole block in one driver call. The slots it did not write get
    what the host bytes last held for them: no kernel of that call reads them (it reads those
    arguments elsewhere), and the calls queued before it have read them already."""

    def __init__(self, arg_types: Sequence[TensorType], unstaged: set[int], stream: Stream):
        at = [i for i, t in enumerate(arg_types) if not t.shape and i not in unstaged]
        layout = [((), arg_types[i].dtype, arg_types[i].nbytes, SCALAR_SLOT * k) for k, i in enumerate(at)]
        self.nbytes = SCALAR_SLOT * len(at)
        self.slots = dict(zip(at, DeviceBuffer.pieces(layout, self.nbytes, stream) if at else []))
        self.host = np.zeros(self.nbytes, np.uint8)
        self.views = {i: self.host[off:off + n].view(t.numpy).reshape(())
                      for i, (_, t, n, off) in zip(at, layout)}
        self.ptr = self.slots[at[0]].ptr if at else 0


@dataclass
class GraphStats:
    replays: int = 0
    captures: int = 0
    direct: int = 0
    captures_in_a_row: int = 0  # since the last replay


class CudaExecutable:
    """A program loaded on the GPU; call it with the arguments (constvars' values, then invars')."""

    def __init__(self, program: CudaProgram, ptx: str, name: str = "glue", as_body: bool = False):
        """`as_body`: loaded as the body of a call kernel, whose caller queues its launches (its
        module, arena and variant choices serve; it plans no steps of its own)."""
        self.program = program
        self.name = name
        self.ctx = get_context()
        plan = program.plan.streams
        self.streams = self.ctx.compute_streams(plan.n_streams)
        self.stream = self.streams[0]
        self._cost: CostAnalysis | None = None  # estimated when first asked for
        # Lean calls (`lean_call`): the arguments' addresses -> (output set, its block, graph
        # exec, graph key) of the graph calls that ran on them; forgotten where one could go stale.
        self._lean: dict[tuple[int, ...], list[tuple[list[DeviceBuffer], Any, Any, tuple[int, ...]]]] = {}
        self._poison_byte: int | None = config.cuda_poison
        self._use_graphs: bool = config.cuda_graphs
        self.use_dependent = config.cuda_pdl
        self.graph_stats = GraphStats()
        self._graphs: OrderedDict[tuple[int, ...], Graph] = OrderedDict()
        self._module = self.ctx.modules.load(ptx, name) if any(l.grid for l in program.launches) else None
        # glue has no byte dtype; arena and scratch sizes are multiples of 256 bytes.
        self.arena = DeviceBuffer((program.arena_bytes // 4,), np.int32, self.stream) if program.arena_bytes else None
        self._scratch = [DeviceBuffer((max(n, 4) // 4,), np.int32, self.streams[s]) for s, n in enumerate(program.scratch)]
        # Counters start at zero and every kernel that counts leaves them at zero again. The
        # fill is queued on stream 0, which another thread's call may be capturing into a graph.
        self._counters = None
        if program.counters:
            with self.ctx.enqueue_lock:
                self._counters = DeviceBuffer((program.counters // 4,), np.int32, self.stream).fill_bytes(0)
        self._workspaces: dict[int, DeviceBuffer] = {}
        self._matmuls: dict[str, Any] = {}
        self._events = {k: Event(self.ctx) for k in plan.recorded}
        self._regions: list[DeviceBuffer] = []
        self._host_steps: dict[tuple, list[_Step]] = {}
        with self.ctx.enqueue_lock:  # the race launches on stream 0, which a capture may be taking in
            self.gemm_choices = choose_variants(self, program)
        self.kernels = [l for l in program.launches if self.gemm_choices.get(l.group, "codegen") == l.variant]
        plans, self._planner = plan_program(program, self.kernels if not as_body else [], self._n_bases,
                                            self._source, _load_body)
        with self.ctx.enqueue_lock:  # constants upload on stream 0
            self._regions = [self._region(r) for r in self._planner.regions]
        if any(r.fill is not None for r in self._planner.regions):
            self.ctx.synchronize()  # constants uploaded once, before any stream reads them
        self._steps = self._materialize(plans)
        if any(step.host is not None for step in self._steps) and self.use_graphs:
            # A while_loop, a cond or a print reads values back between kernels: that cannot
            # sit inside one CUDA graph.
            self.use_graphs = False
            log.info("glue.cuda: %s launches its kernels directly, not as one CUDA graph: it has a "
                     "while_loop, cond or print whose next step depends on values read back on the host",
                     name)
        self._fork = Event(self.ctx) if len(self.streams) > 1 else None
        self._joins = [(self.streams[s], Event(self.ctx)) for s in sorted(plan.tails()) if s]
        self._staging: dict[int, DeviceBuffer] = {}  # argument -> where its host values are copied
        self._arg_dtypes = [t.dtype.numpy for t in program.arg_types]
        self._arg_specs = [(t.shape, t.dtype) for t in program.arg_types]
        self._all_buffers = [DeviceBuffer] * len(program.arg_types)
        self._arg_shapes = [t.shape for t in program.arg_types]
        self._arg_glue_dtypes = [t.dtype for t in program.arg_types]
        self._host_slots: list[int] = []  # where the latest call checked one by one passed host values
        # A call's outputs share one allocation: one allocator call, and a loop that feeds its
        # results back in sees the same few addresses again and again, so it replays the graphs
        # it captured for them.
        self._out_layout, out_bytes = [], 0
        for t in program.output_types:
            self._out_layout.append((t.shape, t.dtype, t.nbytes, out_bytes))
            out_bytes += -(-t.nbytes // ALIGNMENT) * ALIGNMENT
        self._outputs = OutputSets(self.ctx.allocator, self._out_layout, out_bytes, self.stream, self._lean.clear)
        # When every result is a fresh output (the usual case), results need no case analysis.
        self._results, self._homes = _homed(program.results, program.plan.memory.spare_donors, program.arg_types)
        # A donated argument's buffer becomes a result, which the next call must not overwrite.
        self._unstaged = {r.slot for r in self._results if r.kind == "donated"}
        self._scalars = _ScalarSlots(program.arg_types, self._unstaged, self.stream)
        self._staging.update(self._scalars.slots)
        self._picks = direct_picks(self._results, program.arg_types)
        # The commonest case of all: the results are the fresh outputs, in order.
        n_args = len(program.arg_types)
        self._just_outputs = self._picks == (list(range(n_args, n_args + len(self._out_layout))), [])
        self._copy = drv.load().cuMemcpyDtoDAsync
        # Lean calls replay graphs whose results are fresh outputs and donated arguments: a
        # program whose results need more (copies, literals), or that launches directly from the
        # start (graphs off, or a while_loop's host steps), has none.
        self.lean_call: Callable[..., list[DeviceBuffer] | None] | None = None
        # (`lean_call_one`: the same for a program of one argument whose results are its outputs,
        # as a loop's `z = f(z)`, handed that argument's buffer alone)
        self.lean_call_one: Callable[[Any], list[DeviceBuffer] | None] | None = None
        if self._picks is not None and self._use_graphs:
            self.lean_call, one = _lean_call(self)
            if len(program.arg_types) == 1 and self._just_outputs:
                self.lean_call_one = one

    @property
    def poison(self) -> int | None:
        """The byte outputs and the arena are filled with before each call (None: no fill)."""
        return self._poison_byte

    @poison.setter
    def poison(self, value: int | None) -> None:
        self._poison_byte = value
        self._lean.clear()

    @property
    def use_graphs(self) -> bool:
        """Whether calls replay CUDA graphs (else they launch kernel by kernel)."""
        return self._use_graphs

    @use_graphs.setter
    def use_graphs(self, value: bool) -> None:
        self._use_graphs = value
        self._lean.clear()

    @property
    def _n_bases(self) -> int:
        """Base addresses of a call before the regions: arguments, outputs, arena, scratch,
        counters."""
        return len(self.program.arg_types) + len(self.program.output_types) + 2 + len(self.program.scratch)

    def _region(self, region: Region) -> DeviceBuffer | None:
        """The memory of a call kernel's region: a body executable's arena or scratch, or a
        buffer of its own (filled once where the region holds a constant)."""
        if region.owner is not None:
            body = region.owner.runtime
            return body.arena if region.what == "arena" else body._scratch[region.slot]
        if region.fill is not None:
            type_, value = region.fill
            return DeviceBuffer.from_numpy(np.full(type_.shape, value, type_.dtype.numpy), self.stream)
        return DeviceBuffer((max(region.nbytes, 4) // 4 + 1,), np.int32, self.stream)

    def _source(self, place: Place) -> tuple[int, int]:
        """(index into a call's bases, byte offset) of a place: arguments, outputs, the arena,
        each stream's scratch region, then the counters."""
        n_args, n_outs = len(self.program.arg_types), len(self.program.output_types)
        if place.kind == "arena":
            return (n_args + n_outs, place.offset)
        if place.kind == "scratch":
            return (n_args + n_outs + 1 + place.slot, place.offset)
        if place.kind == "counters":
            return (n_args + n_outs + 1 + len(self._scratch), place.offset)
        return ((0 if place.kind == "argument" else n_args) + place.slot, place.offset)

    def _build_steps(self, program: CudaProgram, launches: list[Launch]) -> list[_Step]:
        """Steps for `launches` of the program (without call kernels: a variant being raced)."""
        return self._materialize(plan_program(program, launches, self._n_bases, self._source, _load_body)[0])

    def _materialize(self, plans: list[StepPlan], events: bool = True) -> list[_Step]:
        """The planned steps with their kernels, parameter packs and events: a plan kernel's
        first step waits for its producers on other streams, its last records the event its
        consumers wait for (with `events`; the steps a host call queues need neither)."""
        plan = self.program.plan.streams
        n_args = len(self.program.arg_types)
        seen: set[tuple[int, int]] = set()
        steps: list[_Step] = []
        last_on: dict[int, _Step] = {}  # the step each stream ran last
        for i, p in enumerate(plans):
            k, s, launch = p.group, p.stream, p.launch
            first_of_kernel = events and (i == 0 or plans[i - 1].group != k)
            last_of_kernel = events and (i == len(plans) - 1 or plans[i + 1].group != k)
            read = p.sources + ((p.copy[1],) if p.copy else ()) + (p.host.inputs if p.host else ())
            reads = [b for b, _ in read if b < n_args]
            first = tuple(a for a in dict.fromkeys(reads) if (s, a) not in seen)
            seen.update((s, a) for a in first)
            runtime = p.owner.runtime if p.owner is not None else self
            kernel = runtime._module.get_function(launch.symbol) if launch is not None and launch.grid else None
            steps.append(_Step(
                p.name, self.streams[s], kernel,
                kernel.bind([0] * len(launch.params) + [bytes(tensor_map.MAP_BYTES)] * len(launch.tensor_maps))
                if kernel else None,
                p.sources, ((launch.grid if launch else 0), 1, 1), ((launch.block if launch else 0), 1, 1),
                p.copy, tuple(self._events[j] for j in plan.waits[k]) if first_of_kernel else (),
                self._events.get(k) if last_of_kernel else None, first,
                library=runtime._matmul(launch, 0 if p.owner is not None else s)
                if launch is not None and launch.library is not None else None, host=p.host,
                shared=launch.shared_bytes if launch is not None else 0,
                tensor_maps=launch.tensor_maps if launch is not None else ()))
            # A kernel whose stream just ran another kernel of this program may be placed on the
            # GPU early, to wait there (it awaits its producers itself); the first kernel of a
            # stream follows someone else's work and launches plainly, so that nothing of it can
            # run before that work ends. (A library's kernels do not wait that way.)
            previous = last_on.get(s)
            if self.use_dependent and launch is not None and launch.dependent and kernel and not p.copy \
                    and previous and previous.kernel:
                steps[-1].dependent = kernel.dependent_config(steps[-1].grid, steps[-1].block, steps[-1].stream,
                                                              steps[-1].shared)
            last_on[s] = steps[-1]
        return steps

    def _matmul(self, launch: Launch, stream: int) -> "LibraryStep":
        """The cuBLASLt product of a library launch, planned once, with this stream's workspace."""
        from glue.backend_cuda import cublaslt

        gemm = launch.library
        matmul = self._matmuls.get(launch.symbol)
        if matmul is None:
            p = cublaslt.problem(gemm.spec, gemm.a, gemm.b, gemm.d)
            matmul = self._matmuls[launch.symbol] = cublaslt.Matmul(cublaslt.handle_for(self.ctx), p)
        workspace = self._workspaces.get(stream)
        if workspace is None:
            workspace = self._workspaces[stream] = DeviceBuffer((cublaslt.WORKSPACE_BYTES // 4,), np.int32,
                                                                self.streams[stream])
        views = (gemm.a, gemm.b, gemm.d)
        return LibraryStep(matmul, tuple(v.offset * v.dtype.itemsize for v in views), workspace.ptr)

    def __del__(self) -> None:
        outputs = getattr(self, "_outputs", None)
        if outputs is not None:
            outputs.close()

    @property
    def last_graph(self) -> Graph | None:
        """The CUDA graph the latest replayed or captured call used (None before any): replay it
        with `.launch(stream)` to time the program's device work alone."""
        return next(reversed(self._graphs.values()), None)

    def loaded_text(self, stage: str) -> str:
        """What `stage`'s text gains once the program is loaded: for "kernels", who serves each
        contraction and the race's timings."""
        return choices_text(self, self.program) if stage == "kernels" else ""

    @property
    def dependent_launches(self) -> int:
        """How many of the program's kernels launch before their predecessor on the stream ends."""
        return sum(step.dependent is not None for step in self._steps)

    # --- arguments ---------------------------------------------------------------------------
    def _arguments(self, args: Sequence[Any], staged: list[tuple[DeviceBuffer, np.ndarray]]
                   ) -> tuple[list[DeviceBuffer], list[DeviceBuffer]]:
        """The call's arguments as device buffers of this context, and those stream 0 is not yet
        ordered after. A loop passing back what the last call returned (device buffers of their
        compiled shapes and dtypes, written on stream 0, and host values where the last call had
        them) is checked a list at a time: a training step has a hundred arguments and more (for
        a few, one pass costs less)."""
        s0, ctx = self.stream, self.ctx
        buffers = list(args)
        if len(buffers) >= LIST_CHECKS:
            for i in self._host_slots:
                if buffers[i].__class__ is not DeviceBuffer:
                    buffers[i] = self._to_device(i, buffers[i], self.program.arg_types[i], staged)
            if list(map(type, buffers)) == self._all_buffers and list(map(_SHAPE, buffers)) == self._arg_shapes \
                    and list(map(_DTYPE, buffers)) == self._arg_glue_dtypes \
                    and all(stream.ctx is ctx for stream in set(map(_STREAM, buffers))):
                if list(map(_WAITED_ON, buffers)).count(s0) == len(buffers):
                    return buffers, []
                return buffers, self._unordered(buffers)
            self._host_slots = [i for i, a in enumerate(args) if a.__class__ is not DeviceBuffer]
        unordered = []
        for i, (a, (shape, dtype)) in enumerate(zip(buffers, self._arg_specs)):
            if a.__class__ is not DeviceBuffer or a.shape != shape or a.dtype is not dtype or a.stream.ctx is not ctx:
                a = buffers[i] = self._to_device(i, a, self.program.arg_types[i], staged)
            if a.waited_on is not s0:  # as `_unordered`
                unordered.append(a)
        return buffers, unordered

    def _unordered(self, buffers: list[DeviceBuffer]) -> list[DeviceBuffer]:
        """The buffers stream 0 is not yet ordered after (written elsewhere, or not yet prepared)."""
        s0 = self.stream
        return [b for b in buffers if b.waited_on is not s0]

    def _to_device(self, i: int, a: Any, t: TensorType, staged: list[tuple[DeviceBuffer, np.ndarray]]) -> DeviceBuffer:
        """Argument `i` as a device buffer. A small host value goes into argument i's staging
        buffer, and (buffer, value) onto `staged` for the call to copy in."""
        buf = a if isinstance(a, DeviceBuffer) else None
        if buf is not None and buf.stream.ctx is self.ctx:
            if buf.shape != t.shape or (buf.dtype is not t.dtype and buf.dtype != t.dtype):
                raise BackendError(f"cuda: argument {i} of {self.name} is {buf.dtype}{list(buf.shape)}; "
                                   f"the program was compiled for {t}")
            return buf
        x = np.asarray(a, dtype=self._arg_dtypes[i])
        if x.shape != t.shape:
            raise BackendError(f"cuda: argument {i} of {self.name} has shape {x.shape}; the program "
                               f"was compiled for {t}")
        if t.nbytes <= STAGED_BYTES and i not in self._unstaged:
            slot = self._staging.get(i)
            if slot is None:
                slot = self._staging[i] = DeviceBuffer(t.shape, t.dtype, self.stream)
                DeviceBuffer.mark_rewritten([slot], self.stream)  # only stream 0 ever writes it
            staged.append((slot, np.ascontiguousarray(x)))
            return slot
        with profiler.span("copy", f"upload {t}"):
            return DeviceBuffer.from_numpy(x, self.ctx.copy_stream)

    # --- calls -------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> list[DeviceBuffer]:
        program = self.program
        if len(args) != len(self._arg_specs):
            raise BackendError(f"cuda: {self.name} takes {len(program.arg_types)} arguments, got {len(args)}")
        s0, ctx = self.stream, self.ctx
        staged: list[tuple[DeviceBuffer, np.ndarray]] = []  # host values to copy in on stream 0
        buffers, unordered = self._arguments(args, staged)
        prof = profiler.active()
        with ctx.enqueue_lock:  # another thread's call takes outputs and stages values only after this one's launch
            chosen = self._outputs.take() if self._out_layout else []
            # Held by a list of this call's from here on (reference counts): no other call may
            # take the set once the lock is let go, before the caller's Arrays hold it.
            outputs = chosen[:]
            if self._poison_byte is not None:
                self._poison(outputs)
            for slot, value in staged:
                with device_span(s0, "copy", f"upload {slot.dtype}{list(slot.shape)}", bytes=slot.nbytes) \
                        if prof is not None else nullcontext():
                    upload(slot.ptr, value, s0)
            # A graph depends on the addresses of the arguments and of the outputs (which sit at
            # fixed offsets in one block).
            graph = None
            if prof is None and self._use_graphs:
                key = tuple(map(_PTR, buffers + outputs[:1]))
                graph = self._replay(key, buffers, outputs, unordered)
            if graph is None:
                self.graph_stats.direct += 1
                self._enqueue(self._bases(buffers, outputs), buffers, prof)
            elif self.lean_call is not None and self._poison_byte is None:
                self._remember_lean(buffers, chosen, graph, key)
        if self._just_outputs:
            return outputs
        if self._picks is not None:
            picks, donated = self._picks
            if donated:
                DeviceBuffer.mark_rewritten(list(map(buffers.__getitem__, donated)), s0)
            every = buffers + outputs
            return list(map(every.__getitem__, picks))
        return assemble(self._results, outputs, buffers, _DeviceMemory(self.stream, self._copy))

    # --- the lean call ------------------------------------------------------------------------
    def _remember_lean(self, buffers: list[DeviceBuffer], chosen: list[DeviceBuffer], graph: Graph,
                       key: tuple[int, ...]) -> None:
        """After a call that launched `graph` (of graph key `key`) into the output set `chosen`
        (OutputSets' own list), its results, with no poison and no host values staged (no lean
        call passes one): a lean call whose arguments sit at the addresses of `buffers` and are
        ordered on stream 0, as these now are, may replay it into that set (the graph reads and
        writes those addresses, whoever holds them now)."""
        candidates = self._lean.setdefault(tuple(map(_PTR, buffers)), [])
        for known in candidates:
            if known[0] is chosen:
                return
        candidates.append((chosen, chosen[0]._block if chosen else _NO_BLOCK, graph.exec_handle, key))

    def _poison(self, outputs: list[DeviceBuffer]) -> None:
        """Fill the outputs and the arena with the poison byte, so that a value no kernel wrote
        shows."""
        for buf in outputs + ([self.arena] if self.arena else []):
            buf.fill_bytes(self._poison_byte)
        for buf in outputs:  # written next by the kernels, not by the fill
            buf.mark_pending(self.stream)

    def _bases(self, buffers: list[DeviceBuffer], outputs: list[DeviceBuffer]) -> list[int]:
        """The address of every memory place of the call: arguments, outputs, the arena, the
        scratch regions, the counters, then the regions of its call kernels."""
        return [b.ptr for b in buffers] + [o.ptr for o in outputs] + [self.arena.ptr if self.arena else 0] + \
            [s.ptr for s in self._scratch] + [self._counters.ptr if self._counters else 0] + \
            [r.ptr if r is not None else 0 for r in self._regions]

    def _replay(self, key: tuple[int, ...], buffers: list[DeviceBuffer], outputs: list[DeviceBuffer],
                unordered: list[DeviceBuffer]) -> Graph | None:
        """Launch the graph for these addresses (capturing it if new); None to launch directly."""
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(key, self._bases(buffers, outputs))
            if graph is None:
                return None
        else:
            self._graphs.move_to_end(key)
            self.graph_stats.replays += 1
            self.graph_stats.captures_in_a_row = 0
        for buf in unordered:
            buf.prepare_for(self.stream)
        graph.launch(self.stream)
        return graph

    def _capture(self, key: tuple[int, ...], bases: list[int]) -> Graph | None:
        stats = self.graph_stats
        # Calls that keep their outputs alive get new addresses every time: past a few captures
        # in a row (each evicting a graph, which waits for the stream) they launch directly.
        if stats.captures_in_a_row >= 2 * GRAPH_CACHE or (stats.captures >= 2 * GRAPH_CACHE
                                                          and stats.captures > stats.replays):
            self.use_graphs = False
            log.info("glue.cuda: %s launches kernels directly from now on: its buffer addresses changed "
                     "on %d of %d calls (%d in a row), so graph replays would not pay for their captures",
                     self.name, stats.captures, stats.captures + stats.replays, stats.captures_in_a_row)
            return None
        if not self._steps:
            return None
        try:
            graph = capture(self.stream, lambda: self._enqueue(bases, None, None))
        except drv.CudaError as exc:
            self.use_graphs = False
            log.warning("glue.cuda: %s cannot be captured as a CUDA graph (%s); launching its kernels "
                        "directly", self.name, exc)
            return None
        stats.captures += 1
        stats.captures_in_a_row += 1
        self._graphs[key] = graph
        if len(self._graphs) > GRAPH_CACHE:
            self.stream.synchronize()  # the evicted graph may still be running
            self._graphs.popitem(last=False)
            self._lean.clear()
        return graph

    def _enqueue(self, bases: list[int], buffers: list[DeviceBuffer] | None, prof: Any) -> None:
        """Queue every step on its stream, forking from stream 0 and joining back. `buffers`
        (None while capturing a graph) are waited for where each stream first reads them."""
        s0 = self.stream
        if self._fork is not None:
            self._fork.record(s0)
            for stream in self.streams[1:]:
                stream.wait(self._fork)
        for step in self._steps:
            self._run_step(step, bases, buffers, prof)
        for stream, event in self._joins:
            s0.wait(event.record(stream))
        n_args = len(self._arg_specs)
        for slot, donor, nbytes in self._homes:
            drv.check(self._copy(bases[donor], bases[n_args + slot], nbytes, s0.handle), "cuMemcpyDtoDAsync",
                      f"{self.name}: output {slot} into the buffer of donated argument {donor}")

    def run_steps(self, steps: list[_Step], bases: list[int]) -> None:
        """Queue `steps` alone (a variant being timed), on the streams they name."""
        for step in steps:
            self._run_step(step, bases, None, None)

    def _run_step(self, step: _Step, bases: list[int], buffers: list[DeviceBuffer] | None, prof: Any) -> None:
        stream = step.stream
        handle = stream.handle
        for event in step.waits:
            stream.wait(event)
        if buffers is not None:
            for a in step.first_args:
                buffers[a].prepare_for(stream)
        if step.host is not None:
            run_call(step.host.site.plan, _HostRunner(self, step, bases, prof))
            if step.record is not None:
                step.record.record(stream)
            return
        with device_span(stream, "kernel", step.name, grid=step.grid[0], block=step.block[0]) \
                if prof is not None else nullcontext():
            if step.copy:
                (dst, dst_off), (src, src_off), nbytes = step.copy
                drv.check(self._copy(bases[dst] + dst_off, bases[src] + src_off, nbytes, handle),
                          "cuMemcpyDtoDAsync", step.name)
            if step.library is not None:
                step.library.run([bases[b] + off for b, off in step.sources], handle)
            if step.kernel is not None:
                step.pack.pack(step.arguments(bases))
                # (not after waiting for an argument here: only a kernel's predecessor on
                # its stream may still run when it starts early)
                if step.dependent is not None and prof is None and not (buffers and step.first_args):
                    step.kernel.launch_dependent(step.pack, step.dependent)
                else:
                    step.kernel.launch_packed(step.pack, step.grid, step.block, stream, step.shared)
        if step.record is not None:
            step.record.record(stream)

    # --- analyses ----------------------------------------------------------------------------
    def memory_analysis(self) -> MemoryAnalysis:
        """The plan's memory, with scratch the device memory this executable holds besides its
        arena: each stream's scratch region, the counters, cuBLASLt's workspaces, the staging
        buffers of host arguments and its call kernels' regions (constants, carries)."""
        held = self._scratch + [self._counters] + list(self._workspaces.values()) + \
            list(self._staging.values()) + self._regions
        distinct = {id(b): b for b in held if b is not None}  # a body's arena serves several regions
        return analyse_memory(self.program.plan, sum(b.nbytes for b in distinct.values()))

    def cost_analysis(self) -> CostAnalysis:
        if self._cost is None:
            self._cost = estimate_cost(self.program.plan)
        return self._cost


# The block of a call without fresh outputs (its results are all donated arguments): no other
# stream used it.
_NO_BLOCK = SimpleNamespace(other_streams=())


def _lean_call(exe: CudaExecutable) -> tuple[Callable[..., list[DeviceBuffer] | None],
                                             Callable[[Any], list[DeviceBuffer] | None]]:
    """The lean call of `exe` (`exe.lean_call(buffers, hosts)`): the call of a loop that runs
    what an earlier call ran, as one graph replay and little else. It returns the results, or
    None, having done nothing, where the call needs more (then call the executable). The caller
    vouches that `buffers` have the argument types (the frontend compares its Arrays' avals and
    its scalars' classes) and that it owns the buffers at donated positions; `hosts` are the
    positions of host scalars (NumPy scalars, Python floats and bools) among them, which are
    copied into their slots (`_ScalarSlots`) in one driver call before the replay.

    It replays a graph that an earlier call (`__call__`, through `_remember_lean`) replayed or
    captured on these argument addresses, into an output set of that call's, and asks:
    - no profile is open: a profiled call launches its kernels one by one, timed;
    - every argument but the scalars is a device buffer that stream 0 is already ordered after
      (`waited_on`), as every argument of the call it remembers was once that call had run: an
      argument written elsewhere must be waited for first, another host value (no `ptr`)
      uploaded; a host scalar's slot has stream 0's order (only stream 0 writes it);
    - an output set that went with these addresses is free (only its list holds its buffers, as
      `OutputSets.take` asks) and no other stream used its block (there the allocator, not
      stream order, keeps its reuse safe); its buffers, and the donated arguments the graph
      overwrites, are then made pending on stream 0, as `take` and `__call__` make them.
    The results are the outputs, or picked from the arguments and outputs as `__call__` picks
    them (`direct_picks`: donated arguments are results in place). No argument's buffer is a
    donated position's too: the call it remembers had a buffer of its own at each donated
    position (the frontend's usual path copies an Array passed twice), and live buffers of
    distinct memory have distinct addresses, so a call on those addresses has distinct
    buffers there (but buffers of no bytes, which may share an address and have nothing to
    overwrite). What an entry of `exe._lean` assumed changes only where `_lean` is cleared: a
    set let go (OutputSets' `on_release`), a graph evicted, graphs turned off, poisoning
    turned on. Device pointers are unique in the process (unified addressing): equal
    addresses are the same memory.
    Made once per executable with what each call needs at hand (the closure holds no reference
    to `exe`, so that dropping the executable frees it), and with it `lean_call_one(buffer)`,
    `lean_call([buffer])` for a program of one argument whose results are its outputs (a tiny
    loop's `z = f(z)`), which checks that argument without a list's maps: a cached tiny call
    spent a third of its host time in building and comparing one-element lists."""
    entries, stats, lock = exe._lean, exe.graph_stats, exe.ctx.enqueue_lock
    # (`with lock` looks up and binds __enter__ and __exit__ at every call: 4x the time of these)
    acquire, release = lock.acquire, lock.release
    most_recent, unheld = exe._graphs.move_to_end, exe._outputs.unheld
    # (a one-element list's maps and comparison take 6x one call's time)
    one_output, only_in_a_list = len(unheld) == 1, unheld[0] if unheld else None
    driver, stream, name = drv.load(), exe.stream, exe.name
    # (the binding makes a CUstream of an int handle at every call: this one is made once)
    launch, handle = driver.cuGraphLaunch, driver.CUstream(stream.handle)
    active, pending = profiler.active, DeviceBuffer.mark_all_pending
    picks, donated = (None, ()) if exe._just_outputs else exe._picks
    ordered = [stream] * len(exe.program.arg_types)  # every argument's `waited_on` in a call it can serve
    scalars = exe._scalars
    staged = {i: (scalars.views[i], slot) for i, slot in scalars.slots.items()}
    copy_in, scalars_at, scalars_from, scalar_bytes = \
        driver.cuMemcpyHtoDAsync, scalars.ptr, scalars.host.ctypes.data, scalars.nbytes

    def replay(key: tuple[int, ...], rewritten: Sequence[DeviceBuffer],
               hosts: Sequence[int]) -> list[DeviceBuffer] | None:
        """The graph remembered for the argument addresses `key` into a free output set of its
        own, after the host scalars' copy (`hosts`); the donated arguments it overwrites
        (`rewritten`) are made pending with the set. None, having done nothing, where no set is
        free."""
        acquire()  # (entries change under it: a set let go is forgotten before anyone reuses its block)
        try:
            for chosen, block, graph_exec, graph_key in entries.get(key, ()):
                free = getrefcount(chosen[0]) == only_in_a_list if one_output else \
                    list(map(getrefcount, chosen)) == unheld
                if free and not block.other_streams:
                    break
            else:
                return None
            outputs = chosen[:]  # held now: no other call takes the set once the lock is let go
            # written next: the set, as OutputSets.take hands it out, and the donated arguments
            pending(outputs + rewritten if rewritten else outputs, stream)
            if hosts:
                err, = copy_in(scalars_at, scalars_from, scalar_bytes, handle)
                if err:
                    raise drv.error_for("cuMemcpyHtoDAsync", err, detail=f"the host scalars of {name}")
            err, = launch(graph_exec, handle)  # (Graph.launch, inline)
            if err:
                raise drv.error_for("cuGraphLaunch", err, detail=f"a replay of {name} on {stream}")
            most_recent(graph_key)  # (counted as `_replay` counts a replay)
            stats.replays += 1
            stats.captures_in_a_row = 0
        finally:
            release()
        return outputs

    def lean_call(buffers: list[Any], hosts: Sequence[int] = ()) -> list[DeviceBuffer] | None:
        if active() is not None:
            return None
        for i in hosts:  # host scalars: into the host bytes of their slots, which stand in for them
            view_slot = staged.get(i)
            if view_slot is None:
                return None
            view_slot[0][()] = buffers[i]
            buffers[i] = view_slot[1]
        try:
            key = tuple(map(_PTR, buffers))
        except AttributeError:  # not a device buffer
            return None
        if list(map(_WAITED_ON, buffers)) != ordered:
            return None
        outputs = replay(key, list(map(buffers.__getitem__, donated)) if donated else (), hosts)
        if outputs is None or picks is None:
            return outputs
        every = buffers + outputs
        return list(map(every.__getitem__, picks))

    def lean_call_one(buffer: Any) -> list[DeviceBuffer] | None:
        if active() is not None:
            return None
        try:
            key = (buffer.ptr,)
        except AttributeError:  # not a device buffer
            return None
        if buffer.waited_on is not stream:
            return None
        return replay(key, (), ())

    return lean_call, lean_call_one


def _load_body(lowering: Any) -> tuple[list[Launch], "CudaExecutable"]:
    """A call kernel's body loaded for one call site: an executable of its own (its module, its
    arena, its choice of contraction variants), whose launches the caller queues."""
    program = lowering["llvm"]
    body = CudaExecutable(program, lowering["ptx"], "body", as_body=True)
    return body.kernels, body


class _HostRunner:
    """The scheduler's Runner for a host call: a body's steps are queued on the call's stream;
    reading a value waits for the work before it."""

    def __init__(self, exe: CudaExecutable, step: _Step, bases: list[int], prof: Any):
        self.exe, self.step, self.bases, self.prof = exe, step, bases, prof
        self.host = step.host

    def _address(self, ref: Ref) -> int:
        base, offset = resolve_ref(self.host, ref)
        return self.bases[base] + offset

    def invoke(self, body: int, args: Sequence[Ref], results: Sequence[Ref]) -> None:
        exe, host = self.exe, self.host
        where = tuple(resolve_ref(host, r) for r in args), tuple(resolve_ref(host, r) for r in results)
        key = (id(host.site), body) + where
        steps = exe._host_steps.get(key)
        if steps is None:  # the same run of a body (a while's two carry placements) is planned once
            stream = exe.streams.index(self.step.stream)
            plans = exe._planner.invocation_steps(host.site, body, *where, 0, stream)
            steps = exe._host_steps[key] = exe._materialize(plans, events=False)
        for s in steps:
            exe._run_step(s, self.bases, None, self.prof)

    def copy(self, source: Ref, target: Ref, type_: TensorType) -> None:
        stream = self.step.stream
        drv.check(self.exe._copy(self._address(target), self._address(source), type_.nbytes, stream.handle),
                  "cuMemcpyDtoDAsync", "a host call")

    def read(self, ref: Ref, type_: TensorType) -> np.ndarray:
        out = np.empty(type_.shape, type_.dtype.numpy)
        download(out, self._address(ref), self.step.stream)
        return out


def device_put(value: Any) -> DeviceBuffer:
    """`value` in GPU memory (uploaded on the context's copy stream)."""
    if isinstance(value, DeviceBuffer):
        return value
    return DeviceBuffer.from_numpy(np.asarray(value))


@dataclass(frozen=True)
class LibraryStep:
    """A cuBLASLt product in a program: its plan, each operand's byte offset from its place
    (a, b, d) and this stream's workspace."""

    matmul: Any
    offsets: tuple[int, int, int]
    workspace: int

    def run(self, places: list[int], stream_handle: Any) -> None:
        a, b, d = (p + o for p, o in zip(places, self.offsets))
        self.matmul.run(a, b, d, self.workspace, int(stream_handle))


def device_copy(value: Any) -> DeviceBuffer:
    """A new device buffer holding `value` (a DeviceBuffer is copied on the device)."""
    if not isinstance(value, DeviceBuffer):
        return DeviceBuffer.from_numpy(np.asarray(value))
    stream = value.stream
    return _DeviceMemory(stream, drv.load().cuMemcpyDtoDAsync).copy(value, TensorType(value.shape, value.dtype))


def _homed(results: list[Result], spare: Sequence[int], arg_types: Sequence[TensorType]
           ) -> tuple[list[Result], list[tuple[int, int, int]]]:
    """The results with some fresh outputs moved into spare donors of their type at the end of
    the call, and those moves (output slot, argument, bytes): each fresh output whose own
    donor (`own_donors`, as the memory plan pairs them) another output took. A training loop
    passes results back where it took them from; such a value in a fresh buffer would, as the
    next call's donated argument, become the home of another output, keep its call's output
    block alive, and so land every call's outputs at new addresses, where no graph replays. (A
    fresh output whose own donor is spare comes back free at the next call, and the output
    blocks alternate.)"""
    taken = {r.slot for r in results if r.kind == "donated"}
    free = list(spare)
    own = own_donors(range(len(results)), {j: r.type for j, r in enumerate(results)},
                     [(d, arg_types[d]) for d in sorted(taken | set(spare))])
    homed, moves = [], []
    for j, r in enumerate(results):
        fitting = [d for d in free if arg_types[d] == r.type] if r.kind == "output" and own.get(j) in taken else []
        donor = next(iter(fitting), None)
        if donor is None:
            homed.append(r)
            continue
        free.remove(donor)
        moves.append((r.slot, donor, r.type.nbytes))
        homed.append(Result("donated", donor, r.type))
    return homed, moves


class _DeviceMemory:
    """Result assembly on device buffers (see glue.backend.results); copies queue on the
    program's stream after its kernels."""

    def __init__(self, stream: Stream, copy: Any):
        self.stream, self._copy = stream, copy

    def full(self, type_: TensorType, value: Any) -> DeviceBuffer:
        return DeviceBuffer.from_numpy(np.full(type_.shape, value, type_.dtype.numpy))

    def reuse(self, buffer: DeviceBuffer, type_: TensorType) -> DeviceBuffer:
        buffer.mark_pending(self.stream)  # the kernels wrote it
        if buffer.shape == type_.shape and buffer.dtype == type_.dtype:
            return buffer
        return self.copy(buffer, type_)

    def copy(self, buffer: DeviceBuffer, type_: TensorType) -> DeviceBuffer:
        copy = DeviceBuffer(type_.shape, type_.dtype, self.stream)
        buffer.prepare_for(self.stream)
        drv.check(self._copy(copy.ptr, buffer.ptr, copy.nbytes, self.stream.handle), "cuMemcpyDtoDAsync")
        copy.mark_written()
        return copy
