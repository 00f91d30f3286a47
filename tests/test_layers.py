"""Data flows one way: no module of glue imports one of a layer above its own.

Layers, lowest first (ARCHITECTURE.md draws them): errors/settings/profiler, ir, reference (the
NumPy meaning of the IR), scheduler, codegen, backend (the contract every backend implements,
the registry, the disk cache), the backends, frontend (tracing, jit, transforms), the NumPy-style
API (glue.numpy, lax, nn, random, ...), and what sits on top (testing, the demo, the package's
own __init__). Every `import` statement counts, also one inside a function.
"""
from __future__ import annotations

import ast
import pathlib

import glue

LAYERS: tuple[tuple[str, ...], ...] = (
    ("glue.errors", "glue.settings", "glue.profiler"),
    ("glue.ir",),
    ("glue.reference",),
    ("glue.scheduler",),
    ("glue.codegen",),
    ("glue.backend",),
    ("glue.backend_cpu", "glue.backend_cuda"),
    ("glue.frontend",),
    ("glue.numpy", "glue.lax", "glue.tree_util", "glue.tree", "glue.dlpack", "glue.debug"),
    ("glue.random", "glue.nn", "glue.scipy", "glue.distributed"),
    ("glue.testing", "glue.__main__", "glue"),
)
# Backends are peers: neither may reach into the other.
PEERS = {("glue.backend_cpu", "glue.backend_cuda"), ("glue.backend_cuda", "glue.backend_cpu")}

ROOT = pathlib.Path(glue.__file__).parent


def layer_of(module: str) -> tuple[int, str]:
    """(rank, layer prefix) of a glue module; the longest matching prefix wins."""
    best = (-1, "")
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (rank, prefix)
    return best


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: pathlib.Path, module: str) -> set[str]:
    """Every glue module `path` imports, at any depth of the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if is_module(sub) else base)
    return {m for m in found if m == "glue" or m.startswith("glue.")}


def is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def upward_imports() -> list[str]:
    """'importer -> imported' for every import that runs up the layers or across backends."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        rank, prefix = layer_of(module)
        for target in sorted(imports_of(path, module)):
            target_rank, target_prefix = layer_of(target)
            if target_rank > rank or (prefix, target_prefix) in PEERS:
                bad.append(f"{module} -> {target}")
    return bad


def test_every_module_has_a_layer():
    unplaced = [module_name(p) for p in ROOT.rglob("*.py") if layer_of(module_name(p))[0] < 0]
    assert not unplaced, f"modules outside every layer (add them to LAYERS): {unplaced}"


def test_no_import_runs_up_the_layers():
    assert upward_imports() == []


if __name__ == "__main__":
    print("\n".join(upward_imports()) or "no upward imports")
