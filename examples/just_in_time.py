"""Just-in-time implementation: a deliberate ``NotImplementedError`` written when first reached.

``percentile`` is declared with its contract but left unimplemented: nobody needed it until the
nightly report did. The first call raises inside the protected block; the agent reads the
docstring, implements the function in the running process (for every caller), verifies it and
fills in the value. The second report uses the new code directly.

    python examples/just_in_time.py          # offline: the model is scripted, and says so
    python examples/just_in_time.py --live   # a real model (OPENAI_API_KEY)
"""

from __future__ import annotations

import argparse
from typing import Any

from crashoverride import CrashOverride

LATENCIES_MS = [12, 15, 11, 40, 13, 90, 14, 16, 12, 18]


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation between closest ranks."""
    raise NotImplementedError("percentile")


def scripted_agent() -> Any:
    from crashoverride.testing import done, exec_python, script

    implement = (
        "def percentile(values, p):\n"
        '    """The p-th percentile (0-100) by linear interpolation between closest ranks."""\n'
        "    ordered = sorted(values)\n"
        "    rank = (len(ordered) - 1) * p / 100\n"
        "    low = int(rank)\n"
        "    high = min(low + 1, len(ordered) - 1)\n"
        "    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)\n"
        "replace_function(globals()['percentile'], percentile)\n"
        "assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 90) == 5\n"
        "caller['p95'] = percentile(LATENCIES_MS, 95)\n"
        "caller['p95']"
    )
    return script(
        exec_python("print(show_source(percentile))"),
        exec_python(implement),
        done("Implemented percentile (linear interpolation), checked it, and set p95."),
    )


def report(co: CrashOverride) -> float | None:
    p95 = None
    with co.handler(prompt="Leave `p95` holding the 95th percentile of LATENCIES_MS."):
        p95 = percentile(LATENCIES_MS, 95)
    return p95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", action="store_true", help="use a real model")
    args = parser.parse_args()
    if not args.live:
        print("(offline: the model is scripted, no AI involved)")
    recoveries: list[Any] = []
    co = CrashOverride(
        project_prompt="Nightly latency report. Implement declared functions from their docs.",
        model=None if args.live else scripted_agent(),
        on_recovery=recoveries.append,
    )
    print("first report: p95 =", report(co))
    print("second report: p95 =", report(co))
    print(f"recoveries: {len(recoveries)}")


if __name__ == "__main__":
    main()
