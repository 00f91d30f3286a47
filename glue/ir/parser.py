"""Parser for the IR text form written by `glue.ir.printer`: `parse(str(graph)) == graph`."""
from __future__ import annotations

import json
import re
from typing import Any

from glue.errors import GlueTypeError, ParseError
from glue.ir.core import Atom, Eqn, Graph, Literal, TensorType, Var, literal_problem, params_tuple, shape_problem
from glue.ir.dtypes import BY_NAME, DType
from glue.ir.primitives import infer_types

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<comment>\#[^\n]*)
  | (?P<num>-?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|inf\b|nan\b))
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<text>"(?:[^"\\\n]|\\.)*")
  | (?P<punct>[{}()\[\],:=;.])
""", re.VERBOSE)


# Param values nest tuples this deep at most (dot_general's dimension_numbers: three); deeper
# text is malformed, and is rejected before it could exhaust Python's recursion limit.
MAX_NESTING = 16


class _Tokens:
    def __init__(self, text: str):
        self.items: list[tuple[str, str, int]] = []
        pos, line = 0, 1
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ParseError(f"unexpected character {text[pos]!r} at line {line}")
            if m.lastgroup != "space":
                self.items.append((m.lastgroup, m.group(), line))
            line += m.group().count("\n")
            pos = m.end()
        self.i = 0

    def peek(self, offset: int = 0) -> tuple[str, str, int]:
        j = self.i + offset
        return self.items[j] if j < len(self.items) else ("end", "", -1)

    def next(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        kind, value, line = self.next()
        if value != text:
            raise ParseError(f"expected {text!r} but found {_shown(value)} {_at(line)}")

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text:
            self.i += 1
            return True
        return False


def _at(line: int) -> str:
    return "at the end of the text" if line < 0 else f"at line {line}"


def _shown(value: str) -> str:
    return repr(value) if value else "nothing"


class _Parser:
    def __init__(self, text: str):
        self.toks = _Tokens(text)
        self.env: dict[str, Var] = {}

    def fail(self, what: str) -> ParseError:
        _, value, line = self.toks.peek()
        return ParseError(f"expected {what} but found {_shown(value)} {_at(line)}")

    def error(self, message: str) -> ParseError:
        """An error about the token just read."""
        return ParseError(f"{message} {_at(self.toks.peek(-1)[2])}")

    def name(self) -> str:
        kind, value, _ = self.toks.peek()
        if kind != "name":
            raise self.fail("a name")
        self.toks.next()
        return value

    def int_(self) -> int:
        kind, value, _ = self.toks.next()
        if kind != "num" or not re.fullmatch(r"-?\d+", value):
            raise self.error(f"expected an integer but found {_shown(value)}")
        return int(value)

    def dtype(self) -> DType:
        name = self.name()
        if name not in BY_NAME:
            raise self.error(f"unknown dtype {name!r}")
        return BY_NAME[name]

    def type_(self) -> TensorType:
        dtype = self.dtype()
        self.toks.expect("[")
        dims = []
        while not self.toks.accept("]"):
            dims.append(self.int_())
            self.toks.accept(",")
        problem = shape_problem(tuple(dims), dtype)
        if problem:
            raise self.error(problem)
        return TensorType(tuple(dims), dtype)

    def binder(self) -> tuple[str, TensorType]:
        name = self.name()
        self.toks.expect(":")
        return name, self.type_()

    def define(self, name: str, type_: TensorType) -> Var:
        if name in self.env:
            raise self.error(f"variable {name!r} is defined twice")
        var = self.env[name] = Var(type_)
        return var

    def binders_until(self, stop: str) -> tuple[Var, ...]:
        out = []
        while self.toks.peek()[1] != stop:
            out.append(self.define(*self.binder()))
        self.toks.expect(stop)
        return tuple(out)

    def scalar(self, kind: str, text: str) -> Any:
        if kind == "num" or text in ("inf", "nan"):
            return float(text) if re.search(r"[.eE]|inf|nan", text) else int(text)
        if text in ("True", "False"):
            return text == "True"
        raise self.error(f"expected a scalar but found {_shown(text)}")

    def atom(self) -> Atom:
        kind, text, line = self.toks.next()
        if kind == "name" and text in self.env and self.toks.peek()[1] != ":":
            return self.env[text]
        if kind in ("num", "name") and self.toks.accept(":"):
            dtype = self.dtype()
            value = self.scalar(kind, text)
            problem = literal_problem(value, dtype)
            if problem:
                raise self.error(f"bad literal {text}:{dtype}: {problem}")
            cast = bool if dtype.kind == "bool" else int if dtype.is_int else float
            return Literal(cast(value), TensorType((), dtype))
        raise ParseError(f"unknown variable or bad literal {_shown(text)} {_at(line)}")

    def param_value(self, depth: int = 0) -> Any:
        if self.toks.peek()[1] == "{":  # a graph param (a body or branch), with names of its own
            outer, self.env = self.env, {}
            try:
                return self.graph()
            finally:
                self.env = outer
        kind, text, line = self.toks.next()
        if text == "(":
            if depth == MAX_NESTING:
                raise self.error(f"parameter tuples nested deeper than {MAX_NESTING}")
            items = []
            while not self.toks.accept(")"):
                items.append(self.param_value(depth + 1))
                self.toks.accept(",")
            return tuple(items)
        if kind == "name" and text in BY_NAME:
            return BY_NAME[text]
        if text == "None":
            return None
        if kind == "text":
            return json.loads(text)
        if kind == "name" and text not in ("True", "False", "inf", "nan"):
            return text  # a word-valued param (a precision)
        return self.scalar(kind, text)

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.toks.accept("["):
            while not self.toks.accept("]"):
                key = self.name()
                self.toks.expect("=")
                out[key] = self.param_value()
        return out

    def eqn(self) -> Eqn:
        binders = []
        while self.toks.peek()[1] != "=":
            binders.append(self.binder())
        self.toks.expect("=")
        prim = self.name()
        params = self.params()
        line = self.toks.peek(-1)[2]
        inputs = []
        while self.toks.peek()[0] in ("name", "num") and self.toks.peek()[2] == line:
            inputs.append(self.atom())
        source = self.toks.next()[1][1:].strip() if self.toks.peek()[0] == "comment" else None
        outvars = tuple(self.define(*b) for b in binders)
        try:
            out_types = infer_types(prim, tuple(a.type for a in inputs), params, source)
        except GlueTypeError as err:
            raise ParseError(f"{err} {_at(line)}") from None
        if tuple(v.type for v in outvars) != out_types:
            raise ParseError(f"{prim} produces {' '.join(map(str, out_types))}, but the text declares "
                             f"{' '.join(str(v.type) for v in outvars) or 'no result'} {_at(line)}")
        return Eqn(prim, tuple(inputs), params_tuple(params), outvars, source or None)

    def graph(self) -> Graph:
        self.toks.expect("{")
        if self.name() != "lambda":
            raise self.error("a graph starts with '{ lambda'")
        constvars = self.binders_until(";")
        invars = self.binders_until(".")
        if self.name() != "let":
            raise self.error("expected 'let' after the arguments")
        eqns = []
        while not (self.toks.peek()[1] == "in" and self.toks.peek(1)[1] == "("):
            if self.toks.peek()[0] == "end":
                raise self.fail("'in ('")
            eqns.append(self.eqn())
        self.toks.next()
        self.toks.expect("(")
        outvars = []
        while not self.toks.accept(")"):
            outvars.append(self.atom())
            self.toks.accept(",")
        self.toks.expect("}")
        return Graph(constvars, invars, tuple(eqns), tuple(outvars))


def parse(text: str) -> Graph:
    """The Graph that `text` (in the printer's form) describes; a ParseError if it is malformed."""
    if not isinstance(text, str):
        raise ParseError(f"glue.ir.parse reads a str, not {type(text).__name__}")
    parser = _Parser(text)
    graph = parser.graph()
    if parser.toks.peek()[0] != "end":
        raise parser.fail("the end of the text")
    return graph
