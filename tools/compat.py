"""The JAX-compatibility table: runs the tests that say which JAX names they check
(`@pytest.mark.jax_api("jnp.cumsum", ...)`) and writes one row per name into README.md, between
the compat markers.

A name "works" when every test that checks it passes, "fails" when one fails, and is "skipped"
(with the reason) when all of its tests are skipped.

    CI=true python tools/compat.py            # run the tests, rewrite the table
    CI=true python tools/compat.py --print    # print the table only
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- compat:begin -->", "<!-- compat:end -->"


class Outcomes:
    """A pytest plugin recording, per JAX name, the outcome of every test marked with it."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        if report.when != "call" and report.outcome == "passed":
            return
        # markers added while the test ran (parametrized tests name themselves) count too
        for name in (n for mark in item.iter_markers("jax_api") for n in mark.args):
            reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
            self.by_name[name].append((report.outcome, reason))


def status(outcomes: list[tuple[str, str]]) -> str:
    kinds = {outcome for outcome, _ in outcomes}
    if "failed" in kinds:
        return "fails"
    if kinds == {"skipped"}:
        return "skipped: " + outcomes[0][1].removeprefix("Skipped: ")
    return "works"


def marked_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "jax_api" in p.read_text())


def table(by_name: dict[str, list[tuple[str, str]]]) -> str:
    rows = {name: status(outcomes) for name, outcomes in by_name.items()}
    counts = defaultdict(int)
    for s in rows.values():
        counts[s.split(":")[0]] += 1
    lines = [f"{len(rows)} names: {counts['works']} work, {counts['fails']} fail, "
             f"{counts['skipped']} skipped.", "", "| name | status |", "| --- | --- |"]
    lines += [f"| `{name}` | {s} |" for name, s in sorted(rows.items())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the table, leave README.md alone")
    args = parser.parse_args()
    outcomes = Outcomes()
    code = pytest.main(["-q", *marked_test_files()], plugins=[outcomes])
    text = table(outcomes.by_name)
    if args.print:
        print(text)
    else:
        readme = README.read_text()
        block = f"{BEGIN}\n{text}\n{END}"
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(readme):
            sys.exit(f"{README} has no {BEGIN} ... {END} block to fill")
        README.write_text(pattern.sub(lambda _: block, readme))
        print(text.splitlines()[0])
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
