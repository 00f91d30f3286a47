"""The tensor IR: dtypes, types, primitives with their shape rules, Graphs, text form, verifier."""
from glue.ir import dtypes
from glue.ir.core import Atom, ClosedGraph, Eqn, Graph, Literal, TensorType, Var, params_tuple
from glue.ir.dtypes import DType
from glue.ir.parser import parse
from glue.ir.primitives import PRIMITIVES, Primitive, RuleTable, every_primitive, infer_type, infer_types, primitive
from glue.ir.printer import print_graph
from glue.ir.verifier import verify

__all__ = ["Atom", "ClosedGraph", "DType", "Eqn", "Graph", "Literal", "PRIMITIVES", "Primitive",
           "RuleTable", "TensorType", "Var", "dtypes", "every_primitive", "infer_type", "infer_types", "primitive", "params_tuple", "parse", "print_graph",
           "verify"]
