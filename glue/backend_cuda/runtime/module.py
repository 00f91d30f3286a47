"""PTX modules: compiled once, cached in memory, and their kernels launched.

`ModuleCache.load(ptx)` turns PTX into machine code and loads it (errors come back with ptxas's
log), and keeps the module in memory, keyed by the PTX, the device's arch and the driver version.
Where a `ptxas` is on the PATH (`glue.config.cuda_ptxas`, on by default) it compiles each kernel,
several at a time, and the disk cache (`glue.backend.cache`, namespace "cuda") keeps the machine
code; without one, or where ptxas, the linker or the driver refuses its code, the driver's JIT
compiles the PTX (it compiles one kernel at a time: 3.8 s for the small step's 46 kernels, which
ptxas compiled in 0.6 s) and its own JIT cache (`CUDA_CACHE_PATH`) serves a later process.
Either way a kernel is compiled as relocatable code and linked by the driver's linker, but for
the warpgroup kernels, which are compiled as whole programs (`whole_program` says why).

A program's PTX (`ptx.ProgramPtx`) is one module per distinct kernel: each is cached on its own,
so programs share their identical kernels and a changed program compiles only its new ones, on
host threads; `load` then returns a `ProgramModule` that finds each kernel in its module.

Each kernel's parameter list is read from its PTX `.entry`, so a launch checks the argument count
and packs the values with one precompiled `struct` call into a parameter block whose pointer
array was built once; `cuLaunchKernel` then gets that array's address as a plain int (the
cheapest `kernelParams` form cuda.bindings accepts; benchmarks/cuda_launch.py times the others).
"""
from __future__ import annotations

import ctypes
import logging
import re
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from glue import profiler
from glue.backend.cache import DiskCache, digest
from glue.backend.contract import KernelStats
from glue.backend.workers import worker_count
from glue.backend_cuda.ptx import ProgramPtx, cubin, ptx_target, ptxas_available, ptxas_version
from glue.backend_cuda.runtime import driver as drv
from glue.errors import BackendError
from glue.settings import config

if TYPE_CHECKING:
    from glue.backend_cuda.runtime.context import Context
    from glue.backend_cuda.runtime.stream import Stream

_LOG_BYTES = 1 << 16
DISK = DiskCache("cuda")  # ptxas's machine code (`cuda_ptxas`)
log = logging.getLogger("glue")

# PTX parameter type -> struct format; `.ptr`-qualified u64 params take device pointers.
_FORMATS = {"u8": "B", "s8": "b", "b8": "B", "u16": "H", "s16": "h", "b16": "H", "f16": "e",
            "u32": "I", "s32": "i", "b32": "I", "f32": "f", "u64": "Q", "s64": "q", "b64": "Q",
            "f64": "d"}
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Param:
    """One kernel parameter as PTX declares it: `.param .u64 .ptr .global .align 1 k_param_0`."""

    ptx_type: str
    pointer: bool = False
    count: int = 1          # elements of an array parameter (`.b8 p[16]`: a struct by value)
    align: int = 0          # 0: the type's own size

    @property
    def format(self) -> str:
        return f"{self.count}s" if self.count > 1 else _FORMATS[self.ptx_type]


def _parse_param(text: str) -> Param:
    tokens = text.split()
    at = next(i for i, t in enumerate(tokens) if t[1:] in _FORMATS)
    # `.align` before the type aligns the parameter; after it (with `.ptr`) it is the pointee's.
    align = int(tokens[tokens.index(".align") + 1]) if ".align" in tokens[:at] else 0
    count = re.search(r"\[(\d+)\]$", tokens[-1])
    return Param(tokens[at][1:], ".ptr" in tokens, int(count.group(1)) if count else 1, align)


def entry_params(ptx: str) -> dict[str, tuple[Param, ...]]:
    """The kernels a PTX module defines and their parameters, in order."""
    return {name: tuple(_parse_param(p) for p in body.split(",") if p.strip())
            for name, body in _ENTRY.findall(ptx)}


