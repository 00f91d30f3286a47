"""The `cuda` backend: NVIDIA GPUs through LLVM's NVPTX target and the CUDA driver API.

`runtime/` holds what runs programs (contexts, modules, launches, allocator, streams, transfers,
device buffers); `ptx.py` turns LLVM IR into PTX. Kernel code generation is not built yet, so
`CudaBackend.lower` refuses every program for now.
"""
from __future__ import annotations

from typing import Sequence

from glue.backend_cuda.runtime import driver
from glue.errors import BackendError
from glue.ir import Graph


class CudaBackend:
    name = "cuda"

    @staticmethod
    def is_available() -> bool:
        """True only when the NVIDIA driver initialises and a GPU exists; never raises."""
        return driver.available()

    def lower(self, graph: Graph, *, donated: Sequence[int] = (), name: str = "fn"):
        raise BackendError(f"kernel code generation for cuda is not built yet (lowering {name!r})")
