"""The NumPy reference: executes any Graph and defines what every primitive means."""
from glue.reference.impls import IMPLS
from glue.reference.interpreter import evaluate_eqn, run_graph
from glue.reference import attention, control  # noqa: F401  (fill IMPLS for attention, control flow, calls)

__all__ = ["IMPLS", "evaluate_eqn", "run_graph"]
