"""Running a compiled CudaProgram on the device: one stream, preallocated state, lean calls.

Compiling loads the module (through the context's module cache), looks up every kernel, binds
one parameter pack per launch and allocates the program's arena once. A call then:

1. takes its arguments to the device: a `glue.Array` already there is used as is (ordered after
   its producer when that ran on another stream); anything else is uploaded;
2. allocates the fresh outputs from the caching allocator;
3. per launch, writes the parameter addresses (argument / output base + offset, arena + offset)
   into the launch's pack and queues it; a scatter first copies its `init` input into place;
4. records each output's completion event and returns device-backed `glue.Array`s without
   waiting: reading one (`np.asarray`) or `block_until_ready()` waits.

Calls on one executable run in order on its stream, so they may share the arena. Graph outputs
that are inputs come back as copies; literal outputs are host arrays. `poison` (or
`GLUE_CUDA_POISON=0xff`) fills outputs and the arena with that byte before each call, so tests
catch elements no kernel writes.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from glue.codegen.analysis import CostAnalysis, MemoryAnalysis
from glue.backend_cuda.codegen import CudaProgram, Place
from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.context import get_context
from glue.backend_cuda.runtime.device_array import DeviceBuffer
from glue.backend_cuda.runtime.module import ArgPack, Kernel
from glue.errors import BackendError
from glue.frontend.array import Array
from glue.ir import TensorType


@dataclass
class _Step:
    launch: Any
    kernel: Kernel | None
    pack: ArgPack | None
    sources: tuple[tuple[int, int], ...]   # per parameter: (index into the call's bases, offset)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    copy: tuple[tuple[int, int], tuple[int, int], int] | None


def _poison_from_env() -> int | None:
    value = os.environ.get("GLUE_CUDA_POISON")
    return int(value, 0) if value else None


class CudaExecutable:
    """A program loaded on the GPU; call it with the arguments (constvars' values, then invars')."""

    def __init__(self, program: CudaProgram, ptx: str, cost: CostAnalysis, name: str = "glue"):
        self.program = program
        self.ctx = get_context()
        self.stream = self.ctx.stream
        self._cost = cost
        self.poison: int | None = _poison_from_env()
        module = self.ctx.modules.load(ptx, name) if program.launches else None
        self.kernels = list(program.launches)
        n_args, n_outs = len(program.arg_types), len(program.output_types)
        arena_index = n_args + n_outs

        def source(place: Place) -> tuple[int, int]:
            base = {"argument": 0, "output": n_args, "arena": arena_index}[place.kind]
            return (base + (place.slot if place.kind != "arena" else 0), place.offset)

        self._steps = []
        for launch in program.launches:
            copy = (source(launch.copy[0]), source(launch.copy[1]), launch.copy[2]) if launch.copy else None
            if launch.grid == 0:
                if copy:
                    self._steps.append(_Step(launch, None, None, (), (0, 1, 1), (1, 1, 1), copy))
                continue
            kernel = module.get_function(launch.symbol)
            pack = kernel.bind([0] * len(launch.params))
            self._steps.append(_Step(launch, kernel, pack, tuple(source(p) for p in launch.params),
                                     (launch.grid, 1, 1), (launch.block, 1, 1), copy))
        # glue has no byte dtype; arena sizes are multiples of 256 bytes.
        self.arena = DeviceBuffer((program.arena_bytes // 4,), np.int32, self.stream) if program.arena_bytes else None
        self._arg_dtypes = [t.dtype.numpy for t in program.arg_types]
        self._lock = threading.Lock()
        self._copy = drv.load().cuMemcpyDtoDAsync

    # --- arguments ---------------------------------------------------------------------------
    def _to_device(self, i: int, a: Any, t: TensorType) -> DeviceBuffer:
        buf = a.device_buffer if isinstance(a, Array) else a if isinstance(a, DeviceBuffer) else None
        if buf is not None and buf.stream.ctx is self.ctx:
            if buf.shape != t.shape or buf.dtype != t.dtype:
                raise BackendError(f"cuda: argument {i} is {buf.dtype}{list(buf.shape)}; the program "
                                   f"was compiled for {t}")
            buf.prepare_for(self.stream)
            return buf
        x = np.asarray(a, dtype=self._arg_dtypes[i])
        if x.shape != t.shape:
            raise BackendError(f"cuda: argument {i} has shape {x.shape}; the program was compiled for {t}")
        return DeviceBuffer.from_numpy(x, self.stream)

    def __call__(self, *args: Any) -> list[Array]:
        program = self.program
        if len(args) != len(program.arg_types):
            raise BackendError(f"cuda: the program takes {len(program.arg_types)} arguments, got {len(args)}")
        stream = self.stream
        buffers = [self._to_device(i, a, t) for i, (a, t) in enumerate(zip(args, program.arg_types))]
        outputs = [DeviceBuffer(t.shape, t.dtype, stream) for t in program.output_types]
        if self.poison is not None:
            for buf in outputs + ([self.arena] if self.arena else []):
                buf.fill_bytes(self.poison)
        bases = [b.ptr for b in buffers] + [o.ptr for o in outputs] + [self.arena.ptr if self.arena else 0]
        handle = stream.handle
        with self._lock:
            for step in self._steps:
                if step.copy:
                    (dst, dst_off), (src, src_off), nbytes = step.copy
                    drv.check(self._copy(bases[dst] + dst_off, bases[src] + src_off, nbytes, handle),
                              "cuMemcpyDtoDAsync", step.launch.symbol)
                if step.kernel is not None:
                    step.pack.pack([bases[b] + off for b, off in step.sources])
                    step.kernel.launch_packed(step.pack, step.grid, step.block, stream)
        for buf in outputs:
            buf.mark_written()
        return [self._result(r, args, buffers, outputs) for r in program.results]

    def _result(self, r, args: Sequence[Any], buffers: list[DeviceBuffer], outputs: list[DeviceBuffer]) -> Array:
        if r.kind == "output":
            return Array(outputs[r.slot])
        if r.kind == "literal":
            return Array(np.full(r.type.shape, r.value, r.type.dtype.numpy))
        source = buffers[r.slot]
        if not r.copy:  # a donated argument's buffer, which the kernels wrote
            source.mark_written()
            if source.shape == r.type.shape and source.dtype == r.type.dtype:
                return Array(source)
        if r.copy and not isinstance(args[r.slot], (Array, DeviceBuffer)):
            return Array(np.array(args[r.slot], dtype=r.type.dtype.numpy))
        copy = DeviceBuffer(r.type.shape, r.type.dtype, self.stream)
        drv.check(self._copy(copy.ptr, source.ptr, copy.nbytes, self.stream.handle), "cuMemcpyDtoDAsync")
        copy.mark_written()
        return Array(copy)

    # --- analyses ----------------------------------------------------------------------------
    def memory_analysis(self) -> MemoryAnalysis:
        m = self.program.plan.memory
        return MemoryAnalysis(m.peak_bytes, m.naive_bytes, m.arena_bytes, m.argument_bytes,
                              m.output_bytes, 0)

    def cost_analysis(self) -> CostAnalysis:
        return self._cost


def device_put(value: Any) -> Array:
    """A `glue.Array` holding `value` in GPU memory (uploaded on the default stream)."""
    if isinstance(value, Array) and value.device_buffer is not None:
        return value
    return Array(DeviceBuffer.from_numpy(np.asarray(value), get_context().stream))
