"""The exceptions glue raises for anything a user can cause, and where in user code it happened.

Every error that a user's program or input can trigger is a `GlueError`; the message names the
primitive or function, the shapes/dtypes involved and the user's source line.
"""
from __future__ import annotations

import functools
import linecache
import os
import sys

_GLUE_DIR = os.path.dirname(os.path.abspath(__file__))
_DEMO = os.path.join(_GLUE_DIR, "__main__.py")


class GlueError(Exception):
    """Base class of every error glue raises for bad programs or inputs."""


class GlueTypeError(GlueError, TypeError):
    """An operation got operands of shapes, dtypes or parameters its rule does not accept."""


class GlueIndexError(GlueError, IndexError):
    """An index is out of bounds, malformed, or (a boolean mask) would give a data-dependent shape."""


class ConcretizationError(GlueError, TypeError):
    """A traced value reached Python control flow (`if`, `bool()`, `int()`, ...)."""


class ParseError(GlueError, ValueError):
    """The IR text could not be parsed."""


class VerifyError(GlueError, ValueError):
    """A Graph is not well formed (SSA, types or parameters are inconsistent)."""


class BackendError(GlueError, RuntimeError):
    """A backend could not compile or run a program."""


@functools.lru_cache(maxsize=4096)
def _user_file(name: str, cwd: str) -> str | None:
    """How a code object's file is named in locations (`_short_path`, from the working directory
    `cwd`) when it is user code, else None (glue's own files but the demo, and frozen modules).
    Tracing asks for every equation it records, of the same few files, so the answer is kept."""
    path = os.path.abspath(name)
    inside = path.startswith(_GLUE_DIR + os.sep) and path != _DEMO
    return None if inside or name.startswith("<frozen") else _short_path(path)


def user_frame_location() -> str | None:
    """`file:line` of the innermost stack frame outside the glue package (the user's code;
    glue's own demo, `python -m glue`, counts as user code)."""
    frame, cwd = sys._getframe(1), os.getcwd()
    while frame is not None:
        path = _user_file(frame.f_code.co_filename, cwd)
        if path is not None:
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def innermost_user_location(exc: BaseException) -> str | None:
    """`file:line` of the innermost frame outside the glue package in `exc`'s traceback (where
    in the user's code an error raised deep inside glue or Python was reached)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not (path.startswith(_GLUE_DIR + os.sep) and path != _DEMO) and not path.startswith("<frozen"):
            found = f"{_short_path(path)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def describe_location(location: str | None) -> str:
    """A human line for an error: `at file:line: <source text>`."""
    if not location:
        return "at an unknown location"
    file, _, line = location.rpartition(":")
    text = linecache.getline(file, int(line)).strip() if line.isdigit() else ""
    return f"at {location}" + (f": {text}" if text else "")
