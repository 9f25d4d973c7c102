"""The decorator's happy path beside the retry decorators users already run.

The same function, called undecorated, under ``@co.handler(prompt=...)``, under
``tenacity.retry`` and under ``stamina.retry``, each configured as a user would for a flaky call
(retry on any ``Exception``, three attempts, exponential back-off); none of them ever raises
here, so this is what every successful call pays. Measured interleaved in one process, sync and
asyncio; ratios are to the undecorated call. (The ASGI peers, sentry-sdk's integration, are in
``bench_asgi``.)

tenacity and stamina are in the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks._common import Row, ainterleaved, interleaved, row
from crashoverride import CrashOverride

# Calls per round: fast functions need many for a measurable round, the peers' few thousand
# take as long (a round of each is some tens of milliseconds).
LOOPS = {"plain": 200_000, "crashoverride": 200_000, "tenacity": 3_000, "stamina": 3_000}
_NAMES = {
    "crashoverride": "@co.handler(prompt=...)",
    "tenacity": "@tenacity.retry(stop_after_attempt(3), wait_exponential, retry on Exception)",
    "stamina": "@stamina.retry(on=Exception, attempts=3)",
}


def _decorators() -> dict[str, Callable[[Any], Any]]:
    try:
        import stamina
        import tenacity
    except ModuleNotFoundError as exc:
        raise RuntimeError(f"{exc.name} is not installed: pip install -e '.[bench]'") from exc
    co = CrashOverride(project_prompt="benchmark", model="unused")
    return {
        "plain": lambda func: func,
        "crashoverride": co.handler(prompt="Return the value."),
        "tenacity": tenacity.retry(
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2),
            retry=tenacity.retry_if_exception_type(Exception),
            reraise=True,
        ),
        "stamina": stamina.retry(on=Exception, attempts=3),
    }


def _sync(decorators: dict[str, Callable[[Any], Any]]) -> dict[str, float]:
    def looper(func: Callable[[], int]) -> Callable[[int], None]:
        def loop(n: int) -> None:
            for _ in range(n):
                func()

        return loop

    def fetch() -> int:
        return 1

    return interleaved({k: looper(d(fetch)) for k, d in decorators.items()}, LOOPS)


def _async(decorators: dict[str, Callable[[Any], Any]]) -> dict[str, float]:
    def looper(func: Callable[[], Awaitable[int]]) -> Callable[[int], Awaitable[None]]:
        async def loop(n: int) -> None:
            for _ in range(n):
                await func()

        return loop

    async def fetch() -> int:
        return 1

    fns = {k: looper(d(fetch)) for k, d in decorators.items()}
    return asyncio.run(ainterleaved(fns, {k: n // 2 for k, n in LOOPS.items()}))


def _rows(kind: str, t: dict[str, float]) -> list[Row]:
    extra = {name: t[name] - t["plain"] for name in _NAMES}
    smallest = min(extra, key=lambda name: extra[name]) == "crashoverride"
    rows = []
    for name, label in _NAMES.items():
        note = f"{extra[name]:+.0f} ns a call"
        if name == "crashoverride":
            note += f"; smallest overhead of the three: {smallest}"
        rows.append(
            row(f"{kind} call: {label} vs undecorated", t[name], "ns", baseline=t["plain"],
                note=note)
        )  # fmt: skip
    return rows


def run() -> list[Row]:
    decorators = _decorators()
    return _rows("decorated sync", _sync(decorators)) + _rows(
        "decorated async (asyncio)", _async(decorators)
    )


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
