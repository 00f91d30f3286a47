"""Runs battery cases (`battery_cases.py`) one after another in this process:

    python -m tests.reliability.battery_runner RESULTS NAME...

Each case's code is written to its own file in a scratch directory (the working directory of
the run, so error messages name `case_<name>.py:<line>`) and run; a JSON line goes to RESULTS
when a case starts and another with its outcome when it ends (flushed at once), so that the
parent can tell which case hung or crashed the process. The environment, `glue.config`'s
settings and the working directory are restored after every case; the disk cache lives in the
scratch directory.
"""
import json
import os
import runpy
import sys
import tempfile
import time
import traceback


def _outcome(path: str) -> dict:
    try:
        runpy.run_path(path, run_name="__battery__")
    except BaseException as exc:  # noqa: BLE001 - every escape is reported, SystemExit included
        return {"outcome": "raised", "type": type(exc).__name__,
                "classes": [c.__name__ for c in type(exc).__mro__], "message": str(exc),
                "traceback": "".join(traceback.format_exception(exc))[-4000:]}
    return {"outcome": "returned"}


def main(results: str, names: list[str]) -> None:
    from glue.settings import config
    from tests.reliability.battery_cases import BY_NAME

    scratch = tempfile.mkdtemp(prefix="glue-battery-")
    os.environ["GLUE_CACHE_DIR"] = os.path.join(scratch, "cache")
    os.chdir(scratch)
    with open(results, "a") as out:
        for name in names:
            case = BY_NAME[name]
            path = os.path.join(scratch, case.filename)
            with open(path, "w") as f:
                f.write(case.source)
            out.write(json.dumps({"name": name, "started": True}) + "\n")
            out.flush()
            environ = dict(os.environ)
            start = time.perf_counter()
            try:
                result = _outcome(path)
            finally:
                os.environ.clear()
                os.environ.update(environ)
                os.chdir(scratch)
                config.reset()
            result["seconds"] = round(time.perf_counter() - start, 3)
            out.write(json.dumps({"name": name, **result}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
