"""A first failure with no credentials configured: how long until the user's exception is back.

Each sample is a fresh interpreter, no ``OPENAI_*`` variable, ``CrashOverride()`` with no key,
model instance or base URL. The time runs from the ``raise`` inside the protected block to the
exception (with its note) arriving at the caller's ``except``; neither the SDK nor the run
machinery (anyio, the placements, the agent) is imported on the way, and no thread starts.
Nor is structlog (it imports asyncio, and twisted or rich when installed): a process that never
imported it cannot be listening, so the refusal's event is not emitted there. Measured cold (the
first failure imports the recovery's record) and with the recovery machinery already imported,
as in a server whose middleware warmed up at startup.

    python -m benchmarks.bench_credentials
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from benchmarks._common import Row, format_table, row

REPEATS = 7

_CODE = """
import json, sys, time
from crashoverride import CrashOverride

co = CrashOverride()
if sys.argv[1:] == ["loaded"]:
    # the recovery machinery, imported
    import crashoverride._core.entry, crashoverride._core.pipeline
began = time.perf_counter()
try:
    with co.handler():
        raise ValueError("boom")
except ValueError as exc:
    took = (time.perf_counter() - began) * 1000
    note = exc.__notes__[0]
print(json.dumps({"ms": took, "note": note, "sdk": "agents" in sys.modules,
                  "structlog": "structlog" in sys.modules}))
"""


def _sample(*args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run(
        [sys.executable, "-c", _CODE, *args], capture_output=True, text=True, check=True, env=env
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run() -> list[Row]:
    samples, loaded = [], []
    for _ in range(REPEATS):  # interleaved: machine noise hits both alike
        samples.append(_sample())
        loaded.append(float(_sample("loaded")["ms"]))  # type: ignore[arg-type]
    times = [float(s["ms"]) for s in samples]  # type: ignore[arg-type]
    imported = any(s["sdk"] for s in samples)
    note = str(samples[0]["note"]).split(": ", 1)[-1]
    return [
        row("first failure without credentials, fresh interpreter: exception back with its note",
            statistics.median(times), "ms", target="< 50 ms",
            note=f"median of {REPEATS} (worst {max(times):.1f} ms); SDK imported: {imported}; "
                 "includes importing the recovery record; structlog imported: "
                 f"{any(s['structlog'] for s in samples)}; "
                 f"note: {note}"),
        row("first failure without credentials, recovery machinery already imported (warmed up)",
            statistics.median(loaded), "ms", target="< 50 ms",
            note=f"median of {REPEATS} (worst {max(loaded):.1f} ms); SDK imported: {imported}"),
    ]  # fmt: skip


if __name__ == "__main__":
    print(format_table(run()))
