"""Every flag and tuning knob of glue in one table, read from the environment, `glue.config.update`
or a `glue.config.override(...)` block (in that order of precedence: override, update, environment,
default).

    glue.config.cuda_graphs                 # the value now (GLUE_CUDA_GRAPHS, else True)
    glue.config.update("debug", 2)          # for the rest of the process (glue.config is this module's `config`)
    with glue.config.override(check=True):  # for a block (tests); restored on exit
        ...

Values are parsed when read, so a bad environment value raises a `GlueError` naming the variable
at the first use rather than a ValueError deep inside a backend. JAX's spellings of the flags glue
shares with it (`jax_enable_x64`, `jax_default_matmul_precision`, `jax_threefry_partitionable`)
are accepted as aliases.
`GLUE_DEBUG` levels: 1 logs each compiled program's kernels and each call's timing, 2 also every
stage's text, 3 also the generated code.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from glue.errors import GlueError


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 0/1 or true/false, got {text!r}")


def _int(text: str) -> int:
    return int(text.strip(), 0)


def _optional_int(text: str) -> int | None:
    return _int(text) if text.strip() else None


def _text(text: str) -> str:
    return text


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {text!r}")
        return value
    return parse


@dataclass(frozen=True)
class Flag:
    """One setting: its name, the environment variable that sets it, its default and parser."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    env: str | None = None  # None: GLUE_<NAME>
    traced: bool = False  # changes what tracing records: part of every jit cache key

    @property
    def variable(self) -> str:
        return self.env or f"GLUE_{self.name.upper()}"


_FLAGS: tuple[Flag, ...] = (
    # what runs, and what it shows
    Flag("backend", None, _text, "default backend: cuda | cpu | reference (else cuda where a GPU is, else cpu)"),
    Flag("debug", 0, _int, "log level: 1 kernels and call timings, 2 every stage's text, 3 generated code"),
    Flag("dump", None, _text, "directory that receives every stage of every compiled program"),
    Flag("trace", None, _text, "write a Chrome trace of the whole process to this path at exit"),
    Flag("check", False, _bool, "run the reference beside every compiled call and raise on a mismatch"),
    Flag("verify", False, _bool, "run the IR verifier after every scheduler pass"),
    Flag("cache_dir", os.path.join("~", ".cache", "glue"), _text,
         "root of the disk cache of compiled code; empty turns it off"),
    Flag("compile_workers", None, _optional_int,
         "processes that run LLVM side by side in a cold compile (default: the usable cores; 1: "
         "in this process)"),
    # numerics
    Flag("enable_x64", False, _bool, "keep float64/int64 inputs wide (else they become 32-bit, as in JAX)",
         env="JAX_ENABLE_X64", traced=True),
    Flag("threefry_partitionable", True, _bool,
         "glue.random hashes each element's index (JAX's default since 0.5); off: JAX's earlier scheme",
         env="JAX_THREEFRY_PARTITIONABLE", traced=True),
    Flag("default_matmul_precision", "default", _choice("default", "high", "highest", "bfloat16", "tensorfloat32",
                                                          "float32"),
         "precision of float32 contractions when a call names none (JAX's values)", traced=True),
    # the cpu backend
    Flag("cpu_threads", None, _optional_int, "threads a CPU kernel is split over (default: the usable cores)"),
    Flag("cpu_parallel_threshold", 400_000, _int,
         "estimated operations below which a CPU kernel runs on the calling thread"),
    Flag("cpu_stream_bytes", 8 << 20, _int,
         "outputs at least this large are written with non-temporal (streaming) stores on the CPU"),
    Flag("cpu_matmul_l1_bytes", 16 << 10, _int, "bytes of one packed B panel (KC x NR): half the L1 data cache"),
    Flag("cpu_matmul_l2_bytes", 256 << 10, _int, "bytes of packed B (KC x NC) a unit keeps hot: half the L2"),
    Flag("cpu_matmul_sums_bytes", 1 << 20, _int, "bytes of partial sums a CPU matmul unit keeps (MB x NC)"),
    Flag("cpu_matmul_min_work", 16 << 10, _int,
         "multiply-adds below which a CPU contraction uses the plain per-element loops"),
    Flag("cpu_unfused_attention_bytes", 96 << 20, _int,
         "attention whose B x N x T x S scores take at most this many bytes runs as the plain math on "
         "the CPU (its scores in memory); longer attention runs as the tiled scans (memory O(T))"),
    # the cuda backend
    Flag("cuda_graphs", True, _bool, "capture each program as a CUDA graph and replay it"),
    Flag("cuda_pdl", True, _bool, "programmatic dependent launches on sm_90"),
    Flag("cuda_streams", 4, _int,
         "at most how many streams a program's independent kernels spread over (fewer where more "
         "would hold much more memory: glue/scheduler/plan.py)"),
    Flag("cuda_poison", None, _optional_int, "fill outputs and the arena with this byte before each call"),
    Flag("cuda_launch_blocking", False, _bool, "synchronise after every launch (faults name their kernel)"),
    Flag("cuda_ptxas", True, _bool,
         "compile kernels with the ptxas on the PATH, where there is one, several at a time, and keep the "
         "machine code in the disk cache (False: the driver's JIT, which compiles one kernel at a time)"),
    Flag("arch", None, _text, "PTX target when lowering for cuda (default: the GPU's, else sm_90)"),
    Flag("cuda_online_row_elements", 65536, _int,
         "rows longer than this fold their max and sum of exponentials in one pass on the GPU"),
    Flag("cuda_tensor_cores", True, _bool,
         "glue's own kernels multiply 16-bit operands on tensor cores (mma.sync, sm_80 on)"),
    Flag("cuda_wgmma", True, _bool,
         "on sm_90a, contractions and the flash forward run on warpgroup tensor cores (wgmma, TMA); "
         "False keeps them on mma.sync"),
    Flag("cuda_mma_tile", None, _text,
         "tensor-core tile, BMxBNxBK/WARPS_MxWARPS_N (e.g. 128x128x32/2x2), used for every product it can serve, "
         "small ones too (default: chosen by the product's size)"),
    Flag("autotune", True, _bool,
         "race glue's contraction kernel (in the tilings its cost model finds close, for large products) against "
         "cuBLASLt's variants and algorithms per contraction shape; off: the library's first algorithm, and glue's "
         "kernel in the cost model's tiling"),
    Flag("gemm", "auto", _choice("auto", "library", "codegen"),
         "who serves contractions on the GPU: the faster per shape, cuBLASLt, or glue's own kernels"),
    # scheduler knobs
    Flag("fold_limit", 1 << 12, _int, "largest constant (elements) the folding pass evaluates"),
    Flag("recognize_attention", True, _bool,
         "rewrite hand-written attention (scores, softmax, product with v) to attention equations (flash kernels "
         "on the GPU, else the plain math or tiled scans by the size of the scores)",
         traced=True),
)