class ArgPack:
    """A kernel's parameters in C memory: a value block and the `void*[]` cuLaunchKernel reads.

    The driver copies the values when the launch is queued, so one pack can be refilled and
    launched again right away.
    """

    __slots__ = ("_struct", "_block", "_argv", "address", "_pointer_slots")

    def __init__(self, params: Sequence[Param]):
        fmt, offsets, offset = "<", [], 0
        for p in params:
            size = struct.calcsize("<" + p.format)
            align = p.align or size
            pad = -offset % align
            fmt += "x" * pad + p.format
            offsets.append(offset + pad)
            offset += pad + size
        self._struct = struct.Struct(fmt)
        self._block = ctypes.create_string_buffer(max(offset, 1))
        base = ctypes.addressof(self._block)
        self._argv = (ctypes.c_void_p * max(len(params), 1))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self._argv) if params else 0
        self._pointer_slots = tuple(i for i, p in enumerate(params) if p.pointer)

    def pack(self, args: Sequence[Any]) -> None:
        """Write `args` into the block; pointer params take ints or objects with a `ptr`."""
        if self._pointer_slots:
            args = list(args)
            for i in self._pointer_slots:
                if args[i].__class__ is not int:
                    args[i] = args[i].ptr
        self._struct.pack_into(self._block, 0, *args)


