"""`glue.lax`: JAX's lax primitives that glue.numpy does not spell the NumPy way.

Contractions take JAX's `precision` ("default", "high", "highest", `Precision.*`, or a pair)
and `preferred_element_type`; `default_matmul_precision` sets what "default" resolves to for
the contractions traced inside it.
"""
from __future__ import annotations

import contextlib
import enum
from typing import Any, Iterator

from glue.frontend.tracing import bind
from glue.ir import dtypes as dt
from glue.settings import config


class Precision(enum.Enum):
    """JAX's matmul precisions (on a GPU: DEFAULT and HIGH allow TF32 for float32, HIGHEST keeps
    full float32)."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"

    def __str__(self) -> str:
        return self.value


def dot_general(lhs: Any, rhs: Any, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None) -> Any:
    """Contract `lhs` and `rhs` over `((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`:
    the output holds the batch dims, then lhs's free dims, then rhs's (as jax.lax.dot_general)."""
    (lc, rc), (lb, rb) = dimension_numbers
    numbers = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
    preferred = None if preferred_element_type is None else dt.from_numpy(preferred_element_type)
    return bind("dot_general", lhs, rhs, dimension_numbers=numbers, precision=precision,
                preferred_element_type=preferred)


@contextlib.contextmanager
def default_matmul_precision(precision: Any) -> Iterator[None]:
    """Contractions traced inside that name no precision use `precision` (as
    jax.default_matmul_precision; the setting is also `glue.config.default_matmul_precision`)."""
    with config.override(default_matmul_precision=str(getattr(precision, "value", precision))):
        yield


__all__ = ["Precision", "default_matmul_precision", "dot_general"]
