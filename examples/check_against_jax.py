"""Run each example under glue and under JAX and print the two loss curves side by side.

Needs jax installed (the GPU machine has it). Each example's source is executed twice: as it
is, and with its import lines rewritten from glue to jax (`import glue as jax` becomes
`import jax as jax`, `from glue.scipy.special import logsumexp` becomes `from jax.scipy...`).
Nothing but the import statements is touched, and a program that names glue anywhere else in
its code is refused, since then it would not be the same program under JAX. Float32
contractions run at "highest" precision on both sides (JAX's GPU default would be TF32).

    python -m examples.check_against_jax                 # every example, 10 steps
    python -m examples.check_against_jax gpt --steps 20 --backend cpu

The exit status is 1 when some step's losses differ by more than --rtol.
"""
from __future__ import annotations

import argparse
import ast
import io
import pathlib
import re
import sys
import tokenize
import types
from typing import Callable

EXAMPLES = ("mnist_mlp", "gpt", "char_rnn")
HERE = pathlib.Path(__file__).resolve().parent


def import_lines(source: str) -> set[int]:
    """The (1-based) line numbers that the module's top-level import statements span."""
    lines: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def swap_imports(source: str, old: str = "glue", new: str = "jax") -> str:
    """`source` with the package `old` replaced by `new` in its import statements only. Raises
    ValueError when `old` is named anywhere else in the code (comments and strings aside)."""
    imports = import_lines(source)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string == old and tok.start[0] not in imports:
            raise ValueError(f"line {tok.start[0]} names {old} outside the imports: {tok.line.strip()!r}")
    word = re.compile(rf"\b{re.escape(old)}\b")
    lines = source.splitlines(keepends=True)
    return "".join(word.sub(new, line) if i in imports else line for i, line in enumerate(lines, start=1))


def load(name: str, source: str) -> types.ModuleType:
    """A module executed from `source`, registered while it runs (decorators and dataclasses
    look their module up)."""
    module = types.ModuleType(f"_checked_{name}")
    module.__file__ = str(HERE / f"{name}.py")
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def losses_of(name: str, steps: int, seed: int, rewrite: Callable[[str], str] = lambda s: s) -> list[float]:
    source = (HERE / f"{name}.py").read_text()
    return [float(v) for v in load(name, rewrite(source)).main(steps=steps, seed=seed)]


def compare(glue_losses: list[float], jax_losses: list[float], rtol: float) -> tuple[str, bool]:
    """A table of both curves and their relative difference; and whether all are within rtol."""
    rows = ["step        glue         jax    rel diff"]
    ok = len(glue_losses) == len(jax_losses)
    for step, (g, j) in enumerate(zip(glue_losses, jax_losses)):
        diff = abs(g - j) / max(abs(j), 1e-12)
        ok &= diff <= rtol
        rows.append(f"{step:4d}  {g:10.6f}  {j:10.6f}  {diff:10.2e}{'  <-' if diff > rtol else ''}")
    return "\n".join(rows), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", help=f"which of {', '.join(EXAMPLES)} (default: all)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default=None, help="glue's backend (default: the best available)")
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.examples) - set(EXAMPLES))
    if unknown:
        parser.error(f"no example {', '.join(unknown)}; there are {', '.join(EXAMPLES)}")

    # Imported here: rewriting the sources (and the tests of it) needs neither.
    import jax
    import glue

    if not jax.config.jax_threefry_partitionable:  # JAX before 0.5; glue draws the bits later JAX draws
        jax.config.update("jax_threefry_partitionable", True)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; glue {glue.__version__} on "
          f"{args.backend or glue.default_backend_name()}")
    all_ok = True
    for name in args.examples or EXAMPLES:
        with glue.config.override(backend=args.backend), glue.default_matmul_precision("highest"):
            glue_losses = losses_of(name, args.steps, args.seed)
        with jax.default_matmul_precision("highest"):
            jax_losses = losses_of(name, args.steps, args.seed, swap_imports)
        table, ok = compare(glue_losses, jax_losses, args.rtol)
        all_ok &= ok
        print(f"\n{name}: {'agree' if ok else 'DIFFER'} (rtol {args.rtol})\n{table}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
