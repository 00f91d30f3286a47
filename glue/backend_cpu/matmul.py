"""Cache-blocked, vectorised code for contractions (placeholder until written)."""
from __future__ import annotations


def blocked_contraction(module, kernel, symbol, inputs, outputs, vector_bits):
    return None
