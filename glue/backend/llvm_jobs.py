"""The LLVM work of compiling one module: optimise it and emit object code or PTX.

These functions are the one implementation of that work, whether it runs in this process or in
a compile worker (`workers.py`). A worker runs this file as a script, so the module imports
nothing of glue (a worker starts in a tenth of a second instead of importing the package) and
reports failures as the RuntimeError llvmlite raised, which the callers turn into glue errors.

llvmlite serialises every call into LLVM behind one lock of its own, so threads cannot run LLVM
side by side; processes can. In this process every job also holds `LOCK`, the lock glue takes
around any sequence of LLVM calls.

Each job returns its result and the seconds it spent per step ("llvm optimise", and "object
emission" or "ptx emission"; "llvm cpu": the processor time of both, which a busy machine does
not inflate), which `compile_stats` adds up per kernel.
"""
from __future__ import annotations

import pickle
import sys
import threading
import time
from functools import lru_cache

if __name__ == "__main__":  # a worker: argv names where its parent found llvmlite and glue,
    sys.path[:0] = sys.argv[1:3]  # then modules of glue's to import now (`preload`)

import llvmlite.binding as llvm  # noqa: E402

LOCK = threading.RLock()

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"


@lru_cache(maxsize=None)
def _initialised(kind: str) -> bool:
    if kind == "host":
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
    else:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    return True


def host_machine(triple: str, cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
    """A target machine for the host CPU: position-independent code in the small code model.
    A fresh one each time (an MCJIT engine takes ownership of the one it is given)."""
    _initialised("host")
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=opt_level, codemodel="small",
                                        reloc="pic")


@lru_cache(maxsize=None)
def nvptx_machine(arch: str, features: str, opt_level: int) -> llvm.TargetMachine:
    _initialised("nvptx")
    return llvm.Target.from_triple(NVPTX_TRIPLE).create_target_machine(cpu=arch, features=features,
                                                                         opt=opt_level)


def parsed(ir_text: str, machine: llvm.TargetMachine) -> llvm.ModuleRef:
    """The module of `ir_text`, verified and set to the machine's triple and data layout."""
    module = llvm.parse_assembly(ir_text)
    module.verify()
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    return module


def optimise(module: llvm.ModuleRef, machine: llvm.TargetMachine, speed_level: int, vectorise: bool,
             unroll: bool = True, slp: bool = True) -> None:
    """Run the new pass manager's pipeline at `speed_level` (0: none) over `module`; with
    `vectorise`, the loop vectoriser, and the SLP vectoriser and loop unroller unless turned
    off (`slp`, `unroll`: then only loops whose metadata asks for unrolling are unrolled)."""
    if not speed_level:
        return
    tuning = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    if vectorise:
        tuning.loop_vectorization = True
        tuning.slp_vectorization = slp
        tuning.loop_interleaving = True
        tuning.loop_unrolling = unroll
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)


def host_code(ir_text: str, triple: str, cpu: str, features: str, speed_level: int, codegen_level: int,
              strength_reduction: bool, assembly: bool, fold_tail: bool = False, lean: bool = False,
              ) -> tuple[bytes | str, dict[str, float]]:
    """A module's native code for the host CPU (object code, or its assembly), optimised at
    `speed_level` with loop and SLP vectorisation, instructions selected at `codegen_level`,
    with or without loop strength reduction (a quarter of the time of a whole pipeline), and
    with loop tails folded into the vector loop where the vectoriser can mask them (`fold_tail`;
    else, and where it cannot, a scalar remainder loop follows the vector loop). A `lean`
    pipeline makes no more copies of a loop body than the vector loop's own: no unrolling
    beyond the interleaving the loops ask for, no vector epilogue before the scalar remainder,
    and no SLP vectoriser (which finds next to nothing in vectorised loops)."""
    with LOCK:
        start, cpu_start = time.perf_counter(), time.process_time()
        machine = host_machine(triple, cpu, features, codegen_level)
        module = parsed(ir_text, machine)
        # LLVM reads these flags when the vectoriser and the code generator's passes run;
        # each is reset to its default after
        if fold_tail:
            llvm.set_option("", "-prefer-predicate-over-epilogue=predicate-else-scalar-epilogue")
        if lean:
            llvm.set_option("", "-enable-epilogue-vectorization=0")
        try:
            optimise(module, machine, speed_level, vectorise=True, unroll=not lean, slp=not lean)
        finally:
            llvm.set_option("", "-prefer-predicate-over-epilogue=scalar-epilogue")
            llvm.set_option("", "-enable-epilogue-vectorization=1")
        optimised = time.perf_counter()
        llvm.set_option("", f"-disable-lsr={0 if strength_reduction else 1}")
        try:
            code = machine.emit_assembly(module) if assembly else machine.emit_object(module)
        finally:
            llvm.set_option("", "-disable-lsr=0")
        done = time.perf_counter()
    return code, {"llvm optimise": optimised - start, "object emission": done - optimised,
                  "llvm cpu": time.process_time() - cpu_start}


