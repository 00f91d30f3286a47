"""The text form of kernel IR (stage "kernels"): each shared subexpression printed once, what it
reads first (walked with an explicit stack, however deep the expressions)."""
from __future__ import annotations

from glue.scheduler.kernel_ir import (Clamp, Const, Dim, Div, Expr, FromValue, InBounds, Index,
                                      IndexValue, Kernel, Load, Mod, Op, RowValue, operands, postorder)


class _Printer:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.names: dict[Expr, str] = {}
        self.lines: list[str] = []

    def dim(self, k: int) -> str:
        p = len(self.kernel.parallel)
        return f"i{k}" if k < p else f"r{k - p}"

    def index(self, index: Index) -> str:
        parts = []
        for atom, c in index.terms:
            text = self.atom(atom)
            parts.append(text if c == 1 else f"{text}*{c}")
        if index.const or not parts:
            parts.append(str(index.const))
        return " + ".join(parts)

    def atom(self, atom) -> str:
        if isinstance(atom, Dim):
            return self.dim(atom.k)
        if isinstance(atom, Div):
            return f"({self.index(atom.index)})//{atom.divisor}"
        if isinstance(atom, Mod):
            return f"({self.index(atom.index)})%{atom.divisor}"
        if isinstance(atom, Clamp):
            return f"clamp({self.index(atom.index)}, {atom.size})"
        assert isinstance(atom, FromValue)
        return f"int({self.expr(atom.value)})"

    def mask(self, mask) -> str:
        return " if " + " and ".join(f"{lo} <= {self.index(i)} < {hi}" for i, lo, hi in mask) if mask else ""

    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return f"{e.value!r}:{e.dtype}"
        if isinstance(e, RowValue):
            return f"row{e.k}"
        for node in postorder(e, operands, self.names):
            if not isinstance(node, (Const, RowValue)):
                self.define(node)
        return self.names[e]

    def define(self, e: Expr) -> None:
        """Name `e` and print its line (what it reads is named already)."""
        if isinstance(e, Load):
            where = ", ".join(self.index(i) for i in e.index)
            text = f"load in{e.input}[{where}]" + (f"{self.mask(e.mask)} else {e.other!r}" if e.mask else "")
        elif isinstance(e, IndexValue):
            text = f"index {self.index(e.index)}"
        elif isinstance(e, InBounds):
            text = f"inbounds{self.mask(e.mask)[3:]}"
        else:
            assert isinstance(e, Op)
            params = " ".join(f"{k}={v}" for k, v in e.params)
            text = f"{e.primitive}{'[' + params + ']' if params else ''} " + " ".join(map(self.expr, e.args))
        name = self.names[e] = f"t{len(self.names)}"
        self.lines.append(f"    {name}:{e.dtype} = {text}")

    def render(self) -> str:
        k = self.kernel
        head = [f"kernel {k.name} {k.kind} parallel={list(k.parallel)} reduce={list(k.reduce)}"
                + (f" init=out0<-in{k.init}" if k.init is not None else "")
                + (f" precision={k.precision}" if k.precision else "")]
        head += [f"  in{i}: {b.type}" for i, b in enumerate(k.inputs)]
        head += [f"  out{i}: {b.type}" for i, b in enumerate(k.outputs)]
        for i, r in enumerate(k.reductions):
            value = self.expr(r.value)
            self.lines.append(f"  row{i}:{r.dtype} = {r.op} over r of {value}")
        for s in k.stores:
            value = self.expr(s.value)
            where = ", ".join(self.index(i) for i in s.index)
            op = "+=" if s.mode == "add" else "="
            self.lines.append(f"  out{s.output}[{where}] {op} {value}{self.mask(s.mask)}   ({s.level})")
        return "\n".join(head + self.lines)


def kernel_text(kernel: Kernel) -> str:
    return _Printer(kernel).render()
