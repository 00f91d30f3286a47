"""The disk cache of compiled object code: hits, misses, damaged entries, atomic writes."""
import os

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend_cpu import CpuBackend, cache, target


def _lowered(scale=2.0):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = glue.make_ir(lambda x: gnp.exp(x / 8) * scale)(x).graph
    return CpuBackend().lower(graph, name="cached"), x, np.exp(x.astype(np.float64) / 8) * scale


def _entries(root):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GLUE_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_compile_stores_one_entry_and_the_next_one_hits_it(cache_dir):
    low, x, want = _lowered()
    ir = low.program.llvm_ir
    code, hit = target.object_code(ir)
    assert not hit
    (entry,) = _entries(cache_dir)
    assert entry.endswith(cache.key(ir, target.host().fingerprint) + ".o")
    again, hit = target.object_code(ir)
    assert hit and again == code
    np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)


def test_different_programs_get_different_entries(cache_dir):
    for scale in (2.0, 3.0):
        target.object_code(_lowered(scale)[0].program.llvm_ir)
    assert len(_entries(cache_dir)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_ignored_and_rebuilt(cache_dir, damage):
    low, x, want = _lowered()
    ir = low.program.llvm_ir
    good, _ = target.object_code(ir)
    (entry,) = _entries(cache_dir)
    blob = open(entry, "rb").read()
    damaged = {"truncate": blob[:len(blob) // 2], "flip": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
               "empty": b"", "garbage": os.urandom(len(blob))}[damage]
    with open(entry, "wb") as f:
        f.write(damaged)
    assert cache.load(cache.key(ir, target.host().fingerprint)) is None
    code, hit = target.object_code(ir)
    assert not hit and code == good
    assert open(entry, "rb").read() == blob  # rebuilt in place
    np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)


def test_writes_leave_no_temporary_files(cache_dir):
    target.object_code(_lowered()[0].program.llvm_ir)
    assert all(not os.path.basename(p).startswith(".tmp-") for p in _entries(cache_dir))


def test_an_empty_cache_dir_turns_the_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("GLUE_CACHE_DIR", "")
    ir = _lowered()[0].program.llvm_ir
    assert target.object_code(ir)[1] is False
    assert target.object_code(ir)[1] is False


def test_an_unwritable_cache_dir_does_not_stop_compiling(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GLUE_CACHE_DIR", str(blocker / "cache"))
    low, x, want = _lowered()
    np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)
