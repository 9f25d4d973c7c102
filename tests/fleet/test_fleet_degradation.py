"""A Redis that accepts connections but never answers: recoveries go on in-process.

Such a Redis (a hung server, a stopped process, a black-holing proxy) is worse than a dead one: a
refused connection fails at once, a silent one only by time-out. A recovery gives Redis one
``op_timeout`` in all, the process's first connection included; that connection attempt may go
on in the background (a later recovery can use it) and must not leak its socket. How long the
fall-back takes is measured in benchmarks/bench_fleet.py, not asserted here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.testing import Script, done, exec_python, script
from tests.fleet.support import FLEET_KEY, close_fleet, private_redis, silent_redis
from tests.helpers import wait_for

FIX = "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\nrerun()"


def transform(value: int) -> int:
    raise NotImplementedError("transform")


ORIGINAL = transform.__code__


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    transform.__code__ = ORIGINAL
    yield
    transform.__code__ = ORIGINAL


@contextmanager
def hung_redis(kind: str) -> Iterator[tuple[str, Any]]:
    """A Redis URL that accepts connections and never answers, and the server behind it."""
    if kind == "silent socket":
        with silent_redis() as server:
            yield server.url, server
        return
    with private_redis() as (url, proc):  # a real redis-server, stopped before any connection
        proc.send_signal(signal.SIGSTOP)
        try:
            yield url, proc
        finally:
            proc.send_signal(signal.SIGCONT)


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["silent socket", "stopped redis-server"])
async def test_a_first_connection_that_is_never_answered_costs_one_op_timeout(
    kind: str, anyio_backend: str
) -> None:
    model = script(exec_python(FIX), done("fixed"))
    with hung_redis(kind) as (url, _):
        # The recovery's deadline (3 s) is shorter than five op_timeouts (1 s each): only a
        # fall-back after one op_timeout leaves it time to recover in-process.
        fleet = RedisCoordination(url, namespace="hung", key=FLEET_KEY, op_timeout=1.0)
        co = CrashOverride(model=model, timeout=3, coordination=fleet)

        @co.handler()
        async def job(i: int) -> int:
            return transform(i)

        results: dict[int, int] = {}

        async def run(i: int) -> None:
            results[i] = await job(i)

        with capture_logs() as logs, anyio.fail_after(30):  # nothing hangs
            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(run, i)
        close_fleet(co)
    assert results == {i: i * 10 for i in range(5)}
    assert len(model.calls) == 2  # in-process single-flight: one agent run
    (degraded,) = events(logs, "coordination.degraded")
    assert degraded["fleet_role"] == "degraded" and degraded["retry_after"] == 5.0
    assert {e["fleet_role"] for e in events(logs, "recovery.succeeded")} == {"degraded", "waiter"}


def test_the_connection_attempt_goes_on_in_the_background_and_is_closed_with_the_app() -> None:
    model = Script(exec_python(FIX), done("fixed")).run(exec_python(FIX), done("fixed")).model()
    with silent_redis() as server:
        # Redis is tried again at every failure (retry_after); a connection attempt outlives a
        # recovery (five op_timeouts), so the second recovery meets the first one's attempt.
        fleet = RedisCoordination(server.url, namespace="hung", key=FLEET_KEY, op_timeout=1.0,
                                  retry_after=0.001)  # fmt: skip
        co = CrashOverride(model=model, timeout=10, coordination=fleet)

        @co.handler()
        def job(i: int) -> int:
            return transform(i)

        with capture_logs() as logs:
            assert job(1) == 10
            transform.__code__ = ORIGINAL  # the same failure again
            assert job(2) == 20
        assert len(events(logs, "coordination.degraded")) == 2
        assert server.accepted == 1  # one connection attempt, shared
        close_fleet(co)
        wait_for(lambda: server.open_connections == 0)  # its socket closed: nothing leaks


def test_a_connection_that_opens_late_serves_the_next_recovery() -> None:
    model = Script(exec_python(FIX), done("fixed")).run(exec_python(FIX), done("fixed")).model()
    with private_redis() as (url, proc):
        fleet = RedisCoordination(url, namespace=f"late-{os.getpid()}", key=FLEET_KEY,
                                  op_timeout=1.0, retry_after=0.001)  # fmt: skip
        co = CrashOverride(model=model, timeout=10, coordination=fleet)

        @co.handler()
        def job(i: int) -> int:
            return transform(i)

        proc.send_signal(signal.SIGSTOP)  # a Redis that hangs...
        try:
            with capture_logs() as logs:
                assert job(1) == 10  # ...costs this recovery one op_timeout: in-process
        finally:
            proc.send_signal(signal.SIGCONT)  # ...and answers again before the attempt gives up
        wait_for(lambda: _clients(url) == 1)  # the attempt connected, in the background
        transform.__code__ = ORIGINAL
        with capture_logs() as later:
            assert job(2) == 20
        close_fleet(co)
    assert [e["fleet_role"] for e in events(logs, "coordination.degraded")] == ["degraded"]
    assert events(later, "coordination.degraded") == []
    assert {e["fleet_role"] for e in events(later, "recovery.succeeded")} == {"leader"}


def _clients(url: str) -> int:
    """Clients connected to that Redis, besides the one asking."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()
