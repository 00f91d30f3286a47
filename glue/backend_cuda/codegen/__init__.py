"""Kernel IR -> LLVM IR for the NVPTX target: one module per distinct kernel of a program.

`build_program(plan)` maps each kernel onto the GPU by its class (`pointwise.py`, `rows.py`,
`contraction.py`, `data.py`; `common.py` holds what they share) and records how to launch it:
grid, block, and the memory place of each pointer parameter. A contraction may also, or
instead, be served by cuBLASLt (`library.py`): its launches then form the variant "library" of
that plan kernel beside the variant "codegen" (and a TF32 weight gradient's "library kmajor",
which copies an operand first), and the executor runs one (`glue.config.gemm` forces glue's or
the library's; "auto" races them). Each kernel declares its block size as its launch bound
(`.maxntid`), which lets ptxas budget registers for exactly that many threads. A column
reduction split over blocks (`columns.py`) claims working memory: its stream's scratch region
and zeroed counters of its own, passed as parameters after its operands. A call kernel (control
flow, a print) is a launch without a grid holding its plan; its bodies are lowered as programs
of their own (see steps.py).

Kernels are code by their structural key (`glue.backend.kernel_key`: the kernel IR up to names,
the aliasing of its operands, which inputs are constant arguments, the arch and the settings
the emitters read): the launches of identical kernels (a model's layers) share one
`DeviceKernel`, its symbol made of its first fused ops and its key. A kernel's code is found in
this process's memory, in the disk cache (its PTX and how it launches, so a warm start emits no
LLVM at all), or else emitted into a module of its own and compiled by the compile workers. A
program's first two new kernels are emitted here, each sent to the workers (`ptx.py`'s job) as
soon as it is emitted; once the workers run, and there are EMITTING_WORKERS of them, a worker
emits each later one as well as compiling it (`emit_and_compile`, a "call" job: emitting is
Python, one kernel at a time in this process), and its launch shape is filled in when the
program is built. The "ptx" stage waits for them.
"""
from __future__ import annotations

import json
import logging
import re
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable

import llvmlite
from llvmlite import ir

from glue.backend import llvm_jobs
from glue.backend.cache import DiskCache, code_version, digest
from glue.backend.contract import KernelStats
from glue.backend.kernel_key import ByStructure, KernelKeys, aliases
from glue.backend.workers import Jobs, worker_count
from glue.backend_cuda import cublaslt
from glue.backend_cuda.codegen.columns import ColumnPlan, columns_fit, emit_columns
from glue.backend_cuda.codegen.common import TENSOR_MAP_ARG, KernelEmitter, Launch, Place
from glue.backend_cuda.codegen.contraction import emit_contraction
from glue.backend_cuda.codegen.data import emit_data
from glue.backend_cuda.codegen.flash import PARTS, emit_flash, flash_spec
from glue.backend_cuda.codegen.flash_hopper import emit_hopper_flash, hopper_flash_plan, row_values_bytes
from glue.backend_cuda.codegen.hopper import TensorMap
from glue.backend_cuda.codegen.library import (LIBRARY_VARIANTS, kmajor_copy_side, library_launches, library_only,
                                               scratch_bytes)
from glue.backend_cuda.codegen.pointwise import emit_pointwise
from glue.backend_cuda.codegen.rows import emit_rows
from glue.backend_cuda.codegen.wgmma import emit_wgmma, raced_tilings, tf32_copies, tiling_name, wgmma_plan
from glue.backend_cuda.ptx import DEFAULT_ARCH, ProgramPtx, checked, ptx_job
from glue.codegen.scope import Analysis
from glue.errors import BackendError
from glue.ir import Graph, TensorType
from glue.scheduler.calls import call_plan
from glue.scheduler.gemm import GemmSpec, gemm_spec, operand_kernel, product_of_written
from glue.scheduler.kernel_ir import Kernel
from glue.scheduler.memory import Placement
from glue.scheduler.plan import Plan, Result
from glue.settings import config

log = logging.getLogger("glue")


