"""`glue.jit`: trace once per signature, compile through a backend, cache, and call.

A signature is the pytree structure of the dynamic arguments, their types, and the values of
the static arguments. `f.lower(*args)` gives the staged `Lowered` (text of every stage: "ir",
then the backend's stage table); `.compile()` gives the callable `Compiled`. Called inside
another trace, a jitted function is inlined into it.

A call hands the backend raw buffers (`Array.buffer`) and wraps the buffers it returns as
Arrays. Donation follows JAX's contract: the buffer of a donated glue.Array may become an
output's, and the Array is deleted (using it again raises, naming the call); a donated NumPy
array is never written (the backend gets its own copy); an Array passed at several positions
is copied where it is donated.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import inspect
import itertools
import logging
import os
import shutil
import subprocess
import threading
import time
from operator import attrgetter
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from glue import profiler
from glue.backend import Backend, Lowering, get_backend
from glue.errors import GlueError, describe_location, user_frame_location
from glue.frontend.array import Array, buffers_of, delete_all, device_buffer_of, wrap_results
from glue.frontend.pytree import LEAF, PyTreeDef, flatten_call, leaf_paths, tree_flatten, tree_unflatten, unflattener
from glue.frontend.tracing import Tracer, current_trace, open_traces, trace_flat, type_of
from glue.frontend.transforms.inline import inline
from glue.ir import ClosedGraph, TensorType
from glue.settings import config

_AVAL = attrgetter("aval")
_DEVICE = itertools.repeat("_device")
log = logging.getLogger("glue")

_DUMP_COUNT = itertools.count()
_gc_lock = threading.Lock()
_gc_pauses = 0  # compiles in progress (threads may compile side by side)
_gc_was_enabled = False


@contextlib.contextmanager
def _collections_paused() -> Iterator[None]:
    """No cyclic garbage collection while a program is traced, lowered or compiled.

    A compile makes hundreds of thousands of objects that outlive the young generations (the
    graph, its kernels, their expressions), so the collector keeps scanning every object the
    process holds, growing as it runs: a quarter of the warm compile of the 16-layer bf16 step
    (0.6 of 2.5 s). Compiling makes almost no cycles (they are freed by reference counting);
    what cyclic garbage it does make waits for the collections after it. The collector's state
    is restored when the last compile in progress ends."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_STAGE_SUFFIX = {"graph": "dot", "llvm": "ll", "ptx": "ptx", "asm": "s"}


class Signature(NamedTuple):
    """What a compiled program is specialised to; the key of the jit cache. A tuple, because
    every call builds one and looks it up."""

    treedef: PyTreeDef
    types: tuple[TensorType, ...]
    statics: tuple[tuple[Any, Any], ...]
    context: tuple[Any, ...] = ()  # the settings tracing reads (glue.config.trace_context)

    def explain_difference(self, old: "Signature") -> str:
        if self.context != old.context:
            return f"settings that tracing reads changed ({old.context} -> {self.context})"
        if self.statics != old.statics:
            changed = [f"{k}: {dict(old.statics).get(k)!r} -> {v!r}"
                       for k, v in self.statics if dict(old.statics).get(k) != v]
            return "static arguments changed (" + "; ".join(changed) + ")"
        if self.treedef != old.treedef:
            return f"the argument structure changed from {old.treedef} to {self.treedef}"
        args_tree, kwargs_tree = self.treedef.children
        paths = leaf_paths(args_tree, "args") + leaf_paths(kwargs_tree, "kwargs")
        changed = [f"{p} {a} -> {b}" for p, a, b in zip(paths, old.types, self.types) if a != b]
        return "argument types changed: " + "; ".join(changed)


def _types(values: Sequence[Any], treedef: PyTreeDef | None = None) -> tuple[TensorType, ...]:
    try:
        return tuple([v.aval if v.__class__ is Array else type_of(v) for v in values])
    except GlueError as err:  # name which argument it is
        if treedef is None:
            raise
        args_tree, kwargs_tree = treedef.children
        paths = leaf_paths(args_tree, "args") + leaf_paths(kwargs_tree, "kwargs")
        for path, v in zip(paths, values):
            try:
                v.aval if v.__class__ is Array else type_of(v)
            except GlueError:
                raise type(err)(f"argument {path}: {err}") from None
        raise