class Kernel:
    """A `__global__` function of a loaded module."""

    def __init__(self, module: Module, name: str, handle: int, params: tuple[Param, ...]):
        if not handle:
            raise drv.CudaUsageError(f"cuda: kernel {name!r} has a null function handle")
        self.module, self.name, self.handle, self.params = module, name, handle, params
        self._pack = ArgPack(params)
        self._lock = threading.Lock()
        self._shared_limit = 48 << 10  # dynamic shared memory allowed without opting in
        self._launch = drv.load().cuLaunchKernel
        # Synchronise after every launch so that a fault is reported by the launch that caused it.
        self._blocking = config.cuda_launch_blocking

    def launch(self, grid: int | tuple[int, ...], block: int | tuple[int, ...],
               args: Sequence[Any] = (), stream: Stream | None = None, shared_mem: int = 0) -> None:
        """Queue the kernel on `stream` (the context's default stream if None)."""
        gx, gy, gz = (grid, 1, 1) if grid.__class__ is int else (*grid, 1, 1)[:3]
        bx, by, bz = (block, 1, 1) if block.__class__ is int else (*block, 1, 1)[:3]
        if shared_mem > self._shared_limit:
            self._allow_shared(shared_mem)
        stream = stream or self.module.ctx.stream
        with self._lock:
            self._fill(self._pack, args)
            err, = self._launch(self.handle, gx, gy, gz, bx, by, bz, shared_mem, stream.handle,
                                self._pack.address, 0)
            if err:
                self._check((gx, gy, gz), (bx, by, bz), shared_mem, stream, self._pack, err)
        if self._blocking:
            drv.check(drv.load().cuStreamSynchronize(stream.handle), "cuStreamSynchronize", self.name)

    def bind(self, args: Sequence[Any]) -> ArgPack:
        """A parameter pack of its own holding `args`, to launch again and again without
        repacking (`launch_packed`): e.g. every step of a loop over the same buffers."""
        return self._fill(ArgPack(self.params), args)

    def launch_packed(self, pack: ArgPack, grid: tuple[int, int, int], block: tuple[int, int, int],
                      stream: Stream, shared_mem: int = 0) -> None:
        """The leanest launch: a pack from `bind`, full 3-d dims, an explicit stream."""
        if shared_mem > self._shared_limit:
            self._allow_shared(shared_mem)
        err, = self._launch(self.handle, *grid, *block, shared_mem, stream.handle, pack.address, 0)
        if err:
            self._check(grid, block, shared_mem, stream, pack, err)

    def dependent_config(self, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Stream,
                         shared_mem: int = 0) -> Any:
        """A launch configuration for `launch_dependent` on `stream`: programmatic stream
        serialization, so the kernel may be placed on the GPU before the stream's previous
        kernel has finished. Only for kernels that wait for their producers themselves
        (`griddepcontrol.wait`, see codegen.common)."""
        driver = drv.load()
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        if shared_mem > self._shared_limit:
            self._allow_shared(shared_mem)
        config.sharedMemBytes = shared_mem
        config.hStream = stream.handle
        config.attrs = [attr]
        config.numAttrs = 1
        return config

    def launch_dependent(self, pack: ArgPack, config: Any) -> None:
        """`launch_packed` with a configuration from `dependent_config`."""
        err, = drv.load().cuLaunchKernelEx(config, self.handle, pack.address, 0)
        if err:
            raise drv.error_for("cuLaunchKernelEx", err, self.name,
                                f"grid=({config.gridDimX}, {config.gridDimY}, {config.gridDimZ}) "
                                f"block=({config.blockDimX}, {config.blockDimY}, {config.blockDimZ}), "
                                "dependent launch")

    def attributes(self) -> dict[str, int]:
        """Registers per thread, local (spill) and static shared bytes, max threads per block."""
        driver = drv.load()
        a = driver.CUfunction_attribute
        names = {"registers": a.CU_FUNC_ATTRIBUTE_NUM_REGS,
                 "local_bytes": a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                 "shared_bytes": a.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                 "max_threads_per_block": a.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK}
        return {k: drv.call(driver.cuFuncGetAttribute, v, self.handle, kernel=self.name)
                for k, v in names.items()}

    def _allow_shared(self, nbytes: int) -> None:
        driver = drv.load()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        drv.call(driver.cuFuncSetAttribute, self.handle, attr, nbytes, kernel=self.name)
        self._shared_limit = nbytes

    def _signature(self) -> str:
        return ", ".join("ptr" if p.pointer else p.ptx_type for p in self.params)

    def _fill(self, pack: ArgPack, args: Sequence[Any]) -> ArgPack:
        """Pack `args`, raising an error naming the kernel when they do not fit its parameters."""
        if len(args) != len(self.params):
            raise drv.CudaUsageError(f"cuda: kernel {self.name!r} takes {len(self.params)} arguments "
                                     f"({self._signature()}), got {len(args)}")
        try:
            pack.pack(args)
        except (struct.error, AttributeError, TypeError) as exc:
            given = ", ".join(type(a).__name__ for a in args)
            raise drv.CudaUsageError(f"cuda: the arguments ({given}) of kernel {self.name!r} do not "
                                     f"fit its parameters ({self._signature()}): {exc}") from None
        return pack

    def _check(self, grid, block, shared_mem, stream, pack, err) -> None:
        """Handle a failed launch: a host thread that never used the context makes it current
        and launches again; anything else raises."""
        if err.name == "CUDA_ERROR_INVALID_CONTEXT":
            self.module.ctx.make_current(force=True)
            err, = self._launch(self.handle, *grid, *block, shared_mem, stream.handle, pack.address, 0)
        if err:
            raise drv.error_for("cuLaunchKernel", err, self.name,
                                f"grid={grid} block={block} shared_mem={shared_mem} on {stream}")

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {len(self.params)} params)"


