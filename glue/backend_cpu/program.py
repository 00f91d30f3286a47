"""A scheduler Plan as the distinct kernels it runs, and where each use of one finds its buffers.

The table a call fills has one entry per program argument, one per fresh output, then the
arena: a value's memory-plan placement becomes a (table slot, byte offset) pair (`Operand`).
Kernels do not compile those pairs in (see `kernels.py`): each plan kernel is a `KernelUse`
of the code of its structural key (`glue.backend.kernel_key`), with its own operand places,
so identical kernels (the layers of a model; the same layer in another program) are one
`KernelSource`, built into one LLVM module and compiled once. Blocked contractions that
differ only in their sizes (a layer's products, forward and backward) are one `KernelSource`
too: keyed without their sizes, their code compiles in the numbers they all have alike and
reads the others when it is called (`matmul.py`), each use passing its own (`Launch`). A call
kernel (control flow, a print) has no code of its own: it is a `CallSite`, whose step runs
compiled bodies on the same table entries (`calls.py`). Each graph output is then either
a fresh output buffer, a donated argument's buffer, a copy of an argument (an output that is an
input), or a literal.

The key holds everything the generated code depends on besides the kernel: glue's code version,
the host target, the backend options, the thread count and the settings the kernel builders
read (`CODEGEN_SETTINGS`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from llvmlite import ir

from glue.backend.cache import code_version, digest
from glue.backend.kernel_key import ByStructure, KernelKeys, aliases
from glue.backend_cpu.calls import CallSite
from glue.backend_cpu.kernels import KernelBuilder, KernelFunction, Launch
from glue.backend_cpu.literals import lift as lift_literals
from glue.backend_cpu.matmul import Contraction, blocked_contraction, common_sizes, plan as plan_contraction
from glue.backend_cpu.offsets import lift as lift_offsets
from glue.backend_cpu.target import Pipeline, host, thread_count
from glue.codegen.mathlib import UNARY_FUNCTIONS
from glue.ir import TensorType
from glue.scheduler.calls import call_plan
from glue.scheduler.kernel_ir import Kernel, Op, operands, postorder
from glue.scheduler.memory import Placement
from glue.scheduler.plan import Plan, Result
from glue.settings import config

# Settings the kernel builders (kernels.py, matmul.py) read: part of every kernel's key.
CODEGEN_SETTINGS = ("cpu_stream_bytes", "cpu_matmul_l1_bytes", "cpu_matmul_l2_bytes", "cpu_matmul_sums_bytes",
                    "cpu_matmul_min_work")
MATH_FUNCTIONS = UNARY_FUNCTIONS | {"pow"}
# From this `body_size` on, a kernel's loops fold their tails into the vector loop (see
# `pipeline`). The training step's largest kernels measure 150; a fused chain of 256 values,
# the most fusion makes (`glue.scheduler.fusion.MAX_KERNEL_SIZE`), of a third math functions
# measures about 1,000.
LONG_BODY = 400


@dataclass(frozen=True)
class Operand:
    """Where a kernel operand lives: entry `slot` of the buffer table, plus `offset` bytes."""

    slot: int
    offset: int = 0


@dataclass(frozen=True)
class KernelSource:
    """One distinct kernel's code as it is built: the first plan kernel with its key, the
    aliasing of its operands, the symbol its module defines, and for a blocked contraction,
    per number of its uses' `Launch.sizes`, the value its code compiles in (None: the code
    reads it when it is called)."""

    key: bytes
    kernel: Kernel
    aliases: tuple[int, ...]
    symbol: str
    compiled_in: tuple[int | None, ...] | None = None

    def build(self, opt_level: int) -> KernelModule:
        """The LLVM module defining `symbol`, what the function computes, and how to optimise
        it (`pipeline`)."""
        module = ir.Module(name=self.symbol)
        module.triple, module.data_layout = host().triple, host().data_layout
        built = None
        if self.kernel.kind == "contraction":
            built = blocked_contraction(module, self.kernel, self.symbol, self.aliases, host().vector_bits,
                                        self.compiled_in)
        if built is None:
            built = KernelBuilder(module, self.kernel, self.symbol, self.aliases).build()
        return KernelModule(str(module), built, pipeline(opt_level, body_size(self.kernel)))


def body_size(kernel: Kernel) -> int:
    """An estimate of the size of a kernel's loop body, in instructions of a few: the nodes
    of its expressions (a math function, a polynomial's worth, counting ten) and its operands."""
    seen: set = set()
    size = len(kernel.inputs) + len(kernel.outputs)
    for root in kernel.roots:
        for node in postorder(root, operands, seen):
            seen.add(node)
            size += 10 if isinstance(node, Op) and node.primitive in MATH_FUNCTIONS else 1
    return size


def pipeline(opt_level: int, size: int) -> Pipeline:
    """How a kernel's module is optimised, by the `body_size` of its kernel (measured per
    class with `GLUE_CPU_THREADS=1` on the 2-core development machine). Every class runs O2
    without loop strength reduction, `lean`: no unrolling beyond what a loop's metadata asks
    for (the interleaving of vector loops, the matmul micro-kernel's `MICRO_UNROLL`), no
    vector epilogue before the scalar remainder, no SLP vectoriser (which finds next to
    nothing in vectorised loops). The matmul micro-kernel walks pointers itself (matmul.py),
    so the code generator's strength reduction, once 40% of such a module's LLVM time, does
    not pay. Over the GPT-2-width 2-layer step's modules the lean pipeline cut LLVM's
    processor time 15-25% with step times unchanged within the noise; for the register-
    blocked matmuls (O3 with the unroller and SLP before) it cut their LLVM time 25-30%, the
    products of a GPT-2-width layer at 4096 tokens as fast as before (150-180 GFLOP/s either
    way on the 2-core machine). A long body (`LONG_BODY`) also folds its loops' tails into the
    vector loop (masked loads and stores for the last partial vector) instead of compiling it
    again for a scalar remainder: a 1,000-op chain's body is compiled twice (the interleaved
    pair) instead of four times, its LLVM time falls by a third, and its run time is unchanged
    (the masks cost nothing beside such a body)."""
    return Pipeline(min(opt_level, 2), strength_reduction=False, fold_tail=size >= LONG_BODY, lean=True)


@dataclass(frozen=True)
class KernelModule:
    """A distinct kernel's LLVM module (text), its function, and its optimisation pipeline."""

    text: str
    function: KernelFunction
    pipeline: Pipeline


@dataclass(frozen=True)
class KernelUse:
    """A plan kernel: the key of its code and its operands' distinct places, in the order of
    the code's pointer parameters, and where that code serves kernels of other sizes, this
    kernel's `Launch`."""

    key: bytes
    kernel: Kernel
    places: tuple[Operand, ...]
    launch: Launch | None = None

    def function(self, code: KernelFunction) -> KernelFunction:
        """The function of the code as this use runs it: its own kernel, and its own work."""
        own = replace(code, kernel=self.kernel)
        launch = self.launch
        return own if launch is None else \
            replace(own, units=launch.units, cost=launch.cost, scratch_bytes=launch.scratch_bytes)


@dataclass
class Program:
    """The distinct kernels of glue's own code (`sources`) and the program's steps in order
    (`uses`): uses of those kernels, and call kernels (`CallSite`), which run compiled bodies.
    `literals` holds the float literals lifted out of its kernels (`literals.py`), which the
    kernels find at the buffer table's last entry (after the arguments, outputs and arena)."""

    plan: Plan
    sources: dict[bytes, KernelSource]
    uses: list[KernelUse | CallSite]
    opt_level: int = 3
    literals: tuple[float, ...] = ()
    _modules: dict[bytes, KernelModule] = field(default_factory=dict, repr=False)

    @property
    def arg_types(self) -> list[TensorType]:
        return self.plan.argument_types

    @property
    def output_types(self) -> list[TensorType]:
        return self.plan.output_types

    @property
    def results(self) -> list[Result]:
        return self.plan.results()

    def module(self, key: bytes) -> KernelModule:
        """The LLVM module of distinct kernel `key`, built once."""
        if key not in self._modules:
            self._modules[key] = self.sources[key].build(self.opt_level)
        return self._modules[key]

    def uses_by_key(self) -> dict[bytes, list[int]]:
        """The positions of the plan kernels that run each distinct kernel."""
        found: dict[bytes, list[int]] = {key: [] for key in self.sources}
        for i, use in enumerate(self.uses):
            if isinstance(use, KernelUse):
                found[use.key].append(i)
        return found

    @property
    def llvm_ir(self) -> str:
        """Every distinct kernel's module, each headed by the plan kernels that run it."""
        parts = []
        for key, positions in self.uses_by_key().items():
            users = ", ".join(f"{i}:{self.uses[i].kernel.name}" for i in positions)
            parts.append(f"; kernel {self.sources[key].symbol}, run by plan kernels {users}\n{self.module(key).text}")
        return "\n".join(parts)


@dataclass(frozen=True)
class _Planned:
    """A plan kernel on its way to a `KernelUse`: its code (after the rewrites), operands and
    their aliasing, label, and for a blocked contraction its plan; `key` is its code's key,
    a contraction's without its sizes."""

    kernel: Kernel
    code: Kernel
    operands: tuple[Operand, ...]
    aliases: tuple[int, ...]
    label: str
    contraction: Contraction | None
    key: bytes


def _operand(p: Placement, n_args: int, arena_slot: int) -> Operand:
    if p.kind == "arena":
        return Operand(arena_slot, p.slot)
    return Operand(n_args + p.slot if p.kind == "output" else p.slot)


def _symbol(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _label(kernel: Kernel) -> str:
    """The readable part of a kernel's symbol: its first fused ops. The symbol is that and the
    key, so it names the same code in every program and in the disk cache, and the label is
    part of the key."""
    return _symbol("_".join(kernel.ops[:5]))[:60]


def codegen_context(options_key: str) -> tuple[str, ...]:
    """What every kernel's code depends on besides the kernel itself."""
    settings = ",".join(f"{name}={config.read(name)!r}" for name in CODEGEN_SETTINGS)
    return ("cpu kernel", code_version(), host().fingerprint, options_key, f"threads={thread_count()}", settings)


def build_program(plan: Plan, options_key: str = "", opt_level: int = 3) -> Program:
    """The distinct kernels of `plan` and each plan kernel's use of one (no code is built yet)."""
    placements = plan.memory.placements
    n_args = len(plan.argument_types)
    arena_slot = n_args + len(plan.output_types)
    context = codegen_context(options_key)
    sources: dict[bytes, KernelSource] = {}
    uses: list[KernelUse | CallSite] = []
    literals: list[float] = []
    literal_slot = arena_slot + 1  # the buffer table's last entry (runtime.py's `_run`)
    kernel_key = KernelKeys()
    # Copies of one lowered group (a model's layers) share their expression objects, and so
    # their moved and lifted kernels: the key's memo (`KernelKeys`) then finds them without a walk.
    moves, lifts, contractions = ByStructure(), ByStructure(), ByStructure()
    steps: list[CallSite | _Planned] = []
    for kernel in plan.kernels:
        inputs = [_operand(placements[b.value_id], n_args, arena_slot) for b in kernel.inputs]
        outputs = [_operand(placements[b.value_id], n_args, arena_slot) for b in kernel.outputs]
        if kernel.call is not None:
            steps.append(CallSite(kernel, call_plan(kernel), inputs, outputs))
            continue
        code = kernel
        fixed = frozenset(i for i, place in enumerate(inputs) if place in outputs)
        moved = moves.get(kernel, lambda: lift_offsets(kernel, fixed), fixed)
        if moved is not None:
            shared_code, shifts = moved
            code = replace(kernel, reductions=shared_code.reductions, stores=shared_code.stores)
            inputs = [Operand(place.slot, place.offset + shift) for place, shift in zip(inputs, shifts)]
        lifted = lifts.get(code, lambda: lift_literals(code))
        if lifted is not None:
            shared_code, values = lifted
            code = replace(code, inputs=code.inputs + shared_code.inputs[-1:], reductions=shared_code.reductions,
                           stores=shared_code.stores)
            inputs.append(Operand(literal_slot, 8 * len(literals)))
            literals.extend(values)
        operands = inputs + outputs
        shared = aliases(operands)
        label = _label(kernel)
        contraction = contractions.get(code, lambda: plan_contraction(code, host().vector_bits)) \
            if code.kind == "contraction" else None
        key = kernel_key(code, shared, *context, label) if contraction is None else \
            kernel_key(code, shared, *context, label, *contraction.signature, sizes=False)
        steps.append(_Planned(kernel, code, tuple(operands), shared, label, contraction, key))
    # What the contractions sharing code all have alike is compiled in (a contraction alone
    # has all of its sizes compiled in: the code of its sizes alone, which LLVM optimises in
    # two thirds of the time).
    fellows: dict[bytes, list[tuple[int, ...]]] = {}
    for step in steps:
        if isinstance(step, _Planned) and step.contraction is not None:
            fellows.setdefault(step.key, []).append(step.contraction.launch.sizes)
    compiled_in = {key: common_sizes(sizes) for key, sizes in fellows.items()}
    for step in steps:
        if isinstance(step, CallSite):
            uses.append(step)
            continue
        key, launch, numbers = step.key, None, None
        if step.contraction is not None:
            launch, numbers = step.contraction.launch, compiled_in[key]
            key = digest(key, repr(numbers))
        if key not in sources:
            sources[key] = KernelSource(key, step.code, step.aliases, f"glue_{step.label}_{key.hex()[:16]}", numbers)
        uses.append(KernelUse(key, step.kernel, tuple(step.operands[i] for i in dict.fromkeys(step.aliases)), launch))
    return Program(plan, sources, uses, opt_level, tuple(literals))
