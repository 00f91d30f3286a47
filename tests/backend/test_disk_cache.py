"""The disk cache of compiled code: one entry per distinct kernel, hits, misses, damaged entries,
entries of another key, atomic writes; through the cpu backend's kernel objects, which is what
it guards most."""
import gc
import os
import pathlib
import re

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend.cache import DiskCache, digest
from glue.backend_cpu import CpuBackend, code
from glue.settings import config


def _graph(scale=2.0, shape=(3, 4)):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    graph = glue.make_ir(lambda x: (gnp.exp(x / 8) * scale, (x * x).sum(axis=1)))(x).graph
    want = [np.exp(x.astype(np.float64) / 8) * scale, (x.astype(np.float64) ** 2).sum(axis=1)]
    return graph, x, want


def _run(graph, x, want, **options):
    """Compile `graph` in a fresh lowering, check its results, and return its kernel stats
    (with the program gone, so its kernels leave this process's memory)."""
    low = CpuBackend().lower(graph, name="cached", **options)
    exe = low.compile()
    for got, expected in zip(exe(x), want):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)
    keys = list(low["program"].sources)
    del exe, low
    gc.collect()
    assert not any(key in code._loaded for key in keys)
    return keys


def _sources(graph, **options):
    low = CpuBackend().lower(graph, name="cached", **options)
    low.compile()
    return {s.source for s in low.kernel_stats.values()}, low


def _entries(root):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


@pytest.fixture
def cache_dir(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        yield tmp_path


def test_each_distinct_kernel_is_one_entry_and_the_next_compile_hits_them(cache_dir):
    graph, x, want = _graph()
    keys = _run(graph, x, want)
    entries = _entries(cache_dir)
    assert len(entries) == len(keys) == 2 and all(e.startswith(str(cache_dir / "cpu")) for e in entries)
    sources, low = _sources(graph)
    assert sources == {"disk"} and low.timings["object"].cached
    assert _entries(cache_dir) == entries


def test_the_stage_table_records_the_miss(cache_dir):
    graph, x, want = _graph()
    sources, low = _sources(graph)
    assert sources == {"built"} and low.timings["object"].cached is False
    assert set(low.timings) >= {"plan", "program", "object", "load"}


def test_a_changed_program_builds_only_its_changed_kernels(cache_dir):
    graph, x, want = _graph(2.0)
    _run(graph, x, want)
    changed, x, want = _graph(3.0)  # the exp kernel changes; the sum of squares does not
    sources, low = _sources(changed)
    by_kind = {s.kind: s.source for s in low.kernel_stats.values()}
    assert by_kind == {"pointwise": "built", "reduction": "disk"}
    assert len(_entries(cache_dir)) == 3


def test_options_are_part_of_the_key(cache_dir):
    graph, x, want = _graph()
    _run(graph, x, want, opt_level=3)
    assert _sources(graph, opt_level=2)[0] == {"built"}
    assert len(_entries(cache_dir)) == 4


def test_codegen_settings_are_part_of_the_key(cache_dir):
    graph, x, want = _graph()
    _run(graph, x, want)
    with config.override(cpu_stream_bytes=1 << 10):
        assert _sources(graph)[0] == {"built"}


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage", "facts"])
def test_a_damaged_entry_is_ignored_and_rebuilt(cache_dir, damage):
    graph, x, want = _graph()
    _run(graph, x, want)
    entries = _entries(cache_dir)
    blobs = [open(e, "rb").read() for e in entries]
    blob = blobs[0]
    if damage == "facts":  # a well-formed, checksummed entry whose payload is not a kernel's
        key = bytes.fromhex(os.path.basename(entries[0]))
        DiskCache("cpu").store(key, b"not json\n" + blob[-64:])
    else:
        damaged = {"truncate": blob[:len(blob) // 2], "flip": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
                   "empty": b"", "garbage": os.urandom(len(blob))}[damage]
        with open(entries[0], "wb") as f:
            f.write(damaged)
    _run(graph, x, want)
    assert [open(e, "rb").read() for e in _entries(cache_dir)] == blobs  # rebuilt in place


def test_an_entry_holding_another_keys_code_is_not_trusted(cache_dir):
    """A well-formed entry with a valid checksum, copied over another key's file (what a
    stale or swapped cache does), must read as a miss, not run the wrong kernel."""
    graph, x, want = _graph()
    _run(graph, x, want)
    entries = _entries(cache_dir)
    blobs = [open(p, "rb").read() for p in entries]
    with open(entries[0], "wb") as f:  # swap: entry 0 now holds entry 1's (valid) contents
        f.write(blobs[1])
    with open(entries[1], "wb") as f:
        f.write(blobs[0])
    sources, _ = _sources(graph)
    assert sources == {"built"}
    _run(graph, x, want)


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
    _run(*_graph())
    assert all(not os.path.basename(p).startswith(".tmp-") for p in _entries(cache_dir))


def test_an_empty_cache_dir_turns_the_cache_off():
    graph, x, want = _graph(shape=(3, 5))
    with config.override(cache_dir=""):
        _run(graph, x, want)
        assert _sources(graph)[0] == {"built"}


def test_an_unwritable_cache_dir_does_not_stop_compiling(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with config.override(cache_dir=str(blocker / "cache")):
        _run(*_graph())


def test_every_setting_the_cpu_code_generators_read_is_part_of_the_kernel_key():
    from glue.backend_cpu.program import CODEGEN_SETTINGS

    root = pathlib.Path(glue.__file__).parent
    read = set()
    for path in [*(root / "backend_cpu").glob("*.py"), *(root / "codegen").glob("*.py")]:
        read |= set(re.findall(r"\bconfig\.(\w+)", path.read_text()))
    # the runtime's split threshold does not change code; the thread count is keyed itself; the
    # attention threshold changes which kernels the Plan has (the plan cache keys it), not their code
    not_codegen = {"read", "cpu_parallel_threshold", "cpu_threads", "cpu_unfused_attention_bytes"}
    assert read - not_codegen == set(CODEGEN_SETTINGS)
