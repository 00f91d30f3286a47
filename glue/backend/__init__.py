"""The backend contract (`contract.py`), the registry of backends, the disk cache (`cache.py`)
and result assembly (`results.py`): what the frontend sees of every backend.

Backends are found by name and imported only when asked for. A backend exists wherever its
module imports (the cuda backend lowers and prints PTX on a machine with no GPU); the default is
the first that can also run programs here: cuda, then cpu, then reference.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

from glue.backend.contract import Backend, Executable, Lowering, Options
from glue.errors import GlueError
from glue.settings import config

# name -> (module, class); modules are imported only when the backend is asked for.
_BACKENDS = {
    "reference": ("glue.backend.reference", "ReferenceBackend"),
    "cpu": ("glue.backend_cpu", "CpuBackend"),
    "cuda": ("glue.backend_cuda", "CudaBackend"),
}
_PREFERENCE = ("cuda", "cpu", "reference")


@lru_cache(maxsize=None)
def _backend_class(name: str) -> type[Backend] | None:
    module, cls = _BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None


def _runs_here(name: str) -> bool:
    cls = _backend_class(name)
    return cls is not None and cls.can_run()


def available_backends() -> list[str]:
    """The backends that can compile and run programs here."""
    return [name for name in _BACKENDS if _runs_here(name)]


def default_backend_name() -> str:
    """`glue.config.backend` (GLUE_BACKEND) if set, else cuda where a GPU is present, else cpu,
    else reference."""
    chosen = config.backend
    if chosen:
        return chosen
    return next(name for name in _PREFERENCE if _runs_here(name))


@lru_cache(maxsize=None)
def _instance(name: str) -> Backend:
    cls = _backend_class(name)
    if cls is None:
        raise GlueError(f"backend {name!r} cannot be loaded here (its module failed to import)")
    return cls()


def get_backend(name: str | None = None) -> Backend:
    """The backend called `name` (default: `default_backend_name()`). It can always lower;
    compiling for it needs `can_run()`."""
    name = name or default_backend_name()
    if name not in _BACKENDS:
        raise GlueError(f"unknown backend {name!r}; glue has {sorted(_BACKENDS)}")
    return _instance(name)


def runnable_backend(name: str | None, what: str) -> Backend:
    """The backend `name`, which must be able to run here for `what`."""
    target = get_backend(name)
    if not target.can_run():
        raise GlueError(f"{what}: backend {target.name!r} cannot run here ({target.why_not()})")
    return target


__all__ = ["Backend", "Executable", "Lowering", "Options", "available_backends", "default_backend_name",
           "get_backend", "runnable_backend"]
