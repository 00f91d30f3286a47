"""Running a compiled Program: buffers, the buffer table, and kernels split over threads.

A call converts its arguments to contiguous NumPy arrays (the buffers of this backend; an
argument at a donated position is glue's own array, which the kernels may overwrite), allocates the outputs, takes a
workspace (the arena plus per-thread scratch; reused across calls, one per concurrent call),
fills the buffer table and runs the kernels in order. A kernel with enough work is split into
one chunk per core: the calling thread runs the first chunk and pool threads the others
(ctypes releases the GIL for the call). Splitting never changes results: every unit (an
element, or a whole row of a reduction) is computed by exactly one thread with the same code.
Small kernels run inline, since handing work to a thread and joining it costs about 15 µs.
A call kernel runs its compiled bodies from the same thread (`calls.py`); a program compiled as
such a body runs through `run_at`, on addresses in its parent's buffers.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Sequence

import numpy as np

from glue import profiler
from glue.backend.results import assemble
from glue.backend_cpu.calls import CallSite, CallStep, array_at
from glue.backend_cpu.code import LoadedKernel
from glue.backend_cpu.kernels import KernelFunction
from glue.backend_cpu.program import KernelUse, Program
from glue.backend_cpu.target import thread_count
from glue.codegen.analysis import CostAnalysis, MemoryAnalysis, analyse_memory, estimate_cost
from glue.errors import BackendError
from glue.ir import TensorType
from glue.scheduler.calls import BodyLayout, body_layout
from glue.settings import config

ALIGN = 64


class _Worker:
    """A thread that runs one task at a time, handed over through a pair of locks."""

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._done = threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._task: tuple = ()
        self._error: BaseException | None = None
        threading.Thread(target=self._run, daemon=True, name="glue-cpu-worker").start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            fn, *args = self._task
            try:
                fn(*args)
            except BaseException as exc:  # handed to the caller by wait()
                self._error = exc
            self._done.release()

    def start(self, *task: Any) -> None:
        self._task = task
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()
        error, self._error = self._error, None
        if error is not None:
            raise error


class _Pool:
    """Worker threads shared by every executable; one caller uses them at a time (a second
    concurrent caller runs its chunks inline rather than wait)."""

    def __init__(self) -> None:
        self._busy = threading.Lock()
        self._workers: list[_Worker] = []

    def run(self, fn: Any, table: Any, places: int, chunks: Sequence[tuple[int, int]], scratch: int,
            stride: int) -> None:
        if not self._busy.acquire(blocking=False):
            for c, (lo, hi) in enumerate(chunks):
                fn(table, places, lo, hi, scratch + c * stride)
            return
        try:
            while len(self._workers) < len(chunks) - 1:
                self._workers.append(_Worker())
            helpers = self._workers[:len(chunks) - 1]
            for c, worker in enumerate(helpers, start=1):
                lo, hi = chunks[c]
                worker.start(fn, table, places, lo, hi, scratch + c * stride)
            try:
                fn(table, places, chunks[0][0], chunks[0][1], scratch)
            finally:
                for worker in helpers:
                    worker.wait()
        finally:
            self._busy.release()


_pool = _Pool()


def split(function: KernelFunction, threads: int) -> list[tuple[int, int]]:
    """Chunks of a kernel's units, one per thread when the kernel is worth splitting; chunk
    boundaries fall on whole rows when there are enough rows, else on 64-unit multiples.

    A kernel of less work than `config.cpu_parallel_threshold` (estimated operations, see
    kernels.cost_per_point) runs on the calling thread. Measured on the 2-core development
    machine: handing a chunk to a pool thread and joining it costs about 15 µs, and splitting
    starts to pay at about 35 µs of work (an elementwise x*2+1 of about 500k elements, a tanh of
    about 30k), near 400k estimated operations."""
    units = function.units
    if not function.splittable or threads == 1 or function.cost < config.cpu_parallel_threshold or units < 2:
        return [(0, units)]
    grain = function.row if units // function.row >= threads else min(64, function.row)
    blocks = -(-units // grain)
    parts = min(threads, blocks)
    bounds = [min(units, (blocks * c // parts) * grain) for c in range(parts + 1)]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def _address(x: np.ndarray) -> int:
    """The address of an array's first element. `x.ctypes.data` builds a ctypes helper object
    each time (about 2 us, paid for every argument and output of every call); a ctypes view of
    the buffer is a third of that. Read-only and empty arrays cannot be viewed that way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(x))
    except (TypeError, ValueError):
        return x.ctypes.data


