"""Which backends exist, which one is the default, and how to get one by name."""
from __future__ import annotations

import importlib
import os
from functools import lru_cache
from typing import Any

import numpy as np

from glue.errors import GlueError

# name -> (module, class); modules are imported only when the backend is asked for.
_BACKENDS = {
    "reference": ("glue.reference.backend", "ReferenceBackend"),
    "cpu": ("glue.backend_cpu", "CpuBackend"),
    "cuda": ("glue.backend_cuda", "CudaBackend"),
}


@lru_cache(maxsize=None)
def _backend_class(name: str) -> Any | None:
    module, cls = _BACKENDS[name]
    try:
        backend = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None
    return backend if backend.is_available() else None


def available_backends() -> list[str]:
    return [name for name in _BACKENDS if _backend_class(name) is not None]


def default_backend_name() -> str:
    """`GLUE_BACKEND` if set, else cuda where a GPU is present, else cpu, else reference."""
    chosen = os.environ.get("GLUE_BACKEND")
    if chosen:
        return chosen
    return next(name for name in ("cuda", "cpu", "reference") if _backend_class(name) is not None)


@lru_cache(maxsize=None)
def get_backend(name: str | None = None) -> Any:
    name = name or default_backend_name()
    if name not in _BACKENDS:
        raise GlueError(f"unknown backend {name!r}; glue has {sorted(_BACKENDS)}")
    cls = _backend_class(name)
    if cls is None:
        raise GlueError(f"backend {name!r} is not available here; available: {available_backends()}")
    return cls()


def device_put(value: Any, backend: str | None = None) -> Any:
    """`value` as a `glue.Array` in the memory `backend` (default: the default backend) computes
    in: GPU memory for cuda, host memory otherwise. Inputs that many calls use are worth putting
    there once, as with `jax.device_put`: a NumPy argument is uploaded again at every call."""
    put = getattr(get_backend(backend), "device_put", None)
    if put is not None:
        return put(value)
    from glue.frontend.array import Array

    return value if isinstance(value, Array) else Array(np.asarray(value))
