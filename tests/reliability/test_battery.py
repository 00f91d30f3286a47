"""The bad-input battery (`battery_cases.py`): each case runs in a subprocess with a timeout,
split between two processes (`battery_runner.py`); a case that hangs or
crashes its process is reported as that case's failure, and the cases after it run in a fresh
process.

A case expecting an error passes when the error is of its glue class (always a GlueError) and
its message names what the case lists and the line the case marks; a case expecting success
passes when it runs to its end. Cases waiting for the lead's part of issue 19 are strict xfails.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from glue.backend_cuda import CudaBackend
from tests.reliability.battery_cases import BY_NAME, CASES, Case

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = 2            # processes at a time (a process per worker, unless one dies)
CASE_SECONDS = 120.0   # a case running longer is a hang
STARTUP_SECONDS = 60.0  # importing glue in a fresh process, on a loaded machine

_AVAILABLE = {"cuda": CudaBackend.can_run, "cc": lambda: shutil.which("cc") is not None}


def _run_batch(names: list[str]) -> dict[str, dict]:
    """Run `names` in subprocesses until each has a result; a hang or crash is charged to the
    case that was running, and the rest go on in a new process."""
    results: dict[str, dict] = {}
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    while names:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tests.reliability.battery_runner", log.name, *names],
                                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            running, since, lines, partial = None, time.monotonic(), [], ""

            def complete_records(final: bool = False) -> list[dict]:
                """The records written since the last look; a line the case is still writing
                (no newline yet) waits for the next look, unless the process has ended."""
                nonlocal partial
                *done, partial = (partial + log.read()).split("\n")
                if final:
                    done, partial = done + [partial], ""
                return [json.loads(line) for line in done if line]

            while proc.poll() is None:
                time.sleep(0.05)
                lines += complete_records()
                for record in lines:
                    if record.get("started"):
                        running, since = record["name"], time.monotonic()
                lines = [r for r in lines if not r.get("started")]
                for record in lines:
                    results[record["name"]] = record
                    running = None if running == record["name"] else running
                lines = []
                limit = CASE_SECONDS if running else STARTUP_SECONDS
                if time.monotonic() - since > limit:
                    proc.kill()
                    proc.wait()
                    break
            for record in complete_records(final=True):
                if record.get("started"):
                    running = record["name"]
                else:
                    results[record["name"]] = record
                    running = None if running == record["name"] else running
            stderr = proc.stderr.read()[-2000:]
        left = [n for n in names if n not in results]
        if not left:
            break
        culprit = running or left[0]
        how = "hung (killed after %.0f s)" % CASE_SECONDS if proc.returncode in (-9,) and running else \
            f"crashed its process (exit status {proc.returncode})"
        results[culprit] = {"outcome": "died", "how": how, "stderr": stderr}
        names = [n for n in left if n != culprit]
    return results


@pytest.fixture(scope="module")
def battery(request) -> dict[str, dict]:
    """The results of every case this session runs, computed once, two processes at a time."""
    chosen = [item.callspec.params["case"].name for item in request.session.items
              if item.module is request.module and "case" in getattr(item, "callspec", type("", (), {"params": {}})).params]
    runnable = [n for n in chosen if BY_NAME[n].needs is None or _AVAILABLE[BY_NAME[n].needs]()]
    batches = [runnable[i::WORKERS] for i in range(WORKERS)]
    results: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for part in pool.map(_run_batch, batches):
            results.update(part)
    return results


def _problems(case: Case, result: dict) -> list[str]:
    """What is wrong with `result` for `case` (nothing: it passes)."""
    if result["outcome"] == "died":
        return [f"the case {result['how']}\n{result['stderr']}"]
    if case.raises is None:
        if result["outcome"] == "raised":
            return [f"raised {result['type']}: {result['message']}\n{result['traceback']}"]
        return []
    if result["outcome"] != "raised":
        return [f"expected {case.raises}, but it ran to its end"]
    problems = []
    if case.raises not in result["classes"] or "GlueError" not in result["classes"]:
        problems.append(f"expected {case.raises}, got {result['type']}")
    message = result["message"]
    for wanted in case.names:
        options = wanted if isinstance(wanted, tuple) else (wanted,)
        if not any(option in message for option in options):
            problems.append(f"the message does not name {' or '.join(map(repr, options))}")
    if case.line and f"{case.filename}:{case.marked_line}" not in message:
        problems.append(f"the message does not name the line {case.filename}:{case.marked_line}")
    if problems:
        problems.append(f"{result['type']}: {message}\n{result['traceback']}")
    return problems


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=f"lead: {case.lead}")] if case.lead else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case: Case, battery: dict[str, dict]) -> None:
    if case.needs and not _AVAILABLE[case.needs]():
        pytest.skip(f"needs {case.needs}")
    problems = _problems(case, battery[case.name])
    assert not problems, "\n".join(problems)
