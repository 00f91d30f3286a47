"""The IR's text form (jaxpr-like): stable variable names, params in brackets, source lines.

```
{ lambda ; a:f32[8,16] b:f32[16] . let
    c:f32[8,16] = broadcast_in_dim[dims=(1,) shape=(8, 16)] b
    d:f32[8,16] = add a c                        # model.py:12
  in (d) }
```
`glue.ir.parse` reads exactly this form back.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from glue.ir.core import Atom, Graph, Literal, Var
from glue.ir.dtypes import BY_NAME, DType

_KEYWORDS = {"in", "let", "lambda", "inf", "nan"}  # names the parser would read as something else
_SOURCE_COLUMN = 56
# Words the parser reads as something other than a word-valued param.
_NOT_WORDS = {"True", "False", "None", "inf", "nan"} | set(BY_NAME)


def var_names():
    """a, b, ..., z, ba, bb, ... (JAX's scheme), skipping the text form's keywords."""
    n = 0
    while True:
        name, k = "", n
        while True:
            name = chr(ord("a") + k % 26) + name
            k //= 26
            if k == 0:
                break
        n += 1
        if name not in _KEYWORDS:
            yield name


def format_param(value: Any) -> str:
    """A param value in the text form: ints, floats, bools, words, quoted text, dtypes, graphs
    and (nested) tuples."""
    if isinstance(value, DType):
        return value.name
    if isinstance(value, Graph):  # a body or branch: its own text, on its own lines
        return "\n        ".join(print_graph(value).split("\n"))
    if isinstance(value, tuple):
        inner = ", ".join(format_param(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, str):  # a word (a precision) is written bare, other text quoted
        bare = re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", value) and value not in _NOT_WORDS
        return value if bare else json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return repr(value)


def graph_var_names(graph: Graph) -> dict[int, str]:
    """The name the printer gives each Var of `graph`, by Var id."""
    fresh = var_names()
    every = graph.constvars + graph.invars + tuple(v for e in graph.eqns for v in e.outvars)
    return {v.id: next(fresh) for v in every}


def print_graph(graph: Graph) -> str:
    names = graph_var_names(graph)

    def define(v: Var) -> str:
        return f"{names[v.id]}:{v.type}"

    def use(a: Atom) -> str:
        return str(a) if isinstance(a, Literal) else names.get(a.id, f"<undefined#{a.id}>")

    consts = " ".join(define(v) for v in graph.constvars)
    args = " ".join(define(v) for v in graph.invars)
    lines = [f"{{ lambda {consts}{' ' if consts else ''}; {args}{' ' if args else ''}. let"]
    for eqn in graph.eqns:
        params = " ".join(f"{k}={format_param(v)}" for k, v in eqn.params)
        inputs = " ".join(use(a) for a in eqn.inputs)
        outs = " ".join(define(v) for v in eqn.outvars)
        line = f"    {outs} = {eqn.primitive}{'[' + params + ']' if params else ''} {inputs}".rstrip()
        if eqn.source:
            line = f"{line.ljust(_SOURCE_COLUMN)} # {eqn.source}"
        lines.append(line)
    lines.append(f"  in ({', '.join(use(a) for a in graph.outvars)}) }}")
    return "\n".join(lines)
