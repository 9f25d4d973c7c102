"""Burst: 200 concurrent failing calls with one fingerprint, decorator form on asyncio.

The agent (scripted, instant) repairs the function's code and asks for the call to be re-run.
With single-flight, one agent run repairs it and the 199 waiters replay their own call; without
it, every failure starts its own agent run (admitted up to ``max_concurrent_recoveries``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents.testing import ModelStep, assistant_message, function_call

from benchmarks._common import Row, row
from benchmarks.bench_recovery import InstantModel, _quiet_logs
from crashoverride import CrashOverride

CALLS = 200
REPAIR = "def parse(payload):\n    return payload['cost']\nglobals()['parse'] = parse\nrerun()"


def parse(payload: dict[str, int]) -> int:
    return payload["price"]  # the source renamed the field to "cost"


def _first_turn(items: Any) -> bool:
    """A run's first model call carries no tool output yet."""
    return not any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in items
    )


class CountingModel(InstantModel):
    """Counts agent runs (first model calls)."""

    runs = 0

    def _record_call(self, **kwargs: Any) -> Any:
        if _first_turn(kwargs.get("input") or ()):
            type(self).runs += 1
        return super()._record_call(**kwargs)


def _answer(call: Any) -> list[Any]:
    # Concurrent runs take steps from one queue in any order, so each step answers for the
    # run that asked: its first turn repairs, its second finishes.
    if _first_turn(call.input):
        return [function_call("exec_python", {"statements": REPAIR}, call_id="repair")]
    return [assistant_message("parse reads 'cost'; call re-run")]


def _steps(runs: int) -> list[Any]:
    return [ModelStep.respond(_answer) for _ in range(2 * runs)]


def burst(single_flight: bool) -> tuple[int, float, bool]:
    """Agent runs started, wall seconds, and whether every call returned the right value."""
    global parse
    broken = parse
    CountingModel.runs = 0
    model = CountingModel(_steps(CALLS))
    co = CrashOverride(
        model=model,
        single_flight=single_flight,
        max_concurrent_recoveries=CALLS,
        concurrency_wait=60,
        breaker_threshold=10**9,
        timeout=60,
    )

    @co.handler(prompt="Return the item's price from the payload.")
    async def price(i: int) -> int:
        await asyncio.sleep(0)  # every call starts before any fails
        return parse({"cost": i})

    async def main() -> tuple[float, list[int]]:
        await co.awarm_up()
        began = time.perf_counter()
        values = await asyncio.gather(*(price(i) for i in range(CALLS)))
        return time.perf_counter() - began, list(values)

    try:
        wall, values = asyncio.run(main())
    finally:
        parse = broken  # the next scenario starts broken again
    return CountingModel.runs, wall, values == list(range(CALLS))


def run() -> list[Row]:
    _quiet_logs()
    runs, wall, correct = burst(single_flight=True)
    runs_off, wall_off, correct_off = burst(single_flight=False)
    return [
        row(f"burst: {CALLS} concurrent identical failures, agent runs (single-flight)", runs,
            "runs", target="1", note=f"all {CALLS} results correct: {correct}"),
        row("burst: wall time, single-flight", wall * 1000, "ms", note="scripted instant model"),
        row("burst: agent runs without single-flight (contrast)", runs_off, "runs",
            note=f"all results correct: {correct_off}"),
        row("burst: wall time single-flight vs without", wall * 1000, "ms",
            baseline=wall_off * 1000),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
