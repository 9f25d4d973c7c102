"""The happy path: what a protected block that does not raise costs.

Baselines are measured in the same process, interleaved: ``contextlib.suppress`` (the closest
stdlib context manager), a bare ``try``/``except``, and an undecorated call.
"""

from __future__ import annotations

import asyncio
import contextlib

from benchmarks._common import Row, interleaved, row
from crashoverride import CrashOverride

LOOPS = 200_000


def _sync_rows(co: CrashOverride) -> list[Row]:
    suppress = contextlib.suppress

    def with_handler(n: int) -> None:
        for _ in range(n):
            with co.handler(prompt="Leave `x` set."):
                pass

    def with_suppress(n: int) -> None:
        for _ in range(n):
            with suppress(Exception):
                pass

    def bare_try(n: int) -> None:
        for _ in range(n):
            try:
                pass
            except Exception:
                raise

    handler = co.handler(prompt="Leave `x` set.")

    def with_reused_handler(n: int) -> None:
        for _ in range(n):
            with handler:
                pass

    @co.handler(prompt="Return a value.")
    def decorated() -> int:
        return 1

    def plain() -> int:
        return 1

    def call_decorated(n: int) -> None:
        for _ in range(n):
            decorated()

    def call_plain(n: int) -> None:
        for _ in range(n):
            plain()

    t = interleaved(
        {
            "handler": with_handler,
            "reused": with_reused_handler,
            "suppress": with_suppress,
            "try": bare_try,
            "decorated": call_decorated,
            "plain": call_plain,
        },
        LOOPS,
    )
    return [
        row("with co.handler(prompt=...) vs contextlib.suppress", t["handler"], "ns",
            baseline=t["suppress"], target="<= 1.25"),
        row("with co.handler(prompt=...) vs bare try", t["handler"], "ns", baseline=t["try"]),
        row("with <reused handler> vs contextlib.suppress", t["reused"], "ns",
            baseline=t["suppress"]),
        row("@co.handler call vs plain call", t["decorated"], "ns", baseline=t["plain"],
            note="the extra is one wrapper frame"),
    ]  # fmt: skip


def _async_rows(co: CrashOverride) -> list[Row]:
    async def measure() -> dict[str, float]:
        async def with_handler(n: int) -> None:
            for _ in range(n):
                async with co.handler(prompt="Leave `x` set."):
                    pass

        async def with_suppress(n: int) -> None:
            for _ in range(n):
                async with contextlib.AsyncExitStack():
                    pass

        @co.handler(prompt="Return a value.")
        async def decorated() -> int:
            return 1

        async def plain() -> int:
            return 1

        async def call_decorated(n: int) -> None:
            for _ in range(n):
                await decorated()

        async def call_plain(n: int) -> None:
            for _ in range(n):
                await plain()

        import statistics
        import time

        fns = {
            "handler": with_handler,
            "stack": with_suppress,
            "decorated": call_decorated,
            "plain": call_plain,
        }
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(7):
            for name, fn in fns.items():
                start = time.perf_counter_ns()
                await fn(LOOPS // 2)
                samples[name].append((time.perf_counter_ns() - start) / (LOOPS // 2))
        return {k: statistics.median(v) for k, v in samples.items()}

    t = asyncio.run(measure())
    return [
        row("async with co.handler(...) vs async with AsyncExitStack()", t["handler"], "ns",
            baseline=t["stack"], note="asyncio; no stdlib async suppress exists"),
        row("@co.handler async call vs plain async call", t["decorated"], "ns",
            baseline=t["plain"]),
    ]  # fmt: skip


def run() -> list[Row]:
    co = CrashOverride(project_prompt="benchmark", model="unused")
    return _sync_rows(co) + _async_rows(co)


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