@dataclass(frozen=True)
class KernelShape:
    """How a distinct kernel launches, as its emitter decided: a 1-d grid of `grid` blocks of
    `block` threads; `dependent`: it waits for its producers itself (may launch early);
    `min_blocks`: blocks that must fit on a multiprocessor (0: no floor); `shared_bytes`: the
    dynamic shared memory it is launched with."""

    grid: int
    block: int
    strategy: str
    dependent: bool = False
    min_blocks: int = 0
    shared_bytes: int = 0
    tensor_maps: tuple[TensorMap, ...] = ()  # TMA descriptors it takes after its pointers
    max_registers: int = 0             # a thread's registers at launch, fixed (0: as ptxas finds)
    cluster: int = 0                   # blocks a cluster, fixed when compiled (0: no clusters)

    def facts(self) -> dict[str, Any]:
        """Its fields as JSON values (the disk cache's record)."""
        return {**vars(self), "tensor_maps": [vars(m) for m in self.tensor_maps]}

    @staticmethod
    def from_facts(facts: dict[str, Any]) -> "KernelShape":
        maps = tuple(TensorMap(**{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()})
                     for m in facts.get("tensor_maps", ()))
        return KernelShape(**{**facts, "tensor_maps": maps})


@dataclass(frozen=True)
class _Recipe:
    """What a kernel's module is emitted from: the first launch of its code."""

    kernel: Kernel
    symbol: str
    inputs: tuple[Place, ...]
    outputs: tuple[Place, ...]
    arch: str
    written: frozenset[Place]
    columns: bool = False              # a reduction over columns (columns.py), not rows
    extra: tuple[Place, ...] = ()      # its working memory, when split over blocks
    aligned: bool = True               # operands start 16-byte aligned (else no vector access)
    part: str = ""                     # an attention kernel: which flash kernel (flash.PARTS)
    opt_level: int = 3                 # of the LLVM pipeline that compiles it
    tiling: tuple[int, int] | None = None  # a warpgroup contraction's raced tiling (wgmma.raced_tilings)

    def emit(self) -> tuple[str, KernelShape]:
        module = ir.Module(name=self.symbol)
        places = tuple(dict.fromkeys(self.inputs + self.outputs + self.extra))
        warpgroups = wgmma_plan(self.kernel, places, self.inputs, self.arch, self.aligned, may_split=bool(self.extra),
                                tiling=self.tiling) if self.kernel.kind == "contraction" else None
        hopper_flash = hopper_flash_plan(self.kernel.call, self.part, places, self.inputs, self.arch, self.aligned) \
            if self.kernel.kind == "attention" else None
        on_warpgroups = warpgroups or hopper_flash  # (at most one applies: a contraction, or attention)
        maps = on_warpgroups.tensor_maps if on_warpgroups is not None else ()
        ke = KernelEmitter(module, self.kernel, self.symbol, list(self.inputs), list(self.outputs), self.arch,
                           self.written, list(self.extra), self.aligned, len(maps))
        if self.columns:
            shape = emit_columns(ke, ColumnPlan(self.kernel, ke.analysis, self.arch))
        elif warpgroups is not None:
            shape = emit_wgmma(ke, warpgroups)
        elif hopper_flash is not None:
            shape = emit_hopper_flash(ke, hopper_flash)
        elif self.kernel.kind == "attention":
            shape = emit_flash(ke, flash_spec(self.kernel.call), self.part)
        else:
            shape = emit_contraction(ke) if self.kernel.kind == "contraction" else None
            if shape is None:
                shape = _EMIT.get(self.kernel.kind, emit_rows)(ke)
        facts = KernelShape(*shape, ke.awaited, ke.min_blocks, ke.dynamic_shared_bytes, maps, ke.max_registers,
                            ke.cluster)
        return _grid_constants(_launch_bounds(str(module), self.symbol, facts), len(maps)), facts