def _positional_params(fn: Callable) -> tuple[list[str], bool, set[int]] | None:
    """The names of `fn`'s positional parameters, whether it takes *args, and the positions
    that have defaults; None when Python cannot tell (a builtin)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return ([p.name for p in positional], any(p.kind == p.VAR_POSITIONAL for p in params),
            {i for i, p in enumerate(positional) if p.default is not p.empty})


def _argnums(fn: Callable, what: str, nums: Sequence[int]) -> set[int]:
    """Validated argument positions: ints, negative ones counted from the last positional
    parameter (as JAX does), each naming a parameter `fn` has."""
    known = _positional_params(fn)
    name = getattr(fn, "__name__", "the function")
    where = describe_location(user_frame_location())
    out = set()
    for given in nums:
        if not isinstance(given, int) or isinstance(given, bool):
            raise GlueError(f"glue.jit({name}): {what} must be ints, got {given!r} {where}")
        count = len(known[0]) if known else None
        n = given
        if n < 0:
            if count is None or known[1]:
                raise GlueError(f"glue.jit({name}): a negative {what} ({given}) needs a function with a "
                                f"fixed number of positional parameters {where}")
            n += count
        if n < 0 or (count is not None and n >= count and not known[1]):
            raise GlueError(f"glue.jit({name}): {what} {given} is out of range: {name} takes "
                            f"{count} positional argument{'s' if count != 1 else ''} {where}")
        out.add(n)
    return out


class _ArgSpec:
    """Splits a call's arguments into static values and a pytree of dynamic leaves."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int], static_argnames: Sequence[str]):
        self.fn = fn
        known = _positional_params(fn)
        names, self._defaulted = (known[0], known[2]) if known else ([], set())
        for n in static_argnames:
            if not isinstance(n, str):
                raise GlueError(f"glue.jit: static_argnames must be strings, got {n!r}")
        self.static_nums = _argnums(fn, "static_argnums", static_argnums) | \
            {names.index(n) for n in static_argnames if n in names}
        self.static_names = set(static_argnames) | {names[i] for i in self.static_nums if i < len(names)}
        self._names = names

    def split(self, args: tuple, kwargs: dict) -> tuple[Signature, list[Any]]:
        if not kwargs and not self.static_nums:  # the common calls, kept lean
            leaves, treedef = flatten_call(args)
            return Signature(treedef, _types(leaves, treedef), (), config.trace_context()), leaves
        # As in JAX, a static parameter left out of a call takes its default (in the traced call).
        missing = [i for i in sorted(self.static_nums) if i >= len(args) and i not in self._defaulted
                   and not (i < len(self._names) and self._names[i] in kwargs)]
        if missing:
            raise GlueError(f"{self.fn.__name__} was called with {len(args)} positional arguments, but "
                            f"static_argnums names position {missing[0]} "
                            f"{describe_location(user_frame_location())}")
        dyn_args = tuple(a for i, a in enumerate(args) if i not in self.static_nums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_names}
        statics = tuple((i, a) for i, a in enumerate(args) if i in self.static_nums) + \
            tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_names))
        try:
            hash(statics)
        except TypeError:
            raise GlueError(f"static arguments of {self.fn.__name__} must be hashable; got "
                            f"{[type(v).__name__ for _, v in statics]} "
                            f"{describe_location(user_frame_location())}") from None
        leaves, treedef = tree_flatten((dyn_args, dyn_kwargs))
        return Signature(treedef, _types(leaves, treedef), statics, config.trace_context()), leaves

    def flat_fn(self, sig: Signature) -> Callable[..., list[Any]]:
        """`fn` as a function of the flat dynamic leaves, returning flat outputs."""
        statics = dict(sig.statics)
        out_tree: list[PyTreeDef] = []

        def flat(*leaves: Any) -> list[Any]:
            dyn_args, kwargs = tree_unflatten(sig.treedef, list(leaves))
            dyn = iter(dyn_args)
            n = len(dyn_args) + sum(1 for k in statics if isinstance(k, int))
            args = [statics[i] if i in statics else next(dyn) for i in range(n)]
            kwargs.update({k: v for k, v in statics.items() if isinstance(k, str)})
            outs, treedef = tree_flatten(self.fn(*args, **kwargs))
            out_tree.append(treedef)
            trace = current_trace()
            if trace.token is not None:  # the program prints: its last token keeps them alive
                outs.append(Tracer(trace, trace.token))
            return outs

        flat.out_tree = out_tree  # type: ignore[attr-defined]
        return flat


