"""Recovery machinery: raise → resumed execution with an instant scripted model (warm).

The model is scripted (``agents.testing.ScriptedModel``): these figures are the cost of our
machinery plus the SDK's run loop, not of any real model.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
import weakref
from typing import Any

from agents.testing import ScriptedModel, assistant_message, function_call

from benchmarks._common import Row, row
from crashoverride import CrashOverride

RUNS = 300


class InstantModel(ScriptedModel):
    """ScriptedModel minus its call recording, which would itself grow with every run."""

    def _record_call(self, **kwargs: Any) -> Any:
        call = super()._record_call(**kwargs)
        self._calls.clear()
        return call


def _quiet_logs() -> None:
    # An application decision (the library never configures structlog): render every event
    # as usual but discard it, so the figures include event building but not terminal I/O.
    import structlog

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())


def _steps(n: int) -> list[Any]:
    steps: list[Any] = []
    for i in range(n):
        code = {"statements": "caller['value'] = 1"}
        steps.append([function_call("exec_python", code, call_id=f"c{i}")])
        steps.append([assistant_message("set value")])
    return steps


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.95) - 1]


def sync_latencies(runs: int) -> list[float]:
    model = InstantModel(_steps(runs + 5))
    co = CrashOverride(model=model, single_flight=False, breaker_threshold=10**9)
    samples = []
    for i in range(runs + 5):
        value = 0
        start = time.perf_counter()
        with co.handler(prompt="Leave `value` set."):
            raise KeyError(i)
        elapsed = (time.perf_counter() - start) * 1000
        assert value == 1
        if i >= 5:  # the first runs pay imports and caches
            samples.append(elapsed)
    return samples


def async_latencies(runs: int) -> list[float]:
    async def main() -> list[float]:
        model = InstantModel(_steps(runs + 5))
        co = CrashOverride(model=model, single_flight=False, breaker_threshold=10**9)
        samples = []
        for i in range(runs + 5):
            value = 0
            start = time.perf_counter()
            async with co.handler(prompt="Leave `value` set."):
                raise KeyError(i)
            elapsed = (time.perf_counter() - start) * 1000
            assert value == 1
            if i >= 5:
                samples.append(elapsed)
        return samples

    return asyncio.run(main())


def _rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MB; current from /proc where there is one."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with open("/proc/self/statm") as statm:
            current = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        current = peak
    return current, peak


def memory(recoveries: int) -> tuple[float, float, bool]:
    """Current and peak RSS growth over ``recoveries`` recoveries (MB), and whether the failed
    frames were released. Current is what stays; the peak also counts transient allocations
    and the allocator's fragmentation, which a long-running process reuses."""

    model = InstantModel(_steps(recoveries))
    co = CrashOverride(model=model, single_flight=False, breaker_threshold=10**9)

    class Payload:
        pass

    def one(i: int) -> weakref.ref[Payload]:
        payload = Payload()
        ref = weakref.ref(payload)
        value = 0
        with co.handler():
            raise KeyError(i)
        assert value == 1
        return ref

    for i in range(50):  # warm up allocator pools and caches
        one(i)
    gc.collect()
    before, peak_before = _rss_mb()
    refs = [one(i) for i in range(recoveries - 50)]
    gc.collect()
    after, peak_after = _rss_mb()
    released = all(ref() is None for ref in refs[-100:])
    return after - before, peak_after - peak_before, released


def run() -> list[Row]:
    _quiet_logs()
    sync_p50, sync_p95 = _percentiles(sync_latencies(RUNS))
    async_p50, async_p95 = _percentiles(async_latencies(RUNS))
    growth, peak, released = memory(10_000)
    return [
        row("recovery raise→resume, sync with (owner thread), p50", sync_p50, "ms",
            target="<= 15 ms", note="scripted instant model"),
        row("recovery raise→resume, sync with, p95", sync_p95, "ms"),
        row("recovery raise→resume, async with (asyncio), p50", async_p50, "ms",
            target="<= 15 ms", note="scripted instant model"),
        row("recovery raise→resume, async with, p95", async_p95, "ms"),
        row("memory: RSS growth over 10,000 recoveries (current RSS)", growth, "MB",
            target="< 20 MB", note=f"failed frames released afterwards: {released}; peak RSS "
            f"grew {peak:.1f} MB (transient allocations and allocator fragmentation)"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
