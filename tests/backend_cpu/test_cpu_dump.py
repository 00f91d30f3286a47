"""GLUE_DUMP on the cpu backend: every stage lands in the dump directory, the fusion graph is
rendered to SVG when Graphviz's `dot` is installed."""
import os
import shutil
import stat

import numpy as np
import pytest

import glue
import glue.nn as nn


def _dump(tmp_path, monkeypatch):
    out = tmp_path / "dump"
    monkeypatch.setenv("GLUE_DUMP", str(out))
    glue.jit(nn.softmax, backend="cpu")(np.ones((4, 8), np.float32))
    return {p.name.split(".", 1)[1]: p for p in out.iterdir()}


def test_every_stage_is_written(tmp_path, monkeypatch):
    files = _dump(tmp_path, monkeypatch)
    for name in ("softmax.ir.txt", "softmax.kernels.txt", "softmax.memory.txt", "softmax.graph.dot",
                 "softmax.llvm.ll", "softmax.asm.s"):
        assert name in files, sorted(files)
    assert "define void" in files["softmax.llvm.ll"].read_text()
    assert files["softmax.graph.dot"].read_text().startswith("digraph")


def test_the_graph_is_rendered_with_dot_when_present(tmp_path, monkeypatch):
    if shutil.which("dot") is None:
        fake = tmp_path / "bin" / "dot"
        fake.parent.mkdir()
        # Stands in for Graphviz: `dot -Tsvg in -o out` writes an SVG naming its input.
        fake.write_text('#!/bin/sh\nprintf "<svg><!-- %s --></svg>" "$2" > "$4"\n')
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    files = _dump(tmp_path, monkeypatch)
    assert "<svg" in files["softmax.graph.svg"].read_text()


def test_a_failing_dot_does_not_stop_compiling(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    files = _dump(tmp_path, monkeypatch)
    assert "softmax.graph.svg" not in files and "softmax.graph.dot" in files


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_real_dot_accepts_the_graph_stage(tmp_path, monkeypatch):
    files = _dump(tmp_path, monkeypatch)
    assert files["softmax.graph.svg"].read_text().lstrip().startswith(("<?xml", "<svg", "<!DOCTYPE"))