@dataclass(eq=False)
class DeviceKernel:
    """One distinct kernel's device code: its symbol, how it launches, its PTX once compiled
    (from the disk cache, or by `ptx.py`), and how to emit its LLVM module."""

    key: bytes
    symbol: str
    kind: str
    shape: KernelShape | None  # None while a compile worker emits it (`resolve`)
    recipe: _Recipe
    ptx: str | None = None
    _llvm_ir: str | None = field(default=None, repr=False)
    compiling: Future | None = field(default=None, repr=False)  # its PTX job, once submitted

    @property
    def llvm_ir(self) -> str:
        """Its LLVM module (emitted again when the code came from a cache)."""
        self.resolve()
        if self._llvm_ir is None:
            self._llvm_ir = self.recipe.emit()[0]
        return self._llvm_ir

    def resolve(self) -> None:
        """Take the module and launch shape a compile worker emitted (the job then holds the
        PTX job's result, for `compile_ptx`); if the job failed (a kernel too deep to pickle, a
        worker gone), emit and compile it here, where an emitter's error is raised as it is."""
        if self.shape is not None:
            return
        try:
            text, facts, ptx, seconds = self.compiling.result()
        except Exception:  # noqa: BLE001 - whatever failed there, the work is done here instead
            text, facts, ptx, seconds = emit_and_compile(self.recipe, {})
        self.shape, self._llvm_ir = KernelShape(**facts), text
        done: Future = Future()
        done.set_result((ptx, seconds))
        self.compiling = done


def emit_and_compile(recipe: _Recipe, settings: dict[str, Any]) -> tuple[str, dict, str, dict[str, float]]:
    """A kernel's module, its launch shape, its PTX and the seconds of each step: the job a
    compile worker runs for a kernel this process does not emit itself (`settings`: the
    parent's emitter settings, CODEGEN_SETTINGS)."""
    with config.override(**settings):
        start = time.perf_counter()
        text, shape = recipe.emit()
        built = time.perf_counter() - start
    name, args = ptx_job(text, recipe.arch, recipe.opt_level)
    ptx, seconds = llvm_jobs.JOBS[name](*args)
    return text, vars(shape), ptx, {**seconds, "llvm build": built}


@dataclass
class CudaProgram:
    plan: Plan
    launches: list[Launch]
    arch: str = DEFAULT_ARCH
    scratch: tuple[int, ...] = ()  # bytes of each stream's scratch region (library operands, partials)
    kernels: dict[str, DeviceKernel] = field(default_factory=dict)  # by symbol, each distinct kernel once
    counters: int = 0              # bytes of zeroed counters (column reductions' last-block counts)
    bodies: dict[int, list[Any]] = field(default_factory=dict)  # call kernel -> its bodies' lowerings
    keys: KernelKeys = field(default_factory=KernelKeys)  # the kernels' structural keys, memoised

    @property
    def arena_bytes(self) -> int:
        return self.plan.memory.arena_bytes

    @cached_property
    def by_group(self) -> dict[int, list[Launch]]:
        """Each plan kernel's launches, every variant's, in order."""
        groups: dict[int, list[Launch]] = {}
        for launch in self.launches:
            groups.setdefault(launch.group, []).append(launch)
        return groups

    # (read for every parameter of every launch as its steps are planned: computed once)
    @cached_property
    def arg_types(self) -> list[TensorType]:
        return self.plan.argument_types

    @cached_property
    def output_types(self) -> list[TensorType]:
        return self.plan.output_types

    @property
    def results(self) -> list[Result]:
        return self.plan.results()

    def llvm_modules(self) -> dict[str, str]:
        """Each distinct kernel's LLVM module, by symbol."""
        return {symbol: k.llvm_ir for symbol, k in self.kernels.items()}

    @property
    def llvm_ir(self) -> str:
        """Every distinct kernel's module, each headed by the launches that run it."""
        users: dict[str, list[str]] = {symbol: [] for symbol in self.kernels}
        for launch in self.launches:
            if launch.symbol in users:
                users[launch.symbol].append(f"{launch.group}:{launch.kernel.name}")
        return "\n".join(f"; kernel {symbol}, launched for plan kernels {', '.join(users[symbol])}\n{k.llvm_ir}"
                         for symbol, k in self.kernels.items())