class Lowered:
    """A traced program on its way to a backend; every stage can be printed."""

    def __init__(self, name: str, closed: ClosedGraph, out_tree: PyTreeDef, signature: Signature,
                 backend: Backend, donated: tuple[int, ...], spec: "_ArgSpec | None" = None,
                 options: dict[str, Any] | None = None):
        self.name = name
        self.closed = closed
        self.out_tree = out_tree
        self.signature = signature
        self.spec = spec
        self.donated = donated
        self.backend = backend
        # Custom derivatives and checkpoints have done their work once tracing is over: their
        # bodies are compiled inline, fused with what surrounds them.
        self.lowering: Lowering = backend.lower(inline(closed.graph), donated=donated, name=name,
                                                **(options or {}))
        self.trace_seconds = 0.0  # how long tracing took (set by the jitted function that traced it)

    @property
    def stages(self) -> tuple[str, ...]:
        return ("ir",) + self.lowering.stages

    def as_text(self, stage: str = "ir") -> str:
        if stage == "ir":
            return str(self.closed.graph)
        if stage not in self.lowering.stages:
            raise GlueError(f"stage {stage!r} is not produced by the {self.backend.name} backend; "
                            f"stages: {self.stages}")
        with _collections_paused():
            return self.lowering.as_text(stage)

    def compile(self) -> "Compiled":
        if config.dump:
            self.dump(config.dump)
        with _collections_paused(), profiler.span("compile", f"compile {self.name}", backend=self.backend.name):
            compiled = Compiled(self, self.lowering.compile())
        if compiled.debug:
            _log_compiled(compiled)
        return compiled

    def dump(self, directory: str) -> list[str]:
        """Write every stage into `directory` as `<n>.<function>.<stage>.<ext>`, `n` counting the
        programs compiled by this process (so two signatures of one function do not collide)."""
        paths = []
        n = next(_DUMP_COUNT)
        try:
            os.makedirs(directory, exist_ok=True)
            for stage in self.stages:
                path = os.path.join(directory, f"{n:03d}.{self.name}.{stage}.{_STAGE_SUFFIX.get(stage, 'txt')}")
                with open(path, "w") as f:
                    f.write(self.as_text(stage) + "\n")
                paths.append(path)
                if stage == "graph" and shutil.which("dot"):
                    paths += _render_svg(path)
        except OSError as exc:
            raise GlueError(f"GLUE_DUMP: cannot write the stages of {self.name} into {directory!r}: "
                            f"{exc.strerror or exc} {describe_location(user_frame_location())}") from None
        return paths


_CODE_STAGES = ("llvm", "ptx", "asm")


