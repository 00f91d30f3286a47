"""The disk cache of scheduled Plans: a large program traced again in a new process skips the
scheduler (its passes, attention tiling, rematerialisation, fusion, streams and memory), which
for a deep training step is most of a warm compile once its kernels' code is in the cache.

A Plan is stored pickled under the digest of everything it is made from: the traced Graph's
text form (every equation, param, literal and source line), the donated positions, the backend
and its options, the scheduler's own arguments, every `glue.config` setting that may change what
a pass does, and glue's source (`code_version`). The text is the key only where it is exact: a
graph with a param the printer does not write in full (anything but numbers, words, dtypes,
nested graphs and tuples of them) or a literal that is not a scalar is planned afresh. So is a
program of fewer than PLAN_CACHE_EQNS equations, whose scheduling costs less than the cache's
read, and one whose Plan will not pickle (a kernel too deep for the pickler). The ids of the
Vars a Plan holds are another process's: Vars made after it is read back start above them.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable

from glue.backend.cache import DiskCache, code_version, digest
from glue.ir import Graph
from glue.ir.core import Literal, reserve_var_ids, var_id_bound
from glue.ir.dtypes import DType
from glue.ir.printer import print_graph
from glue.scheduler.plan import Plan
from glue.settings import FLAGS, config

DISK = DiskCache("plan")
FORMAT = "plan 1"
PLAN_CACHE_EQNS = 100

# Settings that only observe or place a compile (logs, dumps, the cache itself, the checks
# beside each call) and cannot change a Plan; every other setting is part of the key, so a
# setting added later is in it unless it is named here.
_OBSERVERS = frozenset({"debug", "dump", "trace", "check", "cache_dir", "compile_workers", "cuda_poison",
                        "cuda_launch_blocking", "cuda_ptxas"})
_EXACT_PARAMS = (bool, int, float, str, type(None), DType)


def _exact(value: Any) -> bool:
    """Whether the text form writes param `value` in full."""
    if isinstance(value, tuple):
        return all(_exact(v) for v in value)
    if isinstance(value, Graph):
        return _exact_graph(value)
    return isinstance(value, _EXACT_PARAMS)


def _exact_graph(graph: Graph) -> bool:
    return all(all(_exact(v) for _, v in eqn.params)
               and all(a.type.shape == () for a in eqn.inputs if isinstance(a, Literal))
               for eqn in graph.eqns) and all(a.type.shape == () for a in graph.outvars if isinstance(a, Literal))


def plan_key(graph: Graph, backend: str, options_key: str, donated: tuple[int, ...], scheduler: str) -> bytes | None:
    """The cache key of `graph`'s Plan, or None where there is no disk cache, the graph is too
    small or its text is not exact. `scheduler` names the scheduler's own arguments (streams,
    attention policy)."""
    if DISK.directory() is None or len(graph.eqns) < PLAN_CACHE_EQNS or not _exact_graph(graph):
        return None
    settings = repr(sorted((name, config.read(name)) for name in FLAGS if name not in _OBSERVERS))
    return digest(FORMAT, code_version(), backend, options_key, repr(donated), scheduler, settings,
                  print_graph(graph))


def cached_plan(key: bytes | None, build: Callable[[], Plan]) -> tuple[Plan, bool]:
    """The Plan stored under `key`, else `build()`'s (stored for the next process); and whether
    it came from the cache."""
    if key is None:
        return build(), False
    payload = DISK.load(key)
    if payload is not None:
        try:
            bound, plan = pickle.loads(payload)
        except Exception:  # an entry this glue cannot read back: it is rebuilt and replaced
            plan = None
        if isinstance(plan, Plan):
            reserve_var_ids(bound)
            return plan, True
    plan = build()
    try:
        # stored with a bound on the Var ids it holds, so that Vars made after it is read back
        # (a call body's passes) never take one of them
        payload = pickle.dumps((var_id_bound(), plan), protocol=pickle.HIGHEST_PROTOCOL)
    except RecursionError:
        return plan, False
    DISK.store(key, payload)
    return plan, False


__all__ = ["PLAN_CACHE_EQNS", "cached_plan", "plan_key"]
