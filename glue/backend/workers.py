"""Compile workers: processes that run LLVM jobs (`llvm_jobs.py`) side by side.

llvmlite holds one lock around every call into LLVM, so threads cannot optimise two modules at
once; separate processes can. A cold compile hands each kernel's module to the pool as soon as
its IR is built, so LLVM runs on every core while this process builds the next kernel's IR.

Workers are `python -P llvm_jobs.py`, which imports llvmlite and nothing of glue (until a
"call" job names a module of glue's: a backend's emitter, imported without the package's
`__init__`); they start when first needed (about 0.1-0.2 s each, in parallel), or ahead of it
(`prestart`, which may name modules to import at once), live as long as this process and
serve any number of jobs. Each pool thread owns one worker at a time and talks to it over its pipes
(length-prefixed pickles); a worker that dies fails its job with a RuntimeError, like an LLVM
error, and is replaced on the next job. `config.compile_workers` bounds the pool (default: the
cores this process may use); with one worker, or for a lone job while no worker runs yet,
jobs run in this process instead, where they cost no start-up.

LLVM's pass pipelines keep some memory for good (about 80 KiB per optimised module, which no
closing of llvmlite objects returns), so a process that compiles many programs one kernel at a
time would grow without bound: after IN_PROCESS_JOBS lone jobs here, later ones go to a worker
too, and a worker retires after WORKER_JOBS jobs, taking what LLVM kept with it.
"""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llvmlite

from glue import profiler
from glue.backend import llvm_jobs
from glue.settings import config

_SCRIPT = llvm_jobs.__file__
IN_PROCESS_JOBS = 8
PRESTART_EQNS = 100  # a program this large is worth starting the workers ahead of its kernels
WORKER_JOBS = 512
# Where the worker finds llvmlite: the same directory this process imported it from.
_LLVMLITE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(llvmlite.__file__)))
# Where a "call" job finds glue (imported only by such jobs).
_GLUE_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def worker_count() -> int:
    """Processes the pool may run: `config.compile_workers`, else the usable cores."""
    chosen = config.compile_workers
    return max(1, chosen) if chosen else usable_cores()


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self._process = subprocess.Popen([sys.executable, "-P", _SCRIPT, _LLVMLITE_HOME, _GLUE_HOME, *preload],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.jobs = 0

    def call(self, name: str, args: tuple) -> Any:
        self.jobs += 1
        try:
            llvm_jobs.write_frame(self._process.stdin, pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL))
            frame = llvm_jobs.read_frame(self._process.stdout)
        except OSError as exc:
            frame, why = None, str(exc)
        else:
            why = "it closed its pipe"
        if frame is None:
            self.close()
            raise RuntimeError(f"the compile worker running {name} exited ({why}; status "
                               f"{self._process.poll()})")
        ok, value = pickle.loads(frame)
        if not ok:
            raise RuntimeError(value)
        return value

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        try:
            self._process.stdin.close()  # the worker's loop ends at the end of its input
        except OSError:
            pass  # it has already gone
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()


class _Pool:
    """Worker processes, each used by one pool thread at a time."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="glue-compile")
        self.preload: tuple[str, ...] = ()  # modules every worker started from now on imports first

    @property
    def started(self) -> int:
        return len(self._all)

    def submit(self, name: str, args: tuple, label: str) -> Future:
        return self._threads.submit(self._run, name, args, label)

    def prestart(self, preload: tuple[str, ...]) -> None:
        """Start every worker not running yet; each imports llvmlite (and `preload`, added to
        what later workers import) while this process goes on."""
        with self._lock:
            self.preload += tuple(m for m in preload if m not in self.preload)
            while len(self._all) < self.size:
                worker = _Worker(self.preload)
                self._all.append(worker)
                self._idle.put(worker)

    def _run(self, name: str, args: tuple, label: str) -> Any:
        with profiler.span("compile", f"{name} {label}"):
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker(self.preload)
                with self._lock:
                    self._all.append(worker)
            try:
                return worker.call(name, args)
            finally:
                if worker.alive and worker.jobs < WORKER_JOBS:
                    self._idle.put(worker)
                else:
                    worker.close()
                    with self._lock:
                        self._all.remove(worker)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for worker in self._all:
            worker.close()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _the_pool(size: int) -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is not None and (_pool.pid != os.getpid() or _pool.size != size):
            if _pool.pid == os.getpid():
                _pool.close()
            _pool = None  # a forked child does not own its parent's workers
        if _pool is None:
            _pool = _Pool(size)
        return _pool


_ran_here = 0  # lone jobs this process has run itself


def _run_here(name: str, args: tuple, label: str) -> Future:
    global _ran_here
    _ran_here += 1
    done: Future = Future()
    with profiler.span("compile", f"{name} {label}"):
        try:
            done.set_result(llvm_jobs.JOBS[name](*args))
        except RuntimeError as exc:
            done.set_exception(exc)
    return done


class Jobs:
    """Where a batch of LLVM jobs runs: the worker pool, or this process."""

    def __init__(self, expected: int):
        size = worker_count()
        lone_here = expected <= 1 and not started() and _ran_here < IN_PROCESS_JOBS
        self._pool = _the_pool(size) if size > 1 and not lone_here else None

    @property
    def parallel(self) -> bool:
        return self._pool is not None

    def submit(self, name: str, args: tuple, label: str = "") -> Future:
        """Run job `name` of `llvm_jobs.JOBS` on `args` (`label` names it in a profile); its
        future raises RuntimeError on failure."""
        if self._pool is None:
            return _run_here(name, args, label)
        return self._pool.submit(name, args, label)


def prestart(preload: tuple[str, ...] = ()) -> None:
    """Start the pool's workers now, ahead of a batch of jobs expected soon (a cold compile
    starts them while the scheduler runs, so they are ready when its first module is), each
    importing the modules of glue's in `preload` (those its "call" jobs will name)."""
    size = worker_count()
    if size > 1:
        _the_pool(size).prestart(preload)


def started() -> int:
    """How many worker processes this process has running."""
    return _pool.started if _pool is not None and _pool.pid == os.getpid() else 0


@atexit.register
def _close() -> None:
    if _pool is not None and _pool.pid == os.getpid():
        _pool.close()


__all__ = ["Jobs", "prestart", "started", "usable_cores", "worker_count"]
