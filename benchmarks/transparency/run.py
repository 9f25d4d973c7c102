"""Run Starlette's and FastAPI's own test suites three ways and report what crashoverride changes.

1. unchanged, 2. with a pass-through middleware in every app they build, 3. with
``CrashOverrideMiddleware`` (a model that always gives up) in every app they build. A test that
fails only in the third run is a place where the middleware is not transparent.

The suites are the sdists of the versions installed for the interpreter given by ``--python``
(they ship their tests), downloaded with pip into ``--workdir`` and never committed. Their test
dependencies belong in that interpreter's environment, not in the project's: see README.md.

    python benchmarks/transparency/run.py --python /tmp/transparency-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
MODES = ("off", "noop", "crashoverride")
SUITES = {"starlette": "tests", "fastapi": "tests"}


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, text=True, capture_output=True).stdout


def installed_version(python: str, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return _run([python, "-c", code]).strip()


def has_module(python: str, module: str) -> bool:
    found = f"import importlib.util as u, sys; sys.exit(u.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", found], check=False).returncode == 0


def fetch_suite(python: str, dist: str, version: str, workdir: Path) -> Path:
    """The sdist of ``dist==version``, unpacked (it ships the project's tests)."""
    source = workdir / f"{dist}-{version}"
    if (source / SUITES[dist]).is_dir():
        return source
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / f"{dist}-{version}.tar.gz"
    if not archive.exists():
        _run(
            [
                python,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--dest",
                str(workdir),
                f"{dist}=={version}",
            ]
        )
    with tarfile.open(archive) as sdist:
        sdist.extractall(workdir, filter="data")
    if not (source / SUITES[dist]).is_dir():
        raise SystemExit(f"{archive.name} has no {SUITES[dist]}/ directory")
    return source


class Run(NamedTuple):
    outcomes: dict[str, str]  # test id -> passed / failed / skipped / xfailed / xpassed
    events: dict[str, int]  # recovery events seen in the crashoverride mode, counted
    seconds: float
    exit_code: int  # pytest's: 0 and 1 are complete sessions; others were cut short


def run_suite(
    python: str, source: Path, dist: str, mode: str, results: Path, args: argparse.Namespace
) -> Run:
    out = results / dist / mode
    shutil.rmtree(out, ignore_errors=True)
    paths = [str(HERE), *args.prepend_path]
    env = {
        **os.environ,
        "CRASHOVERRIDE_TRANSPARENCY": mode,
        "CRASHOVERRIDE_TRANSPARENCY_RESULTS": str(out),
        "CRASHOVERRIDE_TRANSPARENCY_WARM": "1" if args.warm else "0",
        "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }
    cmd = [python, "-m", "pytest", "-p", "inject", "-p", "no:cacheprovider", "-q", "-rfE"]
    if args.workers and has_module(python, "xdist"):
        cmd += ["-n", str(args.workers)]
    cmd += [SUITES[dist], *args.pytest_args]
    began = time.monotonic()
    results.mkdir(parents=True, exist_ok=True)
    log = results / f"{dist}-{mode}.log"
    with log.open("w") as stream:
        done = subprocess.run(
            cmd, cwd=source, env=env, stdout=stream, stderr=subprocess.STDOUT, check=False
        )
    elapsed = time.monotonic() - began
    outcomes_file = out / f"outcomes-{mode}.json"
    if not outcomes_file.exists():
        raise SystemExit(f"{dist} ({mode}) produced no results; see {log}")
    outcomes: dict[str, str] = json.loads(outcomes_file.read_text())
    events: dict[str, int] = {}
    for part in out.glob(f"events-{mode}-*.json"):
        for name, count in json.loads(part.read_text()).items():
            events[name] = events.get(name, 0) + count
    return Run(outcomes, events, elapsed, done.returncode)


def failing(outcomes: dict[str, str]) -> set[str]:
    return {test for test, outcome in outcomes.items() if outcome in ("failed", "xpassed")}


def confirm(
    python: str, source: Path, dist: str, tests: list[str], results: Path, args: argparse.Namespace
) -> dict[str, dict[str, str]]:
    """Run only ``tests`` again in every mode, serially: a difference must reproduce."""
    again = argparse.Namespace(**{**vars(args), "workers": 0, "pytest_args": [*tests]})
    return {
        mode: run_suite(python, source, dist, mode, results / "confirm", again).outcomes
        for mode in MODES
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter with the suites' test dependencies and crashoverride importable",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/crashoverride-transparency"))
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), default=[])
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="pytest-xdist workers (0: none; used only if xdist is installed)",
    )
    parser.add_argument(
        "--prepend-path",
        action="append",
        default=[],
        help="directory put first on PYTHONPATH (e.g. another crashoverride)",
    )
    parser.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="do not import crashoverride and the SDK before the tests",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    results = args.workdir / "results"
    results.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {}
    worst = 0
    for dist in args.suite or sorted(SUITES):
        version = installed_version(args.python, dist)
        source = fetch_suite(args.python, dist, version, args.workdir)
        runs = {mode: run_suite(args.python, source, dist, mode, results, args) for mode in MODES}
        failed = {mode: failing(run.outcomes) for mode, run in runs.items()}
        suspects = sorted(failed["crashoverride"] - failed["off"] - failed["noop"])
        confirmed = suspects
        if suspects:
            again = confirm(args.python, source, dist, suspects, results, args)
            confirmed = [
                test for test in suspects
                if test in failing(again["crashoverride"])
                and test not in failing(again["off"]) | failing(again["noop"])
            ]  # fmt: skip
        # A session cut short (an INTERNALERROR, a crashed worker) hides the tests it never ran.
        cut_short = {
            mode: run.exit_code for mode, run in runs.items() if run.exit_code not in (0, 1)
        }
        not_run = sorted(set(runs["off"].outcomes) - set(runs["crashoverride"].outcomes))
        report = {
            "version": version,
            "tests": len(runs["off"].outcomes),
            **{f"failed_{mode}": sorted(failed[mode]) for mode in MODES},
            "seconds": {mode: round(run.seconds) for mode, run in runs.items()},
            "sessions_cut_short": cut_short,
            "not_run_with_crashoverride": len(not_run),
            "recovery_events": runs["crashoverride"].events,
            "only_with_crashoverride": confirmed,
            "flaky_differences": sorted(set(suspects) - set(confirmed)),
            "only_with_noop": sorted(failed["noop"] - failed["off"]),
        }
        summary[dist] = report
        worst = max(worst, len(confirmed) + len(cut_short) + len(not_run))
        print(f"\n{dist} {version}: {len(runs['off'].outcomes)} tests")
        for mode, run in runs.items():
            ended = f", pytest exit {run.exit_code}: cut short" if mode in cut_short else ""
            print(f"  failing {mode:<14} {len(failed[mode]):>4}   ({round(run.seconds)} s{ended})")
        if not_run:
            print(f"  not run with crashoverride: {len(not_run)}")
        print(f"  failing only with crashoverride: {len(confirmed)}")
        for test in confirmed:
            print(f"    {test}")
        for test in sorted(set(suspects) - set(confirmed)):
            print(f"    (did not reproduce: {test})")
        for name, count in sorted(runs["crashoverride"].events.items()):
            print(f"  event {name}: {count}")
    (results / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nsummary: {results / 'summary.json'}; logs: {results}/<suite>-<mode>.log")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
