"""Disk cache of compiled object code, keyed by a content hash of the LLVM IR and the target.

Entries live under `$GLUE_CACHE_DIR` (default `~/.cache/glue/cpu`), one file per key. A file is
written to a temporary name and renamed into place, so readers never see half an entry, and
carries a checksum of its payload: a truncated or corrupt entry reads as a miss (and the next
store replaces it) instead of reaching the object loader. Set GLUE_CACHE_DIR to an empty string
to turn the cache off.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

_MAGIC = b"GLUEOBJ1"
_DIGEST = 32


def directory() -> str | None:
    chosen = os.environ.get("GLUE_CACHE_DIR")
    if chosen is not None:
        return chosen or None
    return os.path.join(os.path.expanduser("~"), ".cache", "glue", "cpu")


def key(ir_text: str, target: str) -> str:
    h = hashlib.sha256()
    h.update(target.encode())
    h.update(b"\0")
    h.update(ir_text.encode())
    return h.hexdigest()


def path(entry: str) -> str | None:
    root = directory()
    return os.path.join(root, entry[:2], entry + ".o") if root else None


def load(entry: str) -> bytes | None:
    """The cached object code of `entry`, or None when absent or damaged."""
    where = path(entry)
    if where is None:
        return None
    try:
        with open(where, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    body = len(_MAGIC) + _DIGEST
    head, digest, payload = blob[:len(_MAGIC)], blob[len(_MAGIC):body], blob[body:]
    if head != _MAGIC or hashlib.sha256(payload).digest() != digest or not payload:
        return None
    return payload


def store(entry: str, code: bytes) -> None:
    """Write an entry atomically; a cache that cannot be written is silently skipped."""
    where = path(entry)
    if where is None:
        return
    try:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(where), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(code).digest() + code)
            os.replace(tmp, where)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
