"""Import cost: ``import crashoverride`` against ``python -c pass``, in fresh interpreters."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from benchmarks._common import Row, row

REPEATS = 15


def _wall_ms(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return (time.perf_counter() - start) * 1000


def run() -> list[Row]:
    # Interleave the two so machine noise hits both alike; take medians.
    bare: list[float] = []
    ours: list[float] = []
    sdk: list[float] = []
    for i in range(REPEATS):
        bare.append(_wall_ms("pass"))
        ours.append(_wall_ms("import crashoverride"))
        if i < 3:
            sdk.append(_wall_ms("import agents"))
    base = statistics.median(bare)
    extra = statistics.median(ours) - base
    leaked = subprocess.run(
        [sys.executable, "-c",
         "import sys, crashoverride; print(sorted({m.split('.')[0] for m in sys.modules} & "
         "{'agents', 'openai', 'structlog', 'asyncio', 'anyio'}))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return [
        row("import crashoverride, extra over python -c pass", extra, "ms", target="< 50 ms",
            note=f"interpreter start {base:.1f} ms; heavy modules loaded: {leaked}"),
        row("import agents (paid at the first recovery instead)",
            statistics.median(sdk) - base, "ms", note="for contrast"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