FLAGS: dict[str, Flag] = {f.name: f for f in _FLAGS}
ALIASES = {"jax_enable_x64": "enable_x64", "jax_default_matmul_precision": "default_matmul_precision",
           "jax_threefry_partitionable": "threefry_partitionable",
           "jax_platform_name": "backend", "jax_platforms": "backend"}


class _Overrides(threading.local):
    def __init__(self) -> None:
        self.stack: list[dict[str, Any]] = []


class Config:
    """The settings; attribute access reads one (`glue.config.debug`)."""

    def __init__(self) -> None:
        self._updates: dict[str, Any] = {}
        self._overrides = _Overrides()
        # Bumped whenever a setting that tracing reads may have changed, so a jit cache can
        # tell with one comparison whether its last trace still holds.
        self.trace_version = 0
        self._context: tuple[int, tuple[Any, ...]] | None = None

    def trace_context(self) -> tuple[Any, ...]:
        """The values of the settings tracing reads (part of every jit cache key)."""
        cached = self._context
        if cached is not None and cached[0] == self.trace_version:
            return cached[1]
        values = tuple(self.read(f.name) for f in _FLAGS if f.traced)
        self._context = (self.trace_version, values)
        return values

    @staticmethod
    def _flag(name: str) -> Flag:
        flag = FLAGS.get(ALIASES.get(name, name))
        if flag is None:
            raise GlueError(f"glue.config has no setting {name!r}; settings: {sorted(FLAGS)}")
        return flag

    def read(self, name: str) -> Any:
        flag = self._flag(name)
        for layer in reversed(self._overrides.stack):
            if flag.name in layer:
                return layer[flag.name]
        if flag.name in self._updates:
            return self._updates[flag.name]
        text = os.environ.get(flag.variable)
        if text is None:
            return flag.default
        try:
            return flag.parse(text)
        except ValueError as exc:
            raise GlueError(f"environment variable {flag.variable}={text!r} is not valid for "
                            f"glue.config.{flag.name} ({flag.doc}): {exc}") from None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.read(name)

    def _checked(self, flag: Flag, value: Any) -> Any:
        return flag.parse(value) if isinstance(value, str) and flag.parse is not _text else value

    def update(self, name: str, value: Any) -> None:
        """Set `name` for the rest of the process (as `jax.config.update`)."""
        flag = self._flag(name)
        try:
            self._updates[flag.name] = self._checked(flag, value)
        except ValueError as exc:
            raise GlueError(f"glue.config.update({name!r}, {value!r}): {exc}") from None
        self.trace_version += flag.traced

    def reset(self) -> None:
        """Forget every `update` (back to the environment and the defaults)."""
        self.trace_version += any(FLAGS[name].traced for name in self._updates)
        self._updates.clear()

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[None]:
        """Settings for the duration of a `with` block, in this thread."""
        layer = {}
        for name, value in values.items():
            flag = self._flag(name)
            try:
                layer[flag.name] = self._checked(flag, value)
            except ValueError as exc:
                raise GlueError(f"glue.config.override({name}={value!r}): {exc}") from None
        traced = any(FLAGS[name].traced for name in layer)
        self._overrides.stack.append(layer)
        self.trace_version += traced
        try:
            yield
        finally:
            self._overrides.stack.pop()
            self.trace_version += traced

    def describe(self) -> str:
        """Every setting, its value now, its variable and what it does."""
        return "\n".join(f"{f.name} = {self.read(f.name)!r}  ({f.variable}) {f.doc}" for f in _FLAGS)


config = Config()

__all__ = ["ALIASES", "Config", "FLAGS", "Flag", "config"]
