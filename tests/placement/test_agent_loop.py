"""The ``running-loop`` placement: the SDK session runs on the process's agent loop, in a thread
of its own; everything of the application runs on the application's loop.

Decisions under test:
- The SDK's orchestration (the model turns) never runs on the application's loop, so a storm
  of recoveries cannot freeze the application's other requests (``bench_first_recovery``
  measures the stall; these tests pin where each piece runs).
- Agent code, ``approve=``, the check, the application's tools and ``on_handoff`` run on the
  application's loop, in the failed task's context variables: objects bound to that loop (a
  queue, a connection pool) work in them.
- One agent loop per process, shared by every recovery; a fork child gets its own.
- A cancelled recovery leaves no task on the agent loop nor on the application's loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents.testing import ModelStep

from crashoverride import ApprovalRequest, CrashOverride
from crashoverride._placement import agent_loop
from crashoverride.testing import done, exec_python, output_items, script, tool_call

REQUEST = contextvars.ContextVar("request", default="none")
ON_ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the placement under test


def agent_loop_tasks() -> int:
    """Tasks on the agent loop other than the one asking."""
    loop = agent_loop.running()
    if loop is None:
        return 0

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return asyncio.run_coroutine_threadsafe(count(), loop).result(5)


@ON_ASYNCIO
@pytest.mark.anyio
async def test_the_session_runs_off_the_loop_and_the_application_s_code_on_it() -> None:
    app_loop, app_thread = asyncio.get_running_loop(), threading.get_ident()
    arrived: asyncio.Queue[str] = asyncio.Queue()  # bound to the application's loop
    seen: dict[str, Any] = {}

    async def reserve_stock(sku: str) -> str:
        """Reserve one unit of ``sku`` (the application's own async code)."""
        seen["tool"] = (asyncio.get_running_loop() is app_loop, REQUEST.get())
        await arrived.put(sku)  # an object of the application's loop, used from its loop
        return "reserved"

    def approve(call: ApprovalRequest) -> bool:
        seen.setdefault("approve", (threading.get_ident() == app_thread, REQUEST.get()))
        return True

    def model_turn(_: Any) -> Any:
        seen.setdefault("model", threading.current_thread().name)
        return output_items(tool_call("reserve_stock", '{"sku": "A-1"}'))

    def check(_: Any) -> bool:
        seen["check"] = (threading.get_ident() == app_thread, REQUEST.get())
        return True

    model = script()
    model.enqueue(ModelStep.respond(model_turn))
    model.enqueue(output_items(exec_python("caller['stock'] = 'reserved'")))
    model.enqueue(output_items(done("reserved")))
    co = CrashOverride(model=model, tools=[reserve_stock], approve=approve, timeout=30)
    REQUEST.set("req-7")
    stock = None
    async with co.handler(prompt="Reserve the stock.", postcondition=check):
        raise LookupError("stock service moved")
    assert stock == "reserved"
    assert arrived.get_nowait() == "A-1"
    assert seen["model"] == agent_loop.THREAD_NAME  # the SDK's turn ran on the agent loop
    assert seen["tool"] == (True, "req-7")
    assert seen["approve"] == (True, "req-7")
    assert seen["check"] == (True, "req-7")
    assert agent_loop_tasks() == 0


@ON_ASYNCIO
@pytest.mark.anyio
async def test_recoveries_share_one_agent_loop() -> None:
    loops = []
    for _ in range(2):
        co = CrashOverride(model=script(done("noted")), timeout=30)
        try:
            async with co.handler():
                raise LookupError("x")
        except LookupError:
            pass
        loops.append(agent_loop.running())
    assert loops[0] is not None and loops[0] is loops[1]
    assert [t.name for t in threading.enumerate()].count(agent_loop.THREAD_NAME) == 1


async def _hang(_: Any) -> Any:
    await asyncio.sleep(3600)


@ON_ASYNCIO
@pytest.mark.anyio
@pytest.mark.parametrize("stuck", ["model", "agent code", "tool"])
async def test_a_cancelled_recovery_leaves_no_task_on_either_loop(stuck: str) -> None:
    reached = asyncio.Event()

    async def slow_lookup() -> str:
        """Look the value up (never answers)."""
        reached.set()
        await asyncio.sleep(3600)
        return "never"

    async def hang_model(_: Any) -> Any:
        reached_threadsafe()
        await asyncio.sleep(3600)

    app_loop = asyncio.get_running_loop()

    def reached_threadsafe() -> None:
        app_loop.call_soon_threadsafe(reached.set)

    model = script()
    if stuck == "model":
        model.enqueue(ModelStep.respond(hang_model))
    elif stuck == "agent code":
        code = "caller['event'].set()\nawait asyncio.sleep(3600)"
        model.enqueue(output_items(exec_python(code)))
    else:
        model.enqueue(output_items(tool_call("slow_lookup", "{}")))
    co = CrashOverride(model=model, tools=[slow_lookup], timeout=60)
    before = {t for t in asyncio.all_tasks() if not t.done()}
    with anyio.move_on_after(30) as scope:
        async with anyio.create_task_group() as tg:

            async def owner() -> None:
                event = reached  # noqa: F841 (what the agent code sets, through caller[...])
                async with co.handler():
                    raise KeyError("x")

            tg.start_soon(owner)
            await reached.wait()
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught  # cancelled by us, once the stuck point was reached
    with anyio.fail_after(5):
        while agent_loop_tasks() or {t for t in asyncio.all_tasks() if not t.done()} - before:  # noqa: ASYNC110 (polled: tasks end on two loops)
            await anyio.sleep(0.01)


@pytest.mark.slow
def test_a_fork_child_gets_its_own_agent_loop(tmp_path: Path) -> None:
    # The parent's agent loop thread does not exist in a fork child: the child starts one.
    code = """
import asyncio, os, sys
from crashoverride import CrashOverride
from crashoverride._placement import agent_loop
from crashoverride.testing import done, exec_python, script

def once():
    co = CrashOverride(model=script(exec_python("caller['x'] = 1"), done()), timeout=30)
    async def main():
        x = None
        async with co.handler():
            raise KeyError("x")
        return x
    return asyncio.run(main()), agent_loop.running()

value, parent_loop = once()
pid = os.fork()
if pid == 0:
    value, child_loop = once()
    os._exit(0 if value == 1 and child_loop is not parent_loop else 3)
_, status = os.waitpid(pid, 0)
print(value, os.waitstatus_to_exitcode(status))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done_ = subprocess.run(
        # Not -W error: forking a process with threads warns (3.12+), which is what is tested.
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done_.stdout.splitlines()[-1:] == ["1 0"], done_.stdout + done_.stderr
