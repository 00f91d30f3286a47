"""What a call runs of glue's own Python: the functions and the bytecodes, counted with
`sys.settrace`'s opcode events. For the tests that keep the cached call lean and the benchmark
that counts it (`python -m benchmarks host_call`); a guide to host cost, not a timing."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import glue

GLUE_SOURCES = os.path.dirname(glue.__file__) + os.sep


def traced(call: Callable[[], Any]) -> tuple[Any, set[str], int]:
    """(`call()`'s result, the qualified names of every function it ran, the bytecodes it ran in
    glue's own modules)."""
    names: set[str] = set()
    count = [0]

    def tracer(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
            names.add(frame.f_code.co_qualname)
        elif event == "opcode" and frame.f_code.co_filename.startswith(GLUE_SOURCES):
            count[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, names, count[0]
