"""Against the original ``crashoverride==0.2.0`` from PyPI, side by side in the same run.

The benchmark installs 0.2.0 itself into a throwaway venv (a temporary directory, removed
afterwards) and drives it in a subprocess of that venv, through its public API only: import
time, the happy-path ``with`` block, and raise→resume with an instant scripted model. When it
cannot be installed or driven, its rows say so (value NaN) instead of inventing a figure.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import Row, row

VERSION = "0.2.0"
IMPORT_REPEATS = 9
RUNS = 200

# Runs inside either venv: the same measurement for both packages.
DRIVER = r"""
import contextlib, json, statistics, sys, time
from typing import Any

mode, loops = sys.argv[1], int(sys.argv[2])
from crashoverride import CrashOverride
from agents.testing import ScriptedModel, assistant_message, function_call

class InstantModel(ScriptedModel):
    def _record_call(self, **kwargs: Any) -> Any:
        call = super()._record_call(**kwargs)
        self._calls.clear()
        return call

STATE = {"value": 0}

def happy() -> dict[str, float]:
    co = CrashOverride(project_prompt="benchmark", model="unused", api_key="unused")
    def handler(n):
        for _ in range(n):
            with co.handler(prompt="Leave `x` set."):
                pass
    def suppress(n):
        for _ in range(n):
            with contextlib.suppress(Exception):
                pass
    samples = {"handler": [], "suppress": []}
    for _ in range(9):
        for name, fn in (("handler", handler), ("suppress", suppress)):
            start = time.perf_counter_ns()
            fn(loops)
            samples[name].append((time.perf_counter_ns() - start) / loops)
    return {k: statistics.median(v) for k, v in samples.items()}

def recovery() -> dict[str, float]:
    # Ours writes the caller's local; 0.2.0 documents that local writes are unreliable before
    # 3.13, so its agent sets a module global: the same one-statement repair either way.
    ours = hasattr(CrashOverride, "warm_up")
    code = "caller['value'] = 1" if ours else "STATE['value'] = 1"
    steps = []
    for i in range(loops + 5):
        steps.append([function_call("exec_python", {"statements": code}, call_id=f"c{i}")])
        steps.append([assistant_message("set value")])
    co = CrashOverride(model=InstantModel(steps), api_key="unused", **(
        {"single_flight": False, "breaker_threshold": 10**9} if ours else {}))
    samples = []
    for i in range(loops + 5):
        value = 0
        STATE["value"] = 0
        start = time.perf_counter()
        with co.handler(prompt="Leave `value` set."):
            raise KeyError(i)
        elapsed = (time.perf_counter() - start) * 1000
        assert (value if ours else STATE["value"]) == 1
        if i >= 5:
            samples.append(elapsed)
    samples.sort()
    return {"p50": statistics.median(samples), "p95": samples[int(len(samples) * 0.95) - 1]}

if mode == "recovery":
    try:  # ours emits structlog events: render them, discard the output (as bench_recovery)
        import structlog
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    except ImportError:  # 0.2.0 does not use structlog
        pass
print(json.dumps(happy() if mode == "happy" else recovery()))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # no trace export from a benchmark
    env.pop("PYTHONPATH", None)
    return env


def _install(venv: Path) -> str | None:
    """Create the venv and install 0.2.0; None on success, else why not."""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
             "--disable-pip-version-check", f"crashoverride=={VERSION}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not create the venv: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        return f"pip install crashoverride=={VERSION} failed: {last[:200]}"
    return None


def _drive(python: str, mode: str, loops: int, cwd: str) -> dict[str, float]:
    out = subprocess.run(
        [python, "-c", DRIVER, mode, str(loops)], capture_output=True, text=True,
        timeout=600, env=_env(), cwd=cwd, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _import_extra(python: str, cwd: str) -> list[float]:
    samples = []
    for _ in range(IMPORT_REPEATS):
        timings = []
        for code in ("pass", "import crashoverride"):
            start = time.perf_counter()
            subprocess.run([python, "-c", code], check=True, env=_env(), cwd=cwd)
            timings.append((time.perf_counter() - start) * 1000)
        samples.append(timings[1] - timings[0])
    return samples


def _unavailable(reason: str) -> list[Row]:
    nan = float("nan")
    return [
        row(f"vs 0.2.0: {name}", nan, unit, note=f"0.2.0 not measured: {reason}")
        for name, unit in (("import", "ms"), ("happy-path with", "ns"), ("raise→resume p50", "ms"))
    ]


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="crashoverride-0.2-") as tmp:
        venv = Path(tmp) / "venv"
        problem = _install(venv)
        if problem is not None:
            return _unavailable(problem)
        theirs_py = str(venv / "bin" / "python")
        # Run from the temp dir so neither interpreter imports this checkout by accident.
        ours_py = sys.executable
        try:
            theirs_import = _import_extra(theirs_py, tmp)
            ours_import = _import_extra(ours_py, tmp)
            theirs_happy = _drive(theirs_py, "happy", 200_000, tmp)
            ours_happy = _drive(ours_py, "happy", 200_000, tmp)
            theirs_rec = _drive(theirs_py, "recovery", RUNS, tmp)
            ours_rec = _drive(ours_py, "recovery", RUNS, tmp)
        except (subprocess.SubprocessError, ValueError, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            return _unavailable(f"could not drive it: {detail.strip().splitlines()[-1][:200]}")
    ti, oi = statistics.median(theirs_import), statistics.median(ours_import)
    return [
        row("vs 0.2.0: import, extra over python -c pass (ours vs 0.2.0)", oi, "ms",
            baseline=ti, note="0.2.0 imports the Agents SDK at import time"),
        row("vs 0.2.0: happy-path with co.handler(prompt=...) (ours vs 0.2.0)",
            ours_happy["handler"], "ns", baseline=theirs_happy["handler"],
            note=f"each process's contextlib.suppress: ours {ours_happy['suppress']:.0f} ns, "
                 f"0.2.0 {theirs_happy['suppress']:.0f} ns"),
        row("vs 0.2.0: raise→resume p50, sync with (ours vs 0.2.0)", ours_rec["p50"], "ms",
            baseline=theirs_rec["p50"], note="scripted instant model, one exec_python turn"),
        row("vs 0.2.0: raise→resume p95 (ours vs 0.2.0)", ours_rec["p95"], "ms",
            baseline=theirs_rec["p95"]),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