class _Workspace:
    def __init__(self, arena: int, scratch: int, chunks: int):
        self.stride = -(-scratch // ALIGN) * ALIGN
        size = -(-arena // ALIGN) * ALIGN + self.stride * chunks + ALIGN
        self.buffer = np.empty(size + ALIGN, np.uint8)
        base = self.buffer.ctypes.data
        self.arena = -(-base // ALIGN) * ALIGN
        self.scratch = self.arena + -(-arena // ALIGN) * ALIGN


class _HostMemory:
    """Result assembly on host arrays (see glue.backend.results)."""

    @staticmethod
    def copy(buffer: np.ndarray, type_: TensorType) -> np.ndarray:
        return buffer.copy()

    @staticmethod
    def full(type_: TensorType, value: Any) -> np.ndarray:
        return np.full(type_.shape, value, type_.dtype.numpy)

    @staticmethod
    def reuse(buffer: np.ndarray, type_: TensorType) -> np.ndarray:
        return buffer.reshape(-1).view(type_.dtype.numpy).reshape(type_.shape)


_HOST = _HostMemory()


class _Step:
    """One kernel of a call: its shared code's entry point, the places of this use's operands
    (the i64 pairs the code reads them from, then the sizes it reads where it serves kernels of
    other sizes) and its chunks of work."""

    __slots__ = ("entry", "places", "address", "chunks")

    def __init__(self, code: LoadedKernel, use: KernelUse, threads: int, function: KernelFunction):
        self.entry = code.entry
        numbers = [n for p in use.places for n in (p.slot, p.offset)] + list(use.launch.sizes if use.launch else ())
        self.places = (ctypes.c_int64 * max(len(numbers), 1))(*numbers)
        self.address = ctypes.addressof(self.places)
        self.chunks = split(function, threads)


class Executable:
    """A compiled program: call it with the arguments (constvars' values, then invars').
    `bodies` holds, per call kernel (by step position), the executables of its bodies."""

    def __init__(self, program: Program, code: dict[bytes, LoadedKernel],
                 bodies: dict[int, list["Executable"]] | None = None):
        self.program = program
        self._code = code  # keeps each kernel's code linked while this program may run it
        self._cost: CostAnalysis | None = None  # estimated when first asked for, not at every compile
        self.kernels: list[KernelFunction | CallSite] = [
            use if isinstance(use, CallSite) else use.function(code[use.key].function)
            for use in program.uses]
        self.threads = thread_count()
        self._steps: list[_Step | CallStep] = [
            CallStep(use, (bodies or {})[k]) if isinstance(use, CallSite)
            else _Step(code[use.key], use, self.threads, f)
            for k, (use, f) in enumerate(zip(program.uses, self.kernels))]
        self._scratch = max((f.scratch_bytes for f in self.kernels if isinstance(f, KernelFunction)), default=0)
        self._free: list[_Workspace] = []
        self._arg_types = program.arg_types
        self._results = program.results  # (the plan builds them on each access)
        self._dtypes = [t.dtype.numpy for t in self._arg_types]
        self._outputs = [(t.shape, t.dtype.numpy) for t in program.output_types]
        self._table = ctypes.c_void_p * (len(program.arg_types) + len(program.output_types) + 2)
        self._literals = np.array(program.literals or (0.0,), np.float64)  # (the table's last entry)
        self._layout: tuple[BodyLayout, list[TensorType], list[int]] | None = None  # run_at's, made once

    def _arguments(self, args: Sequence[Any]) -> list[np.ndarray]:
        types = self._arg_types
        if len(args) != len(types):
            raise BackendError(f"cpu: the program takes {len(types)} arguments, got {len(args)}")
        arrays = []
        for a, t, dtype in zip(args, types, self._dtypes):
            x = np.asarray(a, dtype=dtype, order="C")
            if x.shape != t.shape:
                raise BackendError(f"cpu: argument {len(arrays)} has shape {x.shape}; the program "
                                   f"was compiled for {t}")
            arrays.append(x)
        return arrays

    def __call__(self, *args: Any) -> list[np.ndarray]:
        arrays = self._arguments(args)
        outputs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        self._run(list(map(_address, arrays)), list(map(_address, outputs)))
        return assemble(self._results, outputs, arrays, _HOST)

    def run_at(self, arguments: Sequence[int], results: Sequence[int]) -> None:
        """Run as the body of a call kernel: the arguments and every result are at the given
        addresses (in a parent program's buffers), which the kernels read and write in place."""
        if self._layout is None:
            types = [r.type for r in self.program.results]
            self._layout = body_layout(self.program.results), types, [t.nbytes for t in types]
        layout, types, sizes = self._layout
        self._run(arguments, [results[r] for r in layout.slot_result])
        for (kind, i), r in layout.copies:
            if sizes[r]:
                ctypes.memmove(results[r], arguments[i] if kind == "argument" else results[i], sizes[r])
        for r, value in layout.fills:
            array_at(results[r], types[r])[...] = value

    def _run(self, arguments: Sequence[int], outputs: Sequence[int]) -> None:
        try:  # a workspace no other call is using (calls may come from several threads)
            space = self._free.pop()
        except IndexError:
            space = _Workspace(self.program.plan.memory.arena_bytes, self._scratch, self.threads)
        try:
            table = self._table(*arguments, *outputs, space.arena, self._literals.ctypes.data)
            prof = profiler.active()
            for step, kernel in zip(self._steps, self.kernels):
                start = time.perf_counter_ns() if prof is not None else 0
                if isinstance(step, CallStep):
                    step.run(table)
                    threads, code = 1, None
                else:
                    chunks, threads, code = step.chunks, len(step.chunks), kernel.symbol
                    if threads == 1:
                        step.entry(table, step.address, chunks[0][0], chunks[0][1], space.scratch)
                    else:
                        _pool.run(step.entry, table, step.address, chunks, space.scratch, space.stride)
                if prof is not None:
                    prof.add_host("kernel", kernel.name, start, time.perf_counter_ns(),
                                  {"kind": kernel.kind, "threads": threads, "code": code})
        finally:
            self._free.append(space)

    def memory_analysis(self) -> MemoryAnalysis:
        return analyse_memory(self.program.plan, self._scratch * self.threads)

    def cost_analysis(self) -> CostAnalysis:
        if self._cost is None:
            self._cost = estimate_cost(self.program.plan)
        return self._cost
