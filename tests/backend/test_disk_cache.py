"""The disk cache of compiled code: hits, misses, damaged entries, entries of another key,
atomic writes; through the cpu backend's object code, which is what it guards most."""
import os

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend.cache import DiskCache, digest
from glue.backend_cpu import CpuBackend, target
from glue.settings import config


def _lowered(scale=2.0):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = glue.make_ir(lambda x: gnp.exp(x / 8) * scale)(x).graph
    return CpuBackend().lower(graph, name="cached"), x, np.exp(x.astype(np.float64) / 8) * scale


def _entries(root):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


@pytest.fixture
def cache_dir(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        yield tmp_path


def test_a_compile_stores_one_entry_and_the_next_one_hits_it(cache_dir):
    low, x, want = _lowered()
    ir = low["llvm"].llvm_ir
    code, hit = target.object_code(ir)
    assert not hit
    (entry,) = _entries(cache_dir)
    assert entry.startswith(str(cache_dir / "cpu"))
    again, hit = target.object_code(ir)
    assert hit and again == code
    np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)


def test_the_stage_table_records_the_hit(cache_dir):
    first, x, _ = _lowered()
    first.compile()
    assert first.timings["object"].cached is False
    second, _, _ = _lowered()
    second.compile()
    assert second.timings["object"].cached is True
    assert set(second.timings) >= {"plan", "llvm", "object", "load"}


def test_different_programs_get_different_entries(cache_dir):
    for scale in (2.0, 3.0):
        target.object_code(_lowered(scale)[0]["llvm"].llvm_ir)
    assert len(_entries(cache_dir)) == 2


def test_options_are_part_of_the_key(cache_dir):
    ir = _lowered()[0]["llvm"].llvm_ir
    target.object_code(ir, "opt_level=3")
    assert target.object_code(ir, "opt_level=2")[1] is False
    assert len(_entries(cache_dir)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_ignored_and_rebuilt(cache_dir, damage):
    low, x, want = _lowered()
    ir = low["llvm"].llvm_ir
    good, _ = target.object_code(ir)
    (entry,) = _entries(cache_dir)
    blob = open(entry, "rb").read()
    damaged = {"truncate": blob[:len(blob) // 2], "flip": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
               "empty": b"", "garbage": os.urandom(len(blob))}[damage]
    with open(entry, "wb") as f:
        f.write(damaged)
    code, hit = target.object_code(ir)
    assert not hit and code == good
    assert open(entry, "rb").read() == blob  # rebuilt in place
    np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)


def test_an_entry_holding_another_keys_code_is_not_trusted(cache_dir):
    """A well-formed entry with a valid checksum, copied over another key's file (what a
    stale or swapped cache does), must read as a miss, not run the wrong program."""
    (low2, x, want2), (low3, _, _) = _lowered(2.0), _lowered(3.0)
    target.object_code(low2["llvm"].llvm_ir)
    target.object_code(low3["llvm"].llvm_ir)
    entries = _entries(cache_dir)
    blobs = [open(p, "rb").read() for p in entries]
    with open(entries[0], "wb") as f:  # swap: entry 0 now holds entry 1's (valid) contents
        f.write(blobs[1])
    with open(entries[1], "wb") as f:
        f.write(blobs[0])
    for low, scale in ((low2, 2.0), (_lowered(3.0)[0], 3.0)):
        fresh = CpuBackend().lower(low.graph, name="again")
        out = np.asarray(fresh.compile()(x)[0])
        np.testing.assert_allclose(out, np.exp(x.astype(np.float64) / 8) * scale, rtol=1e-6)
        assert fresh.timings["object"].cached is False


def test_disk_cache_round_trip_and_counts(cache_dir):
    cache = DiskCache("scratch")
    key = digest("k", "1")
    assert cache.load(key) is None
    cache.store(key, b"payload")
    assert cache.load(key) == b"payload"
    assert cache.load(digest("k", "2")) is None
    assert cache.counts["hits"] == 1 and cache.counts["stores"] == 1


def test_digest_parts_do_not_run_together():
    assert digest("ab", "c") != digest("a", "bc")


def test_writes_leave_no_temporary_files(cache_dir):
    target.object_code(_lowered()[0]["llvm"].llvm_ir)
    assert all(not os.path.basename(p).startswith(".tmp-") for p in _entries(cache_dir))


def test_an_empty_cache_dir_turns_the_cache_off():
    with config.override(cache_dir=""):
        ir = _lowered()[0]["llvm"].llvm_ir
        assert target.object_code(ir)[1] is False
        assert target.object_code(ir)[1] is False


def test_an_unwritable_cache_dir_does_not_stop_compiling(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with config.override(cache_dir=str(blocker / "cache")):
        low, x, want = _lowered()
        np.testing.assert_allclose(np.asarray(low.compile()(x)[0]), want, rtol=1e-6)
