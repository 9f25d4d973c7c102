"""Single-flight, circuit breaker and the concurrency limit."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from tests.helpers import done_step, exec_step, give_up_step, scripted

PATCH_TRANSFORM = (
    "import anyio\n"
    "await anyio.sleep(0.2)\n"  # long enough for every other failure to queue up behind us
    "def transform(value):\n    return value * 10\n"
    "globals()['transform'] = transform\n"
    "rerun()"
)


def transform(value: int) -> int:
    raise NotImplementedError("transform")


@pytest.fixture(autouse=True)
def _restore_transform() -> Any:
    original = globals()["transform"]
    yield
    globals()["transform"] = original


@pytest.mark.anyio
async def test_fifty_concurrent_identical_failures_cost_one_agent_run(anyio_backend: str) -> None:
    model = scripted(exec_step(PATCH_TRANSFORM), done_step("patched transform"))
    co = CrashOverride(model=model, timeout=30)

    @co.handler()
    async def job(i: int) -> int:
        await anyio.lowlevel.checkpoint()
        return transform(i)

    results: dict[int, int] = {}

    async def run(i: int) -> None:
        results[i] = await job(i)

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(run, i)
    assert results == {i: i * 10 for i in range(50)}
    assert len(model.calls) == 2  # one agent run: a tool turn and the final message
    started = [e for e in logs if e["event"] == "recovery.started"]
    replayed = [e for e in logs if e["event"] == "recovery.succeeded" and e.get("via") == "replay"]
    assert len(started) == 1 and len(replayed) == 49


def test_single_flight_across_threads() -> None:
    model = scripted(exec_step(PATCH_TRANSFORM), done_step())
    co = CrashOverride(model=model)

    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    results: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: job(i)})) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: i * 10 for i in range(8)}
    assert len(model.calls) == 2


@pytest.mark.anyio
async def test_waiters_reraise_at_once_when_the_leader_fails(anyio_backend: str) -> None:
    model = scripted(exec_step("import anyio\nawait anyio.sleep(0.2)\ngive_up('no')"))
    co = CrashOverride(model=model)

    @co.handler()
    async def job() -> int:
        raise KeyError("k")

    errors: list[BaseException] = []

    async def run() -> None:
        try:
            await job()
        except KeyError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(run)
    assert len(errors) == 5
    assert len(model.calls) == 1
    notes = [n for e in errors for n in e.__notes__]
    assert sum("did not recover it" in n for n in notes) == 4


def test_breaker_opens_after_repeated_failures_and_skips_the_model() -> None:
    model = scripted(give_up_step("a"), give_up_step("b"))
    co = CrashOverride(model=model, breaker_threshold=2, breaker_window=60, breaker_cooldown=60)

    def boom() -> None:
        raise KeyError("same place")  # one fingerprint: same type, same line

    for _ in range(2):
        with pytest.raises(KeyError), co.handler():
            boom()
    with capture_logs() as logs, pytest.raises(KeyError) as info, co.handler():
        boom()
    assert len(model.calls) == 2  # the third failure never reached the model
    assert any("circuit breaker open" in n for n in info.value.__notes__)
    assert [e["event"] for e in logs] == ["recovery.skipped"]


def test_breaker_half_opens_after_cool_down() -> None:
    model = scripted(give_up_step("a"), exec_step("pass"), done_step())
    co = CrashOverride(model=model, breaker_threshold=1, breaker_window=60, breaker_cooldown=0.2)

    def failing_block() -> None:
        with co.handler():
            raise KeyError("x")

    with pytest.raises(KeyError):
        failing_block()
    with pytest.raises(KeyError, match="x") as info:
        failing_block()
    assert any("circuit breaker" in n for n in info.value.__notes__)
    time.sleep(0.25)
    failing_block()  # half-open: a trial recovery runs and succeeds
    assert model.remaining_steps == 0


def test_concurrency_limit_skips_when_no_slot_frees_in_time() -> None:
    gate = threading.Event()
    model = scripted(exec_step("gate.wait(10)"), done_step(), exec_step("pass"), done_step())
    co = CrashOverride(
        model=model, max_concurrent_recoveries=1, concurrency_wait=0.2, single_flight=False
    )
    outcomes: list[str] = []

    def first() -> None:
        assert gate is not None  # makes `gate` visible in this frame for the agent's code
        with co.handler():
            raise ValueError("first")
        outcomes.append("first recovered")

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)
    with pytest.raises(KeyError) as info, co.handler():
        raise KeyError("second")
    gate.set()
    t.join(10)
    assert outcomes == ["first recovered"]
    assert any("too many recoveries at once" in n for n in info.value.__notes__)
