"""Where the agent runs, and that tool code always runs in the thread that owns the frame."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

PROBE = (
    "import threading\ncaller['thread'] = threading.get_ident()\ncaller['rid'] = request_id.get()\n"
)


def _placement(logs: list[dict[str, Any]]) -> str:
    (started,) = [e for e in logs if e["event"] == "recovery.started"]
    return str(started["placement"])


def test_sync_without_loop_uses_a_temporary_loop_in_this_thread() -> None:
    co = CrashOverride(model=script(exec_python(PROBE), done()))
    request_id.set("r-sync")
    thread = rid = None
    with capture_logs() as logs, co.handler():
        raise ValueError
    assert (thread, rid) == (threading.get_ident(), "r-sync")
    assert _placement(logs) == "owner-thread"


def test_sync_inside_a_running_loop_runs_tools_on_the_blocked_owner_thread() -> None:
    co = CrashOverride(model=script(exec_python(PROBE), done()))

    def sync_code_called_from_async() -> tuple[Any, Any]:
        thread = rid = None
        with co.handler():
            raise ValueError
        return thread, rid

    async def main() -> tuple[Any, Any]:
        request_id.set("r-blocked")
        return sync_code_called_from_async()

    with capture_logs() as logs:
        result = asyncio.run(main())
    assert result == (threading.get_ident(), "r-blocked")
    assert _placement(logs) == "owner-thread"
    (blocked,) = [e for e in logs if e["event"] == "recovery.loop_blocked"]
    assert blocked["log_level"] == "warning" and blocked["blocked_ms"] > 0


@pytest.mark.anyio
async def test_async_with_runs_tools_in_the_owner_thread(anyio_backend: str) -> None:
    co = CrashOverride(model=script(exec_python(PROBE), done()))
    request_id.set(f"r-{anyio_backend}")
    thread = rid = None
    with capture_logs() as logs:
        async with co.handler():
            raise ValueError
    assert (thread, rid) == (threading.get_ident(), f"r-{anyio_backend}")
    expected = "running-loop" if anyio_backend == "asyncio" else "worker-thread-hop"
    assert _placement(logs) == expected


@pytest.mark.anyio
async def test_top_level_await_uses_an_app_owned_async_object(anyio_backend: str) -> None:
    # A memory stream belongs to the application's event loop; awaiting it from the agent's
    # code only works if that code runs on the application's loop.
    send, receive = anyio.create_memory_object_stream[str](1)
    model = script(
        exec_python("await send.send('from the agent')\ncaller['got'] = await receive.receive()"),
        done(),
    )
    co = CrashOverride(model=model)
    got = None
    async with send, receive, co.handler():
        raise ValueError
    assert got == "from the agent"


@pytest.mark.anyio
async def test_async_recovery_does_not_block_other_tasks(anyio_backend: str) -> None:
    ticks = 0
    model = script(
        exec_python("import anyio\nawait anyio.sleep(0.3)\ncaller['slept'] = True"), done()
    )
    co = CrashOverride(model=model)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with co.handler():
            raise ValueError
        tg.cancel_scope.cancel()
    assert ticks >= 10


@pytest.mark.anyio
async def test_cancellation_during_recovery_propagates(anyio_backend: str) -> None:
    model = script(exec_python("import anyio\nawait anyio.sleep(30)"), done())
    co = CrashOverride(model=model, timeout=60)
    before = asyncio.all_tasks() if anyio_backend == "asyncio" else set()
    with anyio.move_on_after(0.5) as scope:
        async with co.handler():
            raise ValueError
    assert scope.cancelled_caught
    # Nothing of the recovery is left running: no agent task, no agent thread.
    await anyio.sleep(0.2)
    if anyio_backend == "asyncio":
        assert asyncio.all_tasks() <= before
    for _ in range(50):
        if not any(t.name == "crashoverride-agent" for t in threading.enumerate()):
            break
        await anyio.sleep(0.05)
    assert not any(t.name == "crashoverride-agent" for t in threading.enumerate())
