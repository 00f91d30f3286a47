"""Property-testing helpers for glue users: hypothesis strategies for arrays and random programs,
and `check` / `check_graph`, which compare compiled results with the NumPy reference."""
from glue.reference.compare import tolerance_dtypes
from glue.testing.check import check, check_graph
from glue.testing.strategies import (HELPER_PRIMITIVES, arrays, dtypes, elements, graph_inputs, programs,
                                     programs_and_inputs, shapes)

__all__ = ["HELPER_PRIMITIVES", "arrays", "check", "check_graph", "dtypes", "elements", "graph_inputs",
           "programs", "programs_and_inputs", "shapes", "tolerance_dtypes"]
