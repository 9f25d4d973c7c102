"""``python -m benchmarks`` (``make bench``): run every benchmark, print one table, write
``benchmarks/RESULTS.md`` with the date, interpreter and machine summary."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import sys
import traceback
from pathlib import Path

from benchmarks._common import Row, format_table

MODULES = [
    "benchmarks.bench_cold_demo",  # a fresh clone's `make demo`: the newcomer's first command
    "benchmarks.bench_import",
    "benchmarks.bench_happy",
    "benchmarks.bench_peers",
    "benchmarks.bench_operating",
    "benchmarks.bench_recovery",
    "benchmarks.bench_burst",
    "benchmarks.bench_asgi",
    "benchmarks.bench_original",
    "benchmarks.bench_faults",
    "benchmarks.bench_first_recovery",
    "benchmarks.bench_fleet",
    "benchmarks.bench_readonly",
    "benchmarks.bench_credentials",
    "benchmarks.bench_secrets",
    "benchmarks.bench_eval",
    "benchmarks.bench_patch_watch",
    "benchmarks.bench_scaling",  # also draws benchmarks/scaling.svg
    "benchmarks.bench_fleet_scale",  # 8 processes on a Redis, then on a Redis Cluster
    # Last: declaring an effect is for the whole process (every ``with`` then opens a unit).
    "benchmarks.bench_effects",
]


def _compile_package() -> None:
    # Measured as installed: a wheel's install writes the bytecode. Without it (a checkout run
    # under PYTHONDONTWRITEBYTECODE=1, as here) every fresh interpreter would compile our
    # sources again and the import and first-failure rows would measure the compiler.
    import compileall

    import crashoverride

    compileall.compile_dir(os.path.dirname(crashoverride.__file__), quiet=1)


# RESULTS.md's hand-written part (before/after figures, how a row was found): from this heading
# to the end, kept as it is when ``make bench`` writes the measured table above it.
NOTES = "## Notes (written by hand; `make bench` keeps this part)"


def _kept_notes(results: Path) -> str:
    text = results.read_text() if results.exists() else ""
    at = text.find(NOTES)
    return "" if at < 0 else "\n" + text[at:]


def main() -> int:
    _compile_package()
    rows: list[Row] = []
    problems: list[str] = []
    selected = sys.argv[1:] or MODULES
    for name in selected:
        module_name = name if name.startswith("benchmarks.") else f"benchmarks.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                problems.append(f"{module_name}: not written yet")
                continue
            raise
        print(f"== {module_name}", file=sys.stderr, flush=True)
        try:
            rows.extend(module.run())
        except Exception:
            problems.append(f"{module_name} failed:\n{traceback.format_exc()}")
    table = format_table(rows)
    print(table)
    for problem in problems:
        print(problem, file=sys.stderr)
    header = (
        f"# Benchmark results\n\n"
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n"
        f"- interpreter: {platform.python_implementation()} {platform.python_version()}\n"
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}\n"
        f"- command: `make bench` (`python -m benchmarks`); the package's bytecode compiled "
        "first, as an installed wheel has it\n\n"
        "Every ratio compares two figures measured side by side in the same run "
        "(medians of repetitions); absolute times vary between runs on this shared machine. "
        "Rows marked scripted use `agents.testing.ScriptedModel`: no real model is involved.\n\n"
    )
    extra = ""
    if problems:
        extra = "\n\n## Not measured\n\n" + "\n".join(f"- {p.splitlines()[0]}" for p in problems)
    if not sys.argv[1:]:
        results = Path(__file__).with_name("RESULTS.md")
        results.write_text(header + table + extra + "\n" + _kept_notes(results))
    return 1 if any("failed" in p for p in problems) else 0


if __name__ == "__main__":
    raise SystemExit(main())
