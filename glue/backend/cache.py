"""The disk cache of compiled code, shared by every backend.

An entry is addressed by the SHA-256 of its key (everything the code depends on: the generated
source, the target, the options, the toolchain's version) and lives under
`<glue.config.cache_dir>/<namespace>/`. Its file holds a format tag, the digest of the full key
and a digest of the payload, then the payload. A read checks all three, so an entry that is
truncated, corrupt, of an older format, or holding another key's code (a valid checksum is not
enough: the key is verified too) reads as a miss, and the next store replaces it; a damaged entry
never reaches the loader. Files are written under a temporary name and renamed into place, so
readers never see half an entry. An unwritable directory only costs a rebuild.

Keys that name code by what it is built from (a kernel's structure, not its generated text)
include `code_version()`, a digest of glue's own source, so an entry never outlives the code
generator that made it.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from glue.settings import config

_MAGIC = b"GLUECACHE2\n"
_DIGEST = 32


def digest(*parts: str | bytes) -> bytes:
    """The SHA-256 of `parts`, each length-prefixed so that no two part lists collide."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


@lru_cache(maxsize=None)
def code_version() -> str:
    """A digest of every Python source file of the glue package (read once per process)."""
    root = Path(__file__).resolve().parent.parent
    files = sorted(root.rglob("*.py"))
    return digest(*(part for f in files for part in (str(f.relative_to(root)), f.read_bytes()))).hex()


@dataclass
class DiskCache:
    """One namespace of the disk cache ("cpu" object code, "cuda-ptx" kernels, "gemm" choices, "plan"s)."""

    namespace: str
    counts: dict[str, int] = field(default_factory=lambda: {"hits": 0, "misses": 0, "rejected": 0,
                                                              "stores": 0})

    def directory(self) -> str | None:
        root = config.cache_dir
        return os.path.join(os.path.expanduser(root), self.namespace) if root else None

    def path(self, key: bytes) -> str | None:
        root = self.directory()
        name = key.hex()
        return os.path.join(root, name[:2], name) if root else None

    def load(self, key: bytes) -> bytes | None:
        """The payload stored under `key` (a `digest`), or None when absent, damaged or not
        this key's."""
        where = self.path(key)
        if where is None:
            return None
        try:
            with open(where, "rb") as f:
                blob = f.read()
        except OSError:
            self.counts["misses"] += 1
            return None
        head = len(_MAGIC)
        stored_key = blob[head:head + _DIGEST]
        stored_sum = blob[head + _DIGEST:head + 2 * _DIGEST]
        payload = blob[head + 2 * _DIGEST:]
        if blob[:head] != _MAGIC or stored_key != key or hashlib.sha256(payload).digest() != stored_sum \
                or not payload:
            self.counts["rejected"] += 1
            return None
        self.counts["hits"] += 1
        return payload

    def store(self, key: bytes, payload: bytes) -> None:
        """Write an entry atomically; a cache that cannot be written is skipped."""
        where = self.path(key)
        if where is None:
            return
        try:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(where), prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + key + hashlib.sha256(payload).digest() + payload)
                os.replace(tmp, where)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return
        self.counts["stores"] += 1


__all__ = ["DiskCache", "code_version", "digest"]
