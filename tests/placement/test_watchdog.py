"""Agent code spinning synchronously on the owner's thread is interrupted at the deadline."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from crashoverride import CrashOverride
from crashoverride._agent.namespace import Workspace
from crashoverride._agent.state import AgentExit
from crashoverride._placement.watchdog import Preempted, guard
from crashoverride.testing import done, exec_python, script

SPIN = "n = 0\nwhile True:\n    n += 1"


def _co() -> CrashOverride:
    return CrashOverride(model=script(exec_python(SPIN), done()), timeout=0.5)


def _timed_out(exc: BaseException) -> bool:
    return any("ran out" in n or "timed out" in n for n in getattr(exc, "__notes__", []))


def test_spin_in_a_sync_block_is_interrupted() -> None:
    began = time.monotonic()
    with pytest.raises(KeyError) as info:
        with _co().handler():
            raise KeyError("x")
    assert time.monotonic() - began < 2.0
    assert _timed_out(info.value)


def test_spin_with_the_owner_loop_blocked_is_interrupted() -> None:
    def sync_code() -> None:
        with _co().handler():
            raise KeyError("x")

    async def main() -> None:
        sync_code()

    began = time.monotonic()
    with pytest.raises(KeyError) as info:
        asyncio.run(main())
    assert time.monotonic() - began < 2.5
    assert _timed_out(info.value)


@pytest.mark.anyio
async def test_spin_on_the_application_loop_is_interrupted(anyio_backend: str) -> None:
    began = time.monotonic()
    with pytest.raises(KeyError) as info:
        async with _co().handler():
            raise KeyError("x")
    assert time.monotonic() - began < 2.5
    assert _timed_out(info.value)


def test_the_watchdog_never_fires_after_the_guarded_code_ended() -> None:
    # Many short guarded snippets whose deadlines pass right after they end: the interrupt
    # must never land in the code that follows them.
    for _ in range(200):
        with guard(time.monotonic() + 0.001):
            pass
    time.sleep(0.05)
    total = 0
    for i in range(100_000):  # plain Python after the guards: would receive a stray interrupt
        total += i
    assert total == sum(range(100_000))


def test_the_watchdog_interrupts_only_its_own_thread() -> None:
    other_done = threading.Event()

    def other() -> None:
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            pass
        other_done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with pytest.raises(Preempted):
        with guard(time.monotonic() + 0.2):
            while True:
                pass
    thread.join(5)
    assert other_done.is_set()


def test_a_blocking_c_call_is_interrupted_only_when_it_returns() -> None:
    began = time.monotonic()
    with pytest.raises(Preempted):
        with guard(time.monotonic() + 0.05):
            time.sleep(0.3)  # C code: the interrupt lands at the first bytecode after it
            while True:
                pass
    assert time.monotonic() - began >= 0.3
    for _ in range(100_000):
        pass  # and nothing stray afterwards


# -- regressions: a stop a bare except cannot swallow; nothing left held; awaited snippets -------


def _in_thread(fn: Callable[[], object], timeout: float) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a daemon thread and wait at most ``timeout`` seconds for it."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # recorded for the test to assert on, never hidden
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return thread, outcome


def _run_snippet(source: str, seconds: float, **names: Any) -> Callable[[], object]:
    workspace = Workspace(globals_=dict(names), caller=None, bindings={})

    def run() -> object:
        workspace.deadline = time.monotonic() + seconds
        return workspace.execute(source)

    return run


# ``released()`` is the test's own way out (the spin never ends by itself); the stop must come
# from the watchdog while it is still false.
SWALLOWING = {
    "swallow_then_spin_again": (
        "try:\n"
        "    while not released():\n"
        "        pass\n"
        "except:\n"
        "    pass\n"
        "while not released():\n"
        "    try:\n"
        "        while not released():\n"
        "            pass\n"
        "    except BaseException:\n"
        "        pass\n"
    ),
    "in_a_function_the_snippet_defines": (
        "def spin():\n"
        "    while not released():\n"
        "        try:\n"
        "            while not released():\n"
        "                pass\n"
        "        except BaseException as exc:\n"
        "            pass\n"
        "spin()\n"
    ),
    "spin_while_holding_what_it_caught": (
        "try:\n"
        "    while not released():\n"
        "        pass\n"
        "except BaseException:\n"
        "    pass\n"
        "try:\n"
        "    n = 1\n"
        "except BaseException as exc:\n"
        "    while not released():\n"
        "        pass\n"
    ),
    "spin_inside_the_handler": (
        "while not released():\n"
        "    try:\n"
        "        while not released():\n"
        "            pass\n"
        "    except:\n"
        "        try:\n"
        "            while not released():\n"
        "                pass\n"
        "        except:\n"
        "            pass\n"
    ),
}


@pytest.mark.parametrize("source", SWALLOWING.values(), ids=list(SWALLOWING))
def test_a_bare_except_cannot_swallow_the_stop(source: str) -> None:
    released = threading.Event()
    try:
        thread, outcome = _in_thread(_run_snippet(source, 0.3, released=released.is_set), 15)
        assert not thread.is_alive(), "the snippet swallowed the stop and is still spinning"
    finally:
        released.set()
    assert isinstance(outcome.get("error"), AgentExit), outcome


def test_a_strike_as_snippets_end_leaves_no_lock_held_and_nothing_stray() -> None:
    # Snippets whose deadline falls right around their end, from two threads at once: the strike
    # lands anywhere near the end of the snippet, including inside the watchdog's own disarm.
    def hammer() -> int:
        workspace = Workspace(globals_={}, caller=None, bindings={})
        interrupted = 0
        for i in range(600):
            workspace.deadline = time.monotonic() + 0.0003 * (i % 7)
            try:
                workspace.execute("n = 0\nwhile n < 300:\n    n += 1")
            except AgentExit:
                interrupted += 1
        return interrupted

    threads = [_in_thread(hammer, 0) for _ in range(2)]
    for thread, _ in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread, _ in threads), "a snippet thread is stuck"
    outcomes = [outcome for _, outcome in threads]
    assert all("value" in outcome for outcome in outcomes), outcomes  # no stray Preempted
    assert sum(outcome["value"] for outcome in outcomes) > 0  # the strikes did happen
    # The watchdog still works: arming does not block, and a spinning snippet is stopped.
    thread, outcome = _in_thread(_run_snippet(SPIN, 0.3), 15)
    assert not thread.is_alive(), "arming blocked or the spin was not interrupted"
    assert isinstance(outcome.get("error"), AgentExit), outcome


AWAITED = {
    "spin": "import anyio\nawait anyio.sleep(0)\nwhile not released():\n    pass",
    "spin_swallowing": (
        "import anyio\n"
        "await anyio.sleep(0)\n"
        "while not released():\n"
        "    try:\n"
        "        while not released():\n"
        "            pass\n"
        "    except BaseException:\n"
        "        pass\n"
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("source", AWAITED.values(), ids=list(AWAITED))
async def test_an_awaited_snippet_spinning_after_an_await_is_interrupted(
    anyio_backend: str, source: str
) -> None:
    # The spin holds the event loop (this test's thread): a timer ends it should nothing else.
    released = threading.Event()
    timer = threading.Timer(10, released.set)
    timer.daemon = True
    workspace = Workspace(globals_={"released": released.is_set}, caller=None, bindings={})
    workspace.deadline = time.monotonic() + 0.3
    timer.start()
    try:
        with pytest.raises(AgentExit):
            await workspace.execute(source)
        assert not released.is_set(), "only the test's own timer ended the spin"
    finally:
        timer.cancel()


@pytest.mark.anyio
async def test_an_awaited_snippet_still_gets_values_and_cancellation(anyio_backend: str) -> None:
    workspace = Workspace(globals_={}, caller=None, bindings={})
    workspace.deadline = time.monotonic() + 30
    source = "import anyio\nawait anyio.sleep(0.01)\nn = 41\nn + 1"
    assert await workspace.execute(source) == 42
    with anyio.move_on_after(0.1) as scope:
        await workspace.execute("import anyio\nawait anyio.sleep(30)")
    assert scope.cancelled_caught


def test_a_debuggers_trace_function_is_restored_and_still_works_after_a_stop() -> None:
    # Stopping a snippet must not leave the interpreter's pending-work flag set for good (as
    # withdrawing a strike with PyThreadState_SetAsyncExc(id, NULL) does before 3.13): under a
    # trace function (a debugger, coverage) the next function call would then spin forever.
    events: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        events.append(event)

    def double(n: int) -> int:
        return 2 * n

    def traced() -> int:
        workspace = Workspace(globals_={}, caller=None, bindings={})
        sys.settrace(tracer)
        try:
            workspace.deadline = time.monotonic() + 30
            assert workspace.evaluate("1 + 1") == 2
            assert sys.gettrace() is tracer
            workspace.deadline = time.monotonic() + 0.2
            with pytest.raises(AgentExit):
                workspace.execute(SPIN)
            assert sys.gettrace() is tracer
            events.clear()
            return sum(double(n) for n in range(10))
        finally:
            sys.settrace(None)

    thread, outcome = _in_thread(traced, 15)
    assert not thread.is_alive(), "a traced call after the stop hangs"
    assert outcome.get("value") == 90, outcome
    assert "call" in events


def test_finished_snippets_leave_nothing_queued_until_their_deadline() -> None:
    # Each snippet's guard used to stay in the watchdog's queue until its recovery's deadline
    # (minutes, by default): a server recovering often held thousands, with their closures.
    from crashoverride._placement import watchdog

    recoveries = 40
    co = CrashOverride(
        model=script(*(step for _ in range(recoveries)
                         for step in (exec_python("caller['value'] = 1"), done()))),
        timeout=600, single_flight=False, breaker_threshold=10**6,
    )  # fmt: skip
    for i in range(recoveries):
        value = 0
        with co.handler():
            raise KeyError(i)
        assert value == 1
    with watchdog._WATCHDOG.lock:
        kept = len(watchdog._WATCHDOG._heap)
    assert kept <= 2  # entries dropped in bulk: at most a stray one or two await a purge