class Module:
    """A loaded CUDA module and its kernels."""

    def __init__(self, ctx: Context, handle: int, ptx: str, key: str):
        self.ctx, self.handle, self.key = ctx, handle, key
        self._params = entry_params(ptx)
        self._kernels: dict[str, Kernel] = {}

    @property
    def kernel_names(self) -> list[str]:
        return list(self._params)

    def get_function(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            if name not in self._params:
                raise drv.CudaUsageError(f"cuda: no kernel {name!r} in this module; it defines "
                                         f"{self.kernel_names}")
            handle = drv.call(drv.load().cuModuleGetFunction, self.handle, name.encode(), kernel=name)
            kernel = self._kernels[name] = Kernel(self, name, int(handle), self._params[name])
        return kernel


class ProgramModule:
    """A program's kernels, each in the module of its own PTX."""

    def __init__(self, modules: dict[str, Module]):
        self._modules = modules

    @property
    def kernel_names(self) -> list[str]:
        return list(self._modules)

    def get_function(self, name: str) -> Kernel:
        module = self._modules.get(name)
        if module is None:
            raise drv.CudaUsageError(f"cuda: no kernel {name!r} in this program; it has {self.kernel_names}")
        return module.get_function(name)


def whole_program(ptx: str) -> bool:
    """Whether a kernel's PTX is compiled as a whole program, not as relocatable code that the
    driver's linker then links: the warpgroup kernels (they trade registers with `setmaxnreg`),
    where ptxas allocates registers worse in relocatable code (348 bytes of the flash dk/dv
    kernel's spilled; none as a whole program). Every other kernel is linked: the same kernels
    as whole programs, loaded by `cuModuleLoadDataEx` or from ptxas, made the MLP loop's step
    (12 small kernels, on an H100) take 31 us instead of 17, and one stream's consecutive
    launches stop overlapping under programmatic dependent launch (72 us against 22), though
    each kernel alone takes as long and their SASS is the same (the cause is not known)."""
    return _SETMAXNREG.search(ptx) is not None


_SETMAXNREG = re.compile(r"^\s*setmaxnreg\.", re.MULTILINE)


def _jit_log(errors: bytearray) -> str:
    """What the driver's JIT wrote into its error log buffer, as an error's detail."""
    told = bytes(errors).split(b"\0", 1)[0].decode(errors="replace").strip()
    return f"JIT log:\n{told}" if told else ""


class ModuleCache:
    """Loaded modules of one context, by PTX."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._modules: dict[bytes, Module] = {}
        self._lock = threading.Lock()
        self.counts = {"memory_hits": 0, "loads": 0}

    def key(self, ptx: str) -> bytes:
        return digest("cuda module", self.ctx.device.arch, str(drv.version()), ptx)

    def load(self, ptx: str | ProgramPtx, name: str = "glue",
             stats: dict[str, KernelStats] | None = None) -> Module | ProgramModule:
        """The module for `ptx` (for a program's PTX, one per kernel), compiling and loading
        each only the first time; `stats` receives each kernel's JIT seconds."""
        if isinstance(ptx, str):
            return self._load_all({name: ptx}, {})[name]
        return ProgramModule(self._load_all(ptx.modules, {} if stats is None else stats))

    def _load_all(self, sources: dict[str, str], stats: dict[str, KernelStats]) -> dict[str, Module]:
        with self._lock:
            keys = {symbol: self.key(ptx) for symbol, ptx in sources.items()}
            modules = {symbol: self._modules.get(key) for symbol, key in keys.items()}
            missing = [symbol for symbol, module in modules.items() if module is None]
            self.counts["memory_hits"] += len(modules) - len(missing)
            self.counts["loads"] += len(missing)
            for symbol, (handle, steps) in zip(missing, self._load_each([(sources[s], s) for s in missing])):
                modules[symbol] = self._modules[keys[symbol]] = Module(self.ctx, handle, sources[symbol],
                                                                       keys[symbol])
                if symbol in stats:
                    for step, seconds in steps.items():
                        stats[symbol].add(step, seconds)
            return modules

    def _load_each(self, jobs: list[tuple[str, str]]) -> list[tuple[int, dict[str, float]]]:
        """Modules of (ptx, name) pairs, several compiles at a time when there are several."""
        threads = min(len(jobs), worker_count())
        if threads <= 1:
            return [self._load(ptx, name) for ptx, name in jobs]
        with ThreadPoolExecutor(threads, thread_name_prefix="glue-jit") as pool:
            return list(pool.map(lambda job: self._load(*job), jobs))

    def _load(self, ptx: str, name: str) -> tuple[int, dict[str, float]]:
        """The module of one kernel's PTX and the seconds each step of making it took: machine
        code from ptxas (`cuda_ptxas`) or the disk cache where there is some, else the driver's
        JIT."""
        steps: dict[str, float] = {}
        code = self._cubin(ptx, name, steps) if config.cuda_ptxas and ptxas_available() else None
        start = time.perf_counter()
        handle = self._load_code(code, name) if code else None
        if handle is not None:
            steps["module load"] = time.perf_counter() - start
            return handle, steps
        start = time.perf_counter()
        with profiler.span("compile", f"driver jit {name}"):
            handle = self._jit(ptx, name)
        steps["driver jit"] = time.perf_counter() - start
        return handle, steps

    def _cubin(self, ptx: str, name: str, steps: dict[str, float]) -> bytes | None:
        """ptxas's machine code for `ptx` (as `whole_program` says: a whole program, or
        relocatable code the driver's linker links), from the disk cache or made now (and kept
        there); None where ptxas or the linker refuses it (the driver's JIT then reports why).
        It is compiled for the arch the PTX targets: on an H100 that is sm_90a, which the
        device's own name (sm_90) would make ptxas refuse."""
        arch = ptx_target(ptx) or self.ctx.device.arch
        whole = whole_program(ptx)
        key = digest("cuda cubin", arch, ptxas_version(), f"whole program {whole}", ptx)
        start = time.perf_counter()
        code = DISK.load(key)
        steps["cubin cache"] = time.perf_counter() - start
        if code is not None:
            return code
        start = time.perf_counter()
        with profiler.span("compile", f"ptxas {name}"):
            try:
                code = cubin(ptx, arch, relocatable=not whole)
                if not whole:
                    code = self._link(drv.load().CUjitInputType.CU_JIT_INPUT_CUBIN, code, name)
            except BackendError as exc:  # (a CudaError too: a linker that refuses ptxas's code)
                log.info("glue.cuda: ptxas's code for %s did not build (%s); the driver's JIT compiles the PTX",
                         name, exc)
                return None
        steps["ptxas"] = time.perf_counter() - start
        DISK.store(key, code)
        return code

    def _load_code(self, code: bytes, name: str) -> int | None:
        """A module of machine code, or None where this driver will not load it (ptxas newer
        than the driver): the PTX then goes to the driver's JIT."""
        self.ctx.make_current()
        result = drv.load().cuModuleLoadData(code)
        if result[0]:
            log.info("glue.cuda: the driver did not load ptxas's code for %s (%s); its JIT compiles the PTX",
                     name, drv.error_for("cuModuleLoadData", result[0]))
            return None
        return int(result[1])

    def _jit(self, ptx: str, name: str) -> int:
        """PTX compiled by the driver's JIT and loaded, as `whole_program` says: a whole
        program, or relocatable code its linker links; a failure carries ptxas's error log."""
        driver = drv.load()
        self.ctx.make_current()
        data = ptx.encode() + b"\0"
        if not whole_program(ptx):
            return int(drv.call(driver.cuModuleLoadData, self._link(driver.CUjitInputType.CU_JIT_INPUT_PTX, data, name),
                                kernel=name))
        opt = driver.CUjit_option
        errors = bytearray(_LOG_BYTES)  # must outlive the call: the driver writes into it
        result = driver.cuModuleLoadDataEx(data, 2, [opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES],
                                           [errors, _LOG_BYTES])
        if result[0]:
            raise drv.error_for("cuModuleLoadDataEx", result[0], name, _jit_log(errors))
        return int(result[1])

    def _link(self, kind: Any, data: bytes, name: str) -> bytes:
        """The executable machine code the driver's linker makes of one input (`kind`: PTX,
        which its JIT compiles as relocatable code first, or ptxas's relocatable cubin)."""
        driver = drv.load()
        self.ctx.make_current()
        opt = driver.CUjit_option
        errors = bytearray(_LOG_BYTES)  # must outlive the link state: the driver writes into it
        state = drv.call(driver.cuLinkCreate, 2, [opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES],
                         [errors, _LOG_BYTES])
        try:
            call, result = "cuLinkAddData", driver.cuLinkAddData(state, kind, data, len(data), name.encode(),
                                                                 0, None, None)
            if not result[0]:
                call, result = "cuLinkComplete", driver.cuLinkComplete(state)
            if result[0]:
                raise drv.error_for(call, result[0], name, _jit_log(errors))
            return ctypes.string_at(int(result[1]), result[2])
        finally:
            driver.cuLinkDestroy(state)
