"""The `reference` backend: `glue.jit(f, backend="reference")` runs the Graph with NumPy.

It has no stages of its own: the program it runs is the traced Graph itself (`glue.reference`
defines what every primitive computes). Its analyses describe the interpreter's own work: it
keeps every value of the program alive, and does each equation's arithmetic once.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from glue.backend.contract import Backend, Lowering
from glue.codegen.analysis import CostAnalysis, MemoryAnalysis
from glue.ir import Graph, Var, primitive
from glue.reference.interpreter import run_graph


class ReferenceExecutable:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.kernels: list[Any] = []

    def __call__(self, *args: Any) -> list[np.ndarray]:
        return run_graph(self.graph, args)

    def memory_analysis(self) -> MemoryAnalysis:
        graph = self.graph
        arguments = sum(v.type.nbytes for v in graph.constvars + graph.invars)
        values = sum(v.type.nbytes for e in graph.eqns for v in e.outvars)
        outputs = sum(a.type.nbytes for a in graph.outvars if isinstance(a, Var))
        return MemoryAnalysis(arguments + values, arguments + values, values, arguments, outputs, 0)

    def cost_analysis(self) -> CostAnalysis:
        flops = transcendentals = traffic = 0.0
        for eqn in self.graph.eqns:
            prim = primitive(eqn.primitive)
            out = eqn.outvars[0].type
            traffic += sum(a.type.nbytes for a in eqn.inputs) + sum(v.type.nbytes for v in eqn.outvars)
            if prim.kind == "contraction":
                (lhs, _), ((contract, _), _) = eqn.inputs, eqn.param_dict["dimension_numbers"]
                flops += 2.0 * out.size * math.prod(lhs.type.shape[a] for a in contract)
            elif prim.expensive and out.dtype.is_float:
                transcendentals += out.size
            elif out.dtype.is_float and not prim.moves_data_only:
                flops += max(out.size, eqn.inputs[0].type.size if prim.fold else 0)
        return CostAnalysis(flops, transcendentals, traffic)


class ReferenceBackend(Backend):
    name = "reference"

    def add_stages(self, lowering: Lowering) -> None:
        pass  # it runs the Graph as traced

    def load(self, lowering: Lowering) -> ReferenceExecutable:
        return ReferenceExecutable(lowering.graph)