def nvptx(ir_text: str, arch: str, features: str, opt_level: int) -> tuple[str, dict[str, float]]:
    """PTX of a module for `arch`, optimised at `opt_level`."""
    with LOCK:
        start, cpu_start = time.perf_counter(), time.process_time()
        machine = nvptx_machine(arch, features, opt_level)
        module = parsed(ir_text, machine)
        optimise(module, machine, opt_level, vectorise=False)
        optimised = time.perf_counter()
        ptx = machine.emit_assembly(module)
        done = time.perf_counter()
    return ptx, {"llvm optimise": optimised - start, "ptx emission": done - optimised,
                 "llvm cpu": time.process_time() - cpu_start}


def bare_glue_package(home: str) -> None:
    """Make `glue` a package without its `__init__` (the user's API: the frontend, glue.numpy,
    ml_dtypes, ...), so that a worker imports only the modules its jobs name and the ones
    those import. A second or more of start-up saved per worker, on the critical path of a
    cold compile."""
    import os
    import types

    package = types.ModuleType("glue")
    package.__path__ = [os.path.join(home, "glue")]
    sys.modules["glue"] = package


def preload(modules: list[str]) -> None:
    """Import `modules` now, while the parent is still scheduling, not at the first job (one
    that fails to import fails the first job that needs it instead, with its error)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 (reported by the job that needs it)
            pass


def imported(modules: list[str]) -> list[bool]:
    """Which of `modules` this process has imported (what a worker holds, for tests)."""
    return [m in sys.modules for m in modules]


def call(module: str, function: str, args: tuple) -> object:
    """`module.function(*args)`: a job a higher layer defines (a backend emitting a kernel's IR
    in the worker as well as compiling it); the worker imports that module on its first such
    job, from the parent's path."""
    import importlib

    return getattr(importlib.import_module(module), function)(*args)


JOBS = {"host_code": host_code, "nvptx": nvptx, "call": call}


def write_frame(stream, payload: bytes) -> None:
    stream.write(len(payload).to_bytes(8, "little") + payload)
    stream.flush()


def read_frame(stream) -> bytes | None:
    """One length-prefixed frame, or None at the end of the stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    payload = stream.read(int.from_bytes(head, "little"))
    return payload if len(payload) == int.from_bytes(head, "little") else None


def serve(requests, replies) -> None:
    """The worker loop: each request is a pickled (job name, args); each reply a pickled
    (True, result) or (False, error message)."""
    while True:
        frame = read_frame(requests)
        if frame is None:
            return
        name, args = pickle.loads(frame)
        try:
            reply = (True, JOBS[name](*args))
        except Exception as exc:  # handed to the caller, which raises a glue error
            reply = (False, f"{type(exc).__name__}: {exc}")
        write_frame(replies, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    # Replies own stdout; anything else printed goes to stderr.
    channel, sys.stdout = sys.stdout.buffer, sys.stderr
    bare_glue_package(sys.argv[2])
    preload(sys.argv[3:])
    serve(sys.stdin.buffer, channel)
