"""The `reference` backend: `glue.jit(f, backend="reference")` runs the Graph with NumPy."""
from __future__ import annotations

from typing import Any, Sequence

from glue.frontend.array import Array
from glue.ir import Graph
from glue.reference.interpreter import run_graph


class ReferenceExecutable:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.kernels: list[Any] = []

    def __call__(self, *args: Any) -> list[Array]:
        return [Array(out) for out in run_graph(self.graph, args)]


class ReferenceLowered:
    stages: tuple[str, ...] = ()

    def __init__(self, graph: Graph):
        self.graph = graph

    def as_text(self, stage: str) -> str:
        raise KeyError(stage)

    def compile(self) -> ReferenceExecutable:
        return ReferenceExecutable(self.graph)


class ReferenceBackend:
    name = "reference"

    @staticmethod
    def is_available() -> bool:
        return True

    def lower(self, graph: Graph, *, donated: Sequence[int] = (), name: str = "fn") -> ReferenceLowered:
        return ReferenceLowered(graph)