# Workers from which they emit kernels too: each first imports glue (a second or two), and
# with few workers this process emitting beside them is faster (2 on the 2-core dev VM: the
# small step's cold lowering 9.3-10.1 s with, 13.3-13.9 s without, the machine loaded).
EMITTING_WORKERS = 4
_EMIT = {"pointwise": emit_pointwise, "data": emit_data, "reduction": emit_rows}
DISK = DiskCache("cuda-ptx")
# Emitter settings (rows.py, contraction.py): part of every kernel's key.
CODEGEN_SETTINGS = ("cuda_online_row_elements", "cuda_tensor_cores", "cuda_wgmma", "cuda_mma_tile")
_known: "weakref.WeakValueDictionary[bytes, DeviceKernel]" = weakref.WeakValueDictionary()


def _place(p: Placement) -> Place:
    if p.kind == "arena":
        return Place("arena", 0, p.slot)
    return Place("output" if p.kind == "output" else "argument", p.slot)


def _symbol(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _launch_bounds(llvm_ir: str, symbol: str, shape: KernelShape) -> str:
    """Declare the kernel's block size (`.maxntid`), and where its emitter asks, the blocks that
    must fit on a multiprocessor (`.minnctapersm`), a thread's registers (`.maxnreg`) and the
    blocks of a cluster (`.reqnctapercluster`: a plain launch then forms the clusters); llvmlite
    cannot attach string attributes."""
    bounds = f'"nvvm.maxntid"="{shape.block}"'
    if shape.min_blocks:
        bounds += f' "nvvm.minctasm"="{shape.min_blocks}"'
    if shape.max_registers:
        bounds += f' "nvvm.maxnreg"="{shape.max_registers}"'
    if shape.cluster:
        bounds += f' "nvvm.cluster_dim"="{shape.cluster},1,1"'
    header = re.compile(rf'^(define ptx_kernel void @"{symbol}"\(.*\))$', re.M)
    return header.sub(lambda m: f'{m.group(1)} {bounds}', llvm_ir, count=1)


def _grid_constants(llvm_ir: str, count: int) -> str:
    """Declare the tensor-map parameters as what they are: 128 bytes by value, 64-byte aligned,
    read in place in parameter space (`nvvm.grid_constant`: a TMA load names the parameter's
    own address); llvmlite cannot spell these attributes."""
    for i in range(count):
        llvm_ir = llvm_ir.replace(f'ptr %"{TENSOR_MAP_ARG}{i}"',
                                  f'ptr byval([128 x i8]) align 64 "nvvm.grid_constant" %"{TENSOR_MAP_ARG}{i}"', 1)
    return llvm_ir


def _disk_key(key: bytes) -> bytes:
    return digest("cuda kernel ptx", key)


def _stored(key: bytes, recipe: _Recipe) -> DeviceKernel | None:
    """The kernel's PTX and launch shape from the disk cache, or None."""
    payload = DISK.load(_disk_key(key))
    if payload is None:
        return None
    head, _, ptx = payload.partition(b"\n")
    try:
        facts = json.loads(head)
        shape = KernelShape.from_facts(facts["shape"])
        return DeviceKernel(key, facts["symbol"], recipe.kernel.kind, shape, recipe, ptx.decode())
    except (ValueError, KeyError, TypeError):
        return None


def _store(kernel: DeviceKernel) -> None:
    """Put a compiled kernel (its PTX) in the disk cache and in this process's memory."""
    facts = {"symbol": kernel.symbol, "shape": kernel.shape.facts()}
    DISK.store(_disk_key(kernel.key), json.dumps(facts).encode() + b"\n" + kernel.ptx.encode())
    _known[kernel.key] = kernel


def compile_ptx(program: CudaProgram, opt_level: int, stats: dict[str, KernelStats]) -> ProgramPtx:
    """The PTX of every distinct kernel of `program`: what the caches held, and the rest
    compiled side by side (the compile workers) and stored."""
    missing = [k for k in program.kernels.values() if k.ptx is None]
    unsent = [k for k in missing if k.compiling is None]
    jobs = Jobs(len(unsent)) if unsent else None
    for k in unsent:
        k.compiling = jobs.submit(*ptx_job(k.llvm_ir, program.arch, opt_level), label=k.symbol)
    futures = [(k, k.compiling) for k in missing]
    for kernel, future in futures:
        try:
            ptx, seconds = future.result()
        except RuntimeError as exc:
            raise BackendError(f"cuda: invalid LLVM IR for the NVPTX target in {kernel.symbol}: {exc}") from None
        kernel.ptx = checked(ptx)
        for step, spent in seconds.items():
            stats[kernel.symbol].add(step, spent)
        start = time.perf_counter()
        _store(kernel)
        stats[kernel.symbol].add("disk cache", time.perf_counter() - start)
    for kernel in program.kernels.values():
        _known[kernel.key] = kernel
    return ProgramPtx({symbol: k.ptx for symbol, k in program.kernels.items()})


class _Memory:
    """The working memory kernels of a program claim besides their operands: each stream's
    scratch region (sized by its largest claim: kernels of one stream run one after another)
    and the program's zeroed counters (each claim its own)."""

    def __init__(self) -> None:
        self.scratch: dict[int, int] = {}
        self.counters = 0

    def claim_scratch(self, stream: int, nbytes: int, at: int = 0) -> Place:
        """`nbytes` of stream `stream`'s region from byte `at` (past what the launches before it
        in the same plan kernel hand on)."""
        self.scratch[stream] = max(self.scratch.get(stream, 0), at + nbytes)
        return Place("scratch", stream, at)

    def claim_counters(self, nbytes: int) -> Place:
        place = Place("counters", 0, self.counters)
        self.counters += -(-nbytes // 256) * 256
        return place

    def regions(self) -> tuple[int, ...]:
        return tuple(self.scratch.get(s, 0) for s in range(max(self.scratch, default=-1) + 1))


class _Builder:
    """Finds or emits the code of each launch of one program."""

    def __init__(self, arch: str, opt_level: int, written: frozenset[Place], stats: dict[str, KernelStats],
                 aligned: bool = True):
        self.arch, self.aligned = arch, aligned
        self.written = written
        self.stats = stats
        settings = ",".join(f"{name}={config.read(name)!r}" for name in CODEGEN_SETTINGS)
        self.context = ("cuda kernel", code_version(), arch, f"opt_level={opt_level}", f"aligned={aligned}",
                        f"llvmlite {llvmlite.__version__}", settings)
        self.kernels: dict[str, DeviceKernel] = {}
        self.keys = KernelKeys()  # a model's layers share their kernels' expressions: keyed once
        self.plans = ByStructure()  # and so their column and warpgroup plans: planned once
        self._by_key: dict[bytes, DeviceKernel] = {}
        self.opt_level = opt_level
        self.settings = {name: config.read(name) for name in CODEGEN_SETTINGS}  # for the workers' emitters
        self._jobs: Jobs | None = None
        self._unsent: list[DeviceKernel] = []

    def _send(self, kernel: DeviceKernel) -> None:
        """Start compiling a kernel just emitted, so that LLVM optimises it in a compile worker
        while this process emits the next one. A program's first one waits for a second (a lone
        kernel compiles in this process, with no worker to start: `compile_ptx` sends it)."""
        self._unsent.append(kernel)
        if self._jobs is None and len(self._unsent) < 2:
            return
        if self._jobs is None:
            self._jobs = Jobs(len(self._unsent))
        for k in self._unsent:
            k.compiling = self._jobs.submit(*ptx_job(k.llvm_ir, self.arch, self.opt_level), label=k.symbol)
        self._unsent.clear()

    def code(self, kernel: Kernel, inputs: list[Place], outputs: list[Place], columns: bool = False,
             extra: tuple[Place, ...] = (), part: str = "", tiling: tuple[int, int] | None = None) -> DeviceKernel:
        constant = sorted(i for i, p in enumerate(inputs) if p.kind == "argument" and p not in self.written)
        label = _symbol("_".join(kernel.ops[:5]) + (f"_{part}" if part else ""))[:60]
        # an attention kernel is its equation's facts (flash_spec), not the equation's variables
        keyed, what = (replace(kernel, call=None), repr(flash_spec(kernel.call))) if part else (kernel, "")
        key = self.keys(keyed, aliases(inputs + outputs + list(extra)), *self.context, f"constant inputs {constant}",
                         f"columns={columns} working memory {len(extra)} tiling {tiling}", label, what)
        found = self._by_key.get(key)
        if found is not None:
            return found
        recipe = _Recipe(kernel, f"glue_{label}_{key.hex()[:16]}", tuple(inputs), tuple(outputs), self.arch,
                         self.written, columns, extra, self.aligned, part, self.opt_level, tiling)
        start = time.perf_counter()
        found, source = _known.get(key), "memory"
        if found is None:
            found, source = _stored(key, recipe), "disk"
        cached = time.perf_counter()
        remote = found is None and self._jobs is not None and self._jobs.parallel and \
            worker_count() >= EMITTING_WORKERS
        if remote:
            # Emitting is Python, one kernel at a time here: a worker emits it (and compiles
            # it) while this process goes on to the next; its launch shape comes at the end.
            found, source = DeviceKernel(key, recipe.symbol, kernel.kind, None, recipe), "built"
            found.compiling = self._jobs.submit("call", (__name__, "emit_and_compile", (recipe, self.settings)),
                                                label=recipe.symbol)
        elif found is None:
            text, shape = recipe.emit()
            found, source = DeviceKernel(key, recipe.symbol, kernel.kind, shape, recipe, None, text), "built"
        built = time.perf_counter()
        stats = self.stats.setdefault(found.symbol, KernelStats(found.symbol, kernel.kind, 0, source))
        stats.add("disk cache" if source == "disk" else "memory cache", cached - start)
        if source == "built" and not remote:  # (a worker's job counts its own "llvm build")
            stats.add("llvm build", built - cached)
            self._send(found)
        self._by_key[key] = self.kernels[found.symbol] = found
        return found

    def _launch(self, code: DeviceKernel, kernel: Kernel, params: tuple[Place, ...], group: int,
                copy: tuple[Place, Place, int] | None = None) -> Launch:
        """A launch of `code`; while a worker emits it, one whose shape `resolved` fills in."""
        self.stats[code.symbol].uses += 1
        shape = code.shape or KernelShape(-1, 0, "")
        return Launch(code.symbol, kernel, shape.grid, shape.block, params, shape.strategy, copy, shape.dependent,
                      shape.min_blocks, group, shared_bytes=shape.shared_bytes, tensor_maps=shape.tensor_maps)

    def resolved(self, launch: Launch) -> Launch:
        """`launch` with its kernel's launch shape, once the worker emitting it has."""
        if launch.grid != -1:
            return launch
        code = self.kernels[launch.symbol]
        code.resolve()
        shape = code.shape
        return replace(launch, grid=shape.grid, block=shape.block, strategy=shape.strategy,
                       dependent=shape.dependent, min_blocks=shape.min_blocks, shared_bytes=shape.shared_bytes,
                       tensor_maps=shape.tensor_maps)

    def launch(self, kernel: Kernel, inputs: list[Place], outputs: list[Place], group: int,
               memory: _Memory | None = None, stream: int = 0, scratch_from: int = 0,
               tiling: tuple[int, int] | None = None) -> Launch:
        """A launch of glue's own kernel over these places (a column reduction, or a warpgroup
        contraction splitting K, claims working memory from `memory`, on `stream`, from byte
        `scratch_from` of its scratch region; without it, a column reduction reduces by rows,
        and a contraction does not split); a warpgroup contraction's in `tiling` where given."""
        columns, extra = False, ()
        if kernel.kind == "reduction" and memory is not None and self.aligned:
            plan = self.plans.get(kernel, lambda: ColumnPlan(kernel, Analysis(), self.arch)
                                  if columns_fit(kernel, Analysis()) else None)
            columns = plan is not None
            if columns and plan.scratch_bytes:
                extra = (memory.claim_scratch(stream, plan.scratch_bytes, scratch_from),
                         memory.claim_counters(plan.counter_bytes))
        elif kernel.kind == "contraction" and memory is not None:
            places = tuple(dict.fromkeys(inputs + outputs))
            split = self.plans.get(kernel, lambda: wgmma_plan(kernel, places, tuple(inputs), self.arch, self.aligned,
                                                              may_split=True, tiling=tiling),
                                   aliases(inputs + outputs), tiling)
            if split is not None and split.splits > 1:
                extra = (memory.claim_scratch(stream, split.partial_bytes, scratch_from),
                         memory.claim_counters(split.counter_bytes))
        code = self.code(kernel, inputs, outputs, columns, extra, tiling=tiling)
        copy = None
        if kernel.init is not None and inputs[kernel.init] != outputs[0]:
            copy = (outputs[0], inputs[kernel.init], kernel.outputs[0].type.nbytes)
        return self._launch(code, kernel, tuple(dict.fromkeys(inputs + outputs + list(extra))), group, copy)

    def contraction_launches(self, spec: GemmSpec | None, kernel: Kernel, inputs: list[Place],
                             outputs: list[Place], group: int, memory: _Memory, stream: int, symbol: str
                             ) -> list[Launch]:
        """glue's own launches of contraction kernel `group` (the variant "codegen"): its kernel;
        or, for a float32 product on TF32 whose operands the warpgroup kernel cannot read in
        place (`tf32_copies`), first a kernel writing each such operand K-major into the
        stream's scratch region, then the warpgroup kernel reading them there. With
        `config.autotune`, each other tiling of a warpgroup product worth racing
        (`raced_tilings`) is a variant of its own ("codegen 128x192", ...), raced with the rest."""
        product, read, copies, scratch_from = kernel, inputs, [], 0
        sides = tf32_copies(spec, self.arch)
        if sides:
            written = product_of_written(spec, sides)
            operands = [operand_kernel(spec, side, symbol, transposed=side == "b") for side in sides]
            places, offset = [], 0
            for operand in operands:
                places.append(Place("scratch", stream, offset))
                offset += scratch_bytes(operand.outputs[0].type)
            if wgmma_plan(written, tuple(dict.fromkeys(inputs + places + outputs)), tuple(inputs + places), self.arch,
                          self.aligned, may_split=True):
                memory.claim_scratch(stream, offset)
                copies = [self.launch(operand, inputs, [place], group) for operand, place in zip(operands, places)]
                product, read, scratch_from = written, inputs + places, offset
        launches = copies + [self.launch(product, read, outputs, group, memory, stream, scratch_from)]
        if not config.autotune:
            return launches
        for tiling in raced_tilings(product, tuple(dict.fromkeys(read + outputs)), tuple(read), self.arch,
                                    self.aligned):
            variant = f"codegen {tiling_name(tiling)}"
            tiled = self.launch(product, read, outputs, group, memory, stream, scratch_from, tiling)
            launches += [replace(launch, variant=variant) for launch in copies + [tiled]]
        return launches

    def flash_launches(self, kernel: Kernel, inputs: list[Place], outputs: list[Place], group: int,
                       memory: _Memory, stream: int) -> list[Launch]:
        """The launches of an attention kernel (flash.py): the forward, or the backward's two,
        which pass each row's delta through the stream's scratch region. `inputs` are in the
        equation's operand order."""
        eqn = kernel.call
        extra = ()
        if eqn.primitive == "attention_bwd":
            # each query's (lse, delta) pair (flash_hopper.py), room for its delta too (flash.py)
            extra = (memory.claim_scratch(stream, row_values_bytes(flash_spec(eqn))),)
        launches = []
        for part in PARTS[eqn.primitive]:
            code = self.code(kernel, inputs, outputs, extra=extra, part=part)
            launches.append(self._launch(code, kernel, tuple(dict.fromkeys(inputs + outputs + list(extra))), group))
        return launches


def gemm_variants(spec: GemmSpec | None, choice: str = "auto") -> tuple[str, ...]:
    """Who may serve a contraction: glue's own kernel ("codegen"), cuBLASLt ("library", and
    "library kmajor" where `kmajor_copy_side` finds an operand to copy), or several (then the
    executor races them), as `choice` (the backend's `gemm` option) says and the library can;
    a large float32 product the library serves alone unless `choice` is "codegen" (`library_only`)."""
    if spec is None or choice == "codegen":
        return ("codegen",)
    why_not = "nvmath-python is not installed" if not cublaslt.available() else cublaslt.can_serve(spec)
    if why_not:
        if choice == "library":
            _note_once(f"glue.cuda: a contraction runs on glue's own kernels although GLUE_GEMM=library: {why_not}")
        elif not cublaslt.available():
            _note_once("glue.cuda: contractions run on glue's own kernels (install the 'cuda' extra, "
                       "nvmath-python, for cuBLASLt)")
        return ("codegen",)
    library = LIBRARY_VARIANTS if kmajor_copy_side(spec) else LIBRARY_VARIANTS[:1]
    return library if choice == "library" or library_only(spec) else ("codegen",) + library


_NOTED: set[str] = set()


def _note_once(message: str) -> None:
    if message not in _NOTED:
        _NOTED.add(message)
        log.info(message)


def build_program(plan: Plan, name: str = "fn", arch: str = DEFAULT_ARCH, gemm: str = "auto",
                  opt_level: int = 3, stats: dict[str, KernelStats] | None = None,
                  lower_body: Callable[[Graph], Any] | None = None, aligned: bool = True) -> CudaProgram:
    """The launches of `plan`'s kernels for `arch` (and of each contraction's library variant),
    each distinct kernel's code found or emitted once; `stats` receives each distinct kernel's
    source and timings. `lower_body` lowers each body of a call kernel as a program of its own;
    `aligned` False: operands may start anywhere (a body's slices), so no kernel accesses 16 bytes
    at once."""
    placements = plan.memory.placements
    launches: list[Launch] = []
    memory = _Memory()
    bodies: dict[int, list[Any]] = {}
    written = frozenset(_place(placements[b.value_id]) for kernel in plan.kernels for b in kernel.outputs)
    builder = _Builder(arch, opt_level, written, {} if stats is None else stats, aligned)
    for i, kernel in enumerate(plan.kernels):
        inputs = [_place(placements[b.value_id]) for b in kernel.inputs]
        outputs = [_place(placements[b.value_id]) for b in kernel.outputs]
        symbol = f"glue_{_symbol(name)}_{i}_{_symbol(kernel.name)}"[:120]
        if kernel.kind == "attention":
            ordered = [_place(placements[a.id]) for a in kernel.call.inputs]
            launches += builder.flash_launches(kernel, ordered, outputs, i, memory, plan.streams.streams[i])
            continue
        if kernel.call is not None:
            if lower_body is None:
                raise ValueError(f"build_program: {kernel.name} is a call kernel, which needs lower_body")
            call = call_plan(kernel)
            launches.append(Launch(symbol, kernel, 0, 0, tuple(inputs + outputs), "call", group=i, call=call))
            bodies[i] = [lower_body(body) for body in call.bodies]
            continue
        stream = plan.streams.streams[i]
        spec = gemm_spec(kernel) if kernel.kind == "contraction" else None
        variants = gemm_variants(spec, gemm)
        if "codegen" in variants and kernel.kind == "contraction":
            launches += builder.contraction_launches(spec, kernel, inputs, outputs, i, memory, stream, symbol)
        elif "codegen" in variants:
            launches.append(builder.launch(kernel, inputs, outputs, i, memory, stream))
        def emit(k: Kernel, ins: list[Place], outs: list[Place], _symbol: str) -> Launch:
            return builder.launch(k, ins, outs, i)

        for variant in variants:
            if variant in LIBRARY_VARIANTS:
                served, need = library_launches(spec, i, symbol, inputs, outputs, stream, emit, variant)
                launches += served
                memory.claim_scratch(stream, need)
    launches = [builder.resolved(launch) for launch in launches]
    return CudaProgram(plan, launches, arch, memory.regions(), builder.kernels, memory.counters, bodies, builder.keys)


__all__ = ["CudaProgram", "DeviceKernel", "KernelShape", "Launch", "Place", "Result", "build_program",
           "compile_ptx", "gemm_variants"]