def _debug_log() -> logging.Logger:
    """The glue logger, printing to stderr at every level while GLUE_DEBUG is set."""
    if not any(getattr(h, "_glue_debug", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("glue: %(message)s"))
        handler._glue_debug = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    return log


def _log_compiled(compiled: "Compiled") -> None:
    """GLUE_DEBUG >= 1: the program's kernels and where its compile time went; 2: every
    stage's text; 3: the generated code too."""
    lowered, level = compiled.lowered, compiled.debug
    out = _debug_log()
    report = compiled.compile_stats()
    stats = ", ".join(f"{k} {v['seconds'] * 1e3:.1f} ms{' (cached)' if v['cached'] else ''}"
                      for k, v in report["stages"].items())
    stats += "; code of " + ", ".join(f"{n} kernels {source}" for source, n in report["cache"].items() if n)
    kernels = "\n".join(f"  {getattr(k, 'name', k)} ({getattr(k, 'kind', '')})" for k in compiled.kernels)
    out.debug("compiled %s for %s: %d kernels; %s\n%s", lowered.name, lowered.backend.name,
              len(compiled.kernels), stats, kernels)
    if level >= 2:
        for stage in lowered.stages:
            if stage not in _CODE_STAGES or level >= 3:
                out.debug("%s stage %s:\n%s", lowered.name, stage, lowered.as_text(stage))


def _render_svg(dot_path: str) -> list[str]:
    """The fusion picture: Graphviz's `dot` renders the "graph" stage next to it as SVG."""
    svg = os.path.splitext(dot_path)[0] + ".svg"
    try:
        subprocess.run(["dot", "-Tsvg", dot_path, "-o", svg], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("GLUE_DUMP: dot could not render %s: %s", dot_path, exc)
        return []
    return [svg]


def _resident(backend: Backend, value: Any) -> Any:
    """`value` (a captured constant) as a buffer of `backend`'s memory."""
    buffer = value.buffer if isinstance(value, Array) else value
    return buffer if backend.holds(buffer) else backend.device_put(buffer)


class Compiled:
    """A program compiled for one signature; calling it runs it on the backend."""

    def __init__(self, lowered: Lowered, executable: Any):
        self.lowered = lowered
        self.executable = executable
        self._check: bool = config.check
        self._debug: int = config.debug
        self._backend = lowered.backend
        # Captured values, put in the backend's memory once (jax.jit makes them constants of the
        # program): a captured NumPy value, or an Array whose buffer a call would not take as it
        # is, would otherwise be copied in again at every call.
        self._consts = tuple(_resident(self._backend, c) for c in lowered.closed.consts)
        self._out_tree = lowered.out_tree
        self._unflatten = unflattener(lowered.out_tree)
        # A program that prints returns its effect token last; the caller does not see it.
        self._n_results = lowered.out_tree.num_leaves
        self._donated = lowered.donated
        # what a donated Array says it went to, made once (a step donates a hundred leaves a call)
        self._donated_to = [f"{lowered.name} (argument {i} of its flattened inputs)" for i in lowered.donated]
        # One TensorType object per distinct argument type (`arg_avals`, per argument): outputs
        # of such a type get it as their aval, and so do the Arrays of a call that sets the hot
        # signature (`Jitted._call`), so that a loop's checks compare types by identity.
        arg_types = {t: t for t in lowered.signature.types}
        self.arg_avals = [arg_types[t] for t in lowered.signature.types]
        self._avals = [arg_types.get(t, t) for t in lowered.closed.graph.out_types]
        # No effect token to drop from the results.
        self._all_results = self._n_results == len(self._avals)
        # A call with no donation or effect token (and, checked per call, no reference check or
        # debug timing): the usual one. (Captured constants are buffers of the backend by now.)
        self._plain = not self._donated and self._all_results
        # The lean call (`_lean_call`), where the backend has one (`lean_call`), the program
        # returns no effect token and the arguments are leaves or flat lists or tuples of them;
        # `lean` is it while no reference check or debug timing is on (else `_no_lean`).
        launch = getattr(executable, "lean_call", None) if self._all_results else None
        layout = _layout(lowered.signature) if launch is not None else None
        self._lean_fn = None if layout is None else _lean_call(
            launch, getattr(executable, "lean_call_one", None), layout, self.arg_avals, self._avals,
            self._out_tree, list(self._consts), self._donated, self._donated_to)
        self.has_lean = self._lean_fn is not None
        self._arm()

    @property
    def check(self) -> bool:
        """Whether each call also runs the reference and compares (GLUE_CHECK when compiled)."""
        return self._check

    @check.setter
    def check(self, on: bool) -> None:
        self._check = on
        self._arm()

    @property
    def debug(self) -> int:
        """The GLUE_DEBUG level when compiled: from 1 on, each call logs its times."""
        return self._debug

    @debug.setter
    def debug(self, level: int) -> None:
        self._debug = level
        self._arm()

    def _arm(self) -> None:
        """`lean`: the lean call, which serves no call with a reference check or debug timing."""
        on = self.has_lean and not (self._check or self._debug)
        self.lean: Callable[[tuple], Any] = self._lean_fn if on else _no_lean

    @property
    def kernels(self) -> list[Any]:
        return list(getattr(self.executable, "kernels", []))

    def memory_analysis(self) -> Any:
        return self.executable.memory_analysis()

    def cost_analysis(self) -> Any:
        return self.executable.cost_analysis()

    def compile_stats(self) -> dict[str, Any]:
        """Where this program's compile time went.

        - "stages": seconds of each stage (trace, then the backend's: passes, fuse, plan,
          program, object or ptx, load, ...), each stage's own time without the stages it
          built on the way, and whether a cache served it;
        - "steps": seconds of each step of making the kernels' code, over all kernels ("llvm
          build", "llvm optimise", "object emission", "disk cache", "link", ...); steps that ran
          in compile workers overlap, so they may add up to more than their stage's time;
        - "kernels": per distinct kernel, its symbol, kind, how many plan kernels use it, where
          its code came from ("built", "disk", "memory") and its steps' seconds;
        - "cache": how many distinct kernels came from each source;
        - "seconds": the stages' total.
        """
        lowering = self.lowered.lowering
        stages = {"trace": {"seconds": self.lowered.trace_seconds, "cached": False}}
        stages.update({name: {"seconds": t.seconds, "cached": t.cached} for name, t in lowering.timings.items()})
        kernels = list(lowering.kernel_stats.values())
        steps: dict[str, float] = {}
        for k in kernels:
            for step, seconds in k.seconds.items():
                steps[step] = steps.get(step, 0.0) + seconds
        cache = {source: sum(k.source == source for k in kernels) for source in ("built", "disk", "memory")}
        return {"stages": stages, "steps": steps, "cache": cache,
                "kernels": [{"symbol": k.symbol, "kind": k.kind, "uses": k.uses, "source": k.source,
                             "seconds": dict(k.seconds)} for k in kernels],
                "seconds": sum(s["seconds"] for s in stages.values())}

    def as_text(self, stage: str = "ir") -> str:
        """The lowered stage's text, and what the backend adds once the program is loaded (the
        cuda backend's "kernels": who serves each contraction, as raced)."""
        text = self.lowered.as_text(stage)
        loaded = getattr(self.executable, "loaded_text", None)
        extra = loaded(stage) if loaded is not None else ""
        return f"{text}\n{extra}" if extra else text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on arguments of the signature this was compiled for (like the jitted function)."""
        lowered = self.lowered
        if lowered.spec is None:
            raise GlueError(f"{lowered.name} was lowered without its argument spec; call call_flat")
        sig, leaves = lowered.spec.split(args, kwargs)
        if sig != lowered.signature:
            raise GlueError(f"{lowered.name} was compiled for other arguments: "
                            f"{sig.explain_difference(lowered.signature)}; lower it again for these "
                            f"{describe_location(user_frame_location())}")
        return self.call_tree(leaves)

    def call_tree(self, leaves: Sequence[Any]) -> Any:
        """Run on the flat dynamic leaves; the outputs come back in the function's pytree."""
        if self._plain and not (self._debug or self._check):
            outs = wrap_results(self.executable(*self._consts, *buffers_of(leaves)), self._avals)
        else:
            outs = self.call_flat(leaves)
        return self._unflatten(outs)

    def call_flat(self, leaves: Sequence[Any]) -> list[Array]:
        """Run on the flat dynamic leaves; one Array per output."""
        if self._debug:
            return self._timed_call(leaves)
        buffers = buffers_of(leaves)
        expected = self._reference(buffers) if self._check else None
        if self._donated:
            self._donate(leaves, buffers)
        args = self._consts + tuple(buffers) if self._consts else buffers
        outs = wrap_results(self.executable(*args), self._avals)[:self._n_results]
        if expected is not None:
            self._compare(outs, expected)
        return outs

    def _timed_call(self, leaves: Sequence[Any]) -> list[Array]:
        """A call under GLUE_DEBUG: its host time, and its time to the results being ready."""
        start = time.perf_counter()
        self._debug, debug = 0, self._debug  # (the lean call stays off meanwhile)
        try:
            outs = self.call_flat(leaves)
        finally:
            self._debug = debug
        queued = time.perf_counter()
        for out in outs:
            out.block_until_ready()
        _debug_log().debug("call %s: %.1f us to queue, %.1f us to the results", self.lowered.name,
                           (queued - start) * 1e6, (time.perf_counter() - start) * 1e6)
        return outs

    def _donate(self, leaves: Sequence[Any], buffers: list[Any]) -> None:
        """Give the backend a buffer it owns at each donated position (the Array's own, which it
        may overwrite, or a copy), and delete the donated Arrays."""
        # A leaf passed twice must not be overwritten through one position while the other is
        # read; the usual call passes every leaf once, which one set tells.
        seen = collections.Counter(map(id, leaves)) if len(set(map(id, leaves))) < len(leaves) else None
        donated = list(map(leaves.__getitem__, self._donated))
        if seen is None and list(map(type, donated)).count(Array) == len(donated):  # (the usual call)
            delete_all(donated, self._donated_to)
            return
        for i, a, donated_to in zip(self._donated, donated, self._donated_to):
            if a.__class__ is Array:
                if seen is not None and seen[id(a)] > 1:
                    buffers[i] = self._backend.private_copy(buffers[i])
                a.delete(donated_to)
            else:
                buffers[i] = self._backend.private_copy(buffers[i])

    def _reference(self, buffers: Sequence[Any]) -> list[np.ndarray]:
        from glue.reference import run_graph

        values = [np.asarray(Array(b)) if not isinstance(b, (np.ndarray, np.generic, int, float, bool)) else b
                  for b in buffers]
        return run_graph(self.lowered.closed.graph, [np.asarray(c) for c in self._consts] + values, float64=True)

    def _compare(self, outs: Sequence[Array], expected: Sequence[np.ndarray]) -> None:
        from glue.reference.compare import mismatch, tolerance_dtypes

        graph = self.lowered.closed.graph
        tolerances = tolerance_dtypes(graph, tf32=self._backend.rounds_to_tf32)
        for i, (got, want, t, tol) in enumerate(zip(outs, expected, graph.out_types, tolerances)):
            problem = mismatch(np.asarray(got), want, tol if tol is not None else t.dtype)
            if problem:
                raise GlueError(f"GLUE_CHECK: output {i} of {self.lowered.name} ({t}) on the "
                                f"{self.lowered.backend.name} backend disagrees with the reference: {problem}")


def _lean_call(launch: Callable[[list[Any]], list[Any] | None], launch_one: Callable[[Any], list[Any] | None] | None,
               layout: list[tuple[type, int] | None], arg_avals: list[TensorType], out_avals: list[TensorType],
               out_tree: PyTreeDef, consts: list[Any], donated: tuple[int, ...],
               donated_to: list[str]) -> Callable[[tuple, tuple | None], Any]:
    """A program's lean call (JAX's C++ dispatch, in Python): `lean(args)` runs a call of the
    jitted function through the backend's lean call (`launch`: CudaExecutable.lean_call) and
    returns its results, or returns None, having done nothing, where the call needs the usual
    path (`Jitted._call`). It is the usual path's signature check cut down to what can differ
    between a loop's calls; what is checked, and why:
    - in `Jitted.__call__`: no keywords, and the settings tracing reads unchanged since this
      program ran (`config.trace_version`), which with the checks here make the call's
      Signature this program's; no trace open: a jitted call inside a trace is traced through;
    - in `Compiled`: no effect token (then the backend has more to do than run the program),
      no static arguments (`_layout`: their values would need comparing) and, while
      `Compiled.lean` is this, no reference check or debug timing; captured constants (`consts`,
      the backend's buffers since the program was compiled) go before the arguments;
    - here: the arguments in the program's `layout` (lists and tuples of their class and
      length), every leaf an Array (`device_buffer_of` raises TypeError for anything else) of
      the program's argument type (a list at a time; a loop's results fed back, and the Arrays
      of the call that made this program the hot one, carry these very type objects,
      `arg_avals`, so they compare by identity); or, where the hot call (`hot`, from
      `_array_layout`) passed host scalars, whose class fixes their type, the leaves of the
      hot call's classes, its Arrays of its types (`_same_arrays`) and no scalar at a donated
      position: the backend gets the scalars and where they are (`hosts`).
    The backend checks its buffers (see the cuda executor's `_lean_call`): a host Array's or a
    deleted Array's (None) takes the usual path, which uploads it or says where it was donated,
    as an Array passed at two positions, one donated, does (the usual path copies it there).
    Once the call is queued the donated Arrays (`donated`: leaf positions) are deleted, as
    `Compiled._donate` deletes them.
    The outputs become Arrays as `wrap_results` makes them; a single output here, without its
    list and loop (they were a fifth of a tiny call's bytecodes).
    A program of one argument, no captured constants and no donation whose backend has a
    `launch_one` (CudaExecutable.lean_call_one: `launch([buffer], ())` without its lists) takes
    the call of one Array of the program's very argument type object (a loop's `z = f(z)`) to
    it, its buffer alone; any other call of it goes through the checks above."""
    flat = not any(layout)  # every argument a leaf: the arguments are the leaves
    single, unflatten = out_tree is LEAF, unflattener(out_tree)
    kept = frozenset(donated)  # (a donated scalar takes the usual path, which copies it)
    new, out_aval = Array.__new__, out_avals[0] if out_avals else None

    def results(outputs: list[Any]) -> Any:
        if single:
            array = new(Array)
            array._device = outputs[0]
            array.aval = out_aval
            array._value = array._donated_to = None
            return array
        return unflatten(wrap_results(outputs, out_avals))

    def lean(args: tuple, hot: tuple | None) -> Any:
        leaves = args if flat else _laid_out(args, layout)
        try:
            buffers = list(map(device_buffer_of, leaves))
        except TypeError:  # a leaf that is not an Array, or arguments not in the layout (None)
            leaves = _same_arrays(args, hot) if hot is not None and hot[4] else None
            if leaves is None or (donated and not kept.isdisjoint(hot[4])):
                return None
            # the Arrays' buffers and the scalars themselves (which have no `_device`)
            buffers, hosts = list(map(getattr, leaves, _DEVICE, leaves)), hot[4]
            if consts:
                hosts = [i + len(consts) for i in hosts]
        else:
            if list(map(_AVAL, leaves)) != arg_avals:
                return None
            hosts = ()
        outputs = launch(consts + buffers if consts else buffers, hosts)
        if outputs is None:
            return None
        if donated:
            delete_all(list(map(leaves.__getitem__, donated)), donated_to)
        return results(outputs)

    if launch_one is None or len(arg_avals) != 1 or not flat or consts or donated:
        return lean
    arg_aval = arg_avals[0]

    def lean_one(args: tuple, hot: tuple | None) -> Any:
        arg = args[0] if len(args) == 1 else None
        if arg.__class__ is not Array or arg.aval is not arg_aval:  # (a host scalar, an equal type, ...)
            return lean(args, hot)
        outputs = launch_one(arg._device)  # (None for a deleted or host Array: the backend declines)
        return None if outputs is None else results(outputs)

    return lean_one


def _no_lean(args: tuple, hot: tuple | None) -> None:
    """`Compiled.lean` where there is no lean call (or while it is off): every call takes the
    usual path."""
    return None


class Jitted:
    """The callable `glue.jit(f)` returns."""

    def __init__(self, fn: Callable, backend: str | None = None, static_argnums: Sequence[int] = (),
                 static_argnames: Sequence[str] = (), donate_argnums: Sequence[int] = (),
                 backend_options: dict[str, Any] | None = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.backend_name = backend
        self.backend_options = dict(backend_options or {})
        self.spec = _ArgSpec(fn, tuple(static_argnums), tuple(static_argnames))
        self.donate_argnums = tuple(sorted(_argnums(fn, "donate_argnums", donate_argnums)))
        both = self.spec.static_nums & set(self.donate_argnums)
        if both:
            raise GlueError(f"glue.jit({self.name}): argument {min(both)} is in both static_argnums and "
                            f"donate_argnums {describe_location(user_frame_location())}")
        self._traced: dict[Signature, tuple[ClosedGraph, PyTreeDef]] = {}
        self._trace_seconds: dict[Signature, float] = {}
        self._compiled: dict[Signature, Compiled] = {}
        # The last call's signature and program, and where its arguments were glue.Arrays and
        # scalars or flat lists or tuples of them, their layout, classes and avals (`_array_layout`):
        # a call passing Arrays of those types and scalars of those classes in that layout takes
        # the same program.
        self._hot: tuple[Signature | None, Any, tuple | None, int] = (None, None, None, -1)
        # The latest program with a lean call, the trace_version then and the hot layout.
        self._latest: tuple[Compiled | None, int, tuple | None] = (None, -1, None)
        self._last: Signature | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "fn")

    def trace(self, *args: Any, **kwargs: Any) -> tuple[ClosedGraph, PyTreeDef, Signature, list[Any]]:
        sig, leaves = self.spec.split(args, kwargs)
        if sig not in self._traced:
            if self._last is not None and current_trace() is None:
                log.info("glue.jit: retracing %s because %s", self.name, sig.explain_difference(self._last))
            flat = self.spec.flat_fn(sig)
            start = time.perf_counter()
            with profiler.span("compile", f"trace {self.name}"):
                closed = trace_flat(flat, sig.types, self.name)
            self._trace_seconds[sig] = time.perf_counter() - start
            self._traced[sig] = (closed, flat.out_tree[-1])
        if current_trace() is None:
            self._last = sig
        closed, out_tree = self._traced[sig]
        return closed, out_tree, sig, leaves

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        with _collections_paused():
            return self._lower(*args, **kwargs)

    def _lower(self, *args: Any, **kwargs: Any) -> Lowered:
        closed, out_tree, sig, _ = self.trace(*args, **kwargs)
        lowered = Lowered(self.name, closed, out_tree, sig, get_backend(self.backend_name),
                          self._donated_leaves(sig, args), self.spec, self.backend_options)
        lowered.trace_seconds = self._trace_seconds.get(sig, 0.0)
        return lowered

    def _donated_leaves(self, sig: Signature, args: tuple) -> tuple[int, ...]:
        """Positions among the graph's invars of the leaves of donated positional arguments."""
        if not self.donate_argnums:
            return ()
        positions, start = [], 0
        dyn = [i for i in range(len(args)) if i not in self.spec.static_nums]
        for i in dyn:
            n = len(tree_flatten(args[i])[0])
            if i in self.donate_argnums:
                positions.extend(range(start, start + n))
            start += n
        return tuple(positions)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The lean call (`_lean_call`: what it checks and why) of the program the latest call
        # ran, while the settings tracing reads are as they were then (`version`; -1: none).
        compiled, version, hot = self._latest
        if version == config.trace_version and not kwargs and not open_traces.traces:
            out = compiled.lean(args, hot)
            if out is not None:
                return out
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if current_trace() is not None:
            # Inlined by tracing straight through `fn`, so that an enclosing transform sees
            # every call it makes (stop_gradient records its cuts in the transform's trace).
            return self.fn(*args, **kwargs)
        hot_sig, compiled, hot_layout, hot_version = self._hot
        leaves = _same_arrays(args, hot_layout) \
            if hot_layout is not None and not kwargs and hot_version == config.trace_version else None
        if leaves is None:
            sig, leaves = self.spec.split(args, kwargs)
            if sig != hot_sig:  # a loop's calls pass the same type objects: compared without hashing
                compiled = self._compiled.get(sig)
                if compiled is None:
                    compiled = self._compiled[sig] = self.lower(*args, **kwargs).compile()
            version, hot = config.trace_version, _array_layout(leaves, sig, compiled.arg_avals)
            self._hot = (sig, compiled, hot, version)
            self._latest = (compiled, version, hot) if compiled.has_lean else (None, -1, None)
        if profiler.active() is None:
            return compiled.call_tree(leaves)
        with profiler.span("call", self.name):
            return compiled.call_tree(leaves)


def _layout(sig: Signature) -> list[tuple[type, int] | None] | None:
    """Where a signature's arguments are all positional and dynamic, each a leaf or a flat list
    or tuple of leaves: per argument None (a leaf) or (list or tuple, length). Else None."""
    args_tree, kwargs_tree = sig.treedef.children
    if sig.statics or kwargs_tree.children:
        return None
    layout: list[tuple[type, int] | None] = []
    for arg in args_tree.children:
        if arg.kind == "leaf":
            layout.append(None)
        elif arg.kind in ("list", "tuple") and all(c.kind == "leaf" for c in arg.children):
            layout.append((list if arg.kind == "list" else tuple, len(arg.children)))
        else:
            return None
    return layout


def _array_layout(leaves: Sequence[Any], sig: Signature, arg_avals: list[TensorType]) -> tuple | None:
    """(layout, classes, array positions, avals, scalar positions) when the arguments are laid
    out as `_layout` allows and every leaf is a hot leaf (a glue.Array, or a scalar whose class
    fixes its type: a NumPy scalar, a Python float or bool): the layout (None where every
    argument is a leaf), the leaves' classes, where the Arrays are among them (None:
    everywhere) and where the scalars are (a tuple), and the Arrays' avals,
    the program's `arg_avals` (`Compiled.arg_avals`), which the Arrays take as theirs (equal
    types: the signature is the program's), so that a loop's fixed arguments compare by
    identity from now on, as its results fed back do. Else None."""
    layout = _layout(sig)
    if layout is None or not all(map(_hot_leaf, leaves)):
        return None
    classes = [x.__class__ for x in leaves]
    at = [i for i, c in enumerate(classes) if c is Array]
    for i in at:
        leaves[i].aval = arg_avals[i]
    return (layout if any(layout) else None), classes, (None if len(at) == len(leaves) else at), \
        [arg_avals[i] for i in at], tuple(i for i, c in enumerate(classes) if c is not Array)


def _hot_leaf(x: Any) -> bool:
    """A leaf whose type the hot path can check cheaply: an Array (by its aval), or a scalar whose
    class alone decides its type (a Python int's dtype depends on its value)."""
    return x.__class__ is Array or x.__class__ in (float, bool) or isinstance(x, np.generic)


def _laid_out(args: tuple, layout: Sequence[tuple[type, int] | None]) -> list[Any] | None:
    """The leaves of `args` if they have this layout (from `_layout`), else None."""
    if len(args) != len(layout):
        return None
    leaves: list[Any] = []
    for a, form in zip(args, layout):
        if form is None:
            leaves.append(a)
        elif a.__class__ is form[0] and len(a) == form[1]:
            leaves.extend(a)
        else:
            return None
    return leaves


def _same_arrays(args: tuple, hot: tuple) -> Sequence[Any] | None:
    """The leaves of `args` if they have the layout of `hot` (from `_array_layout`): the same
    classes, and Arrays of the same avals (compared a list at a time: a loop passes back the very
    TensorType objects, which compare by identity before anything else), else None."""
    layout, classes, at, avals, _ = hot
    leaves = args if layout is None else _laid_out(args, layout)
    if leaves is None or list(map(type, leaves)) != classes:
        return None
    if list(map(_AVAL, leaves if at is None else map(leaves.__getitem__, at))) != avals:
        return None
    return leaves


def jit(fn: Callable | None = None, *, backend: str | None = None, static_argnums: Sequence[int] | int = (),
        static_argnames: Sequence[str] | str = (), donate_argnums: Sequence[int] | int = (),
        backend_options: dict[str, Any] | None = None) -> Any:
    """Compile `fn` for each signature it is called with (usable as `@jit` or `@jit(...)`).
    `backend_options` are the backend's Options fields (e.g. `{"arch": "sm_80"}` for cuda)."""
    as_tuple = lambda v: (v,) if isinstance(v, (int, str)) else tuple(v)  # noqa: E731
    if fn is None:
        return functools.partial(jit, backend=backend, static_argnums=static_argnums,
                                 static_argnames=static_argnames, donate_argnums=donate_argnums,
                                 backend_options=backend_options)
    return Jitted(fn, backend, as_tuple(static_argnums), as_tuple(static_argnames), as_tuple(donate_argnums),
                  backend_options)


def make_ir(fn: Callable, *, static_argnums: Sequence[int] | int = (),
            static_argnames: Sequence[str] | str = ()) -> Callable[..., ClosedGraph]:
    """`make_ir(f)(*args)` is the traced program of `f` at those arguments; print it for the IR."""
    jitted = fn if isinstance(fn, Jitted) else jit(fn, backend="reference", static_argnums=static_argnums,
                                                   static_argnames=static_argnames)

    def traced(*args: Any, **kwargs: Any) -> ClosedGraph:
        return jitted.trace(*args, **kwargs)[0]

    return traced
