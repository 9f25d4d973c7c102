"""Agent code spinning synchronously on the owner's thread is interrupted at the deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from crashoverride import CrashOverride
from crashoverride._watchdog import Preempted, guard
from tests.helpers import done_step, exec_step, scripted

SPIN = "n = 0\nwhile True:\n    n += 1"


def _co() -> CrashOverride:
    return CrashOverride(model=scripted(exec_step(SPIN), done_step()), timeout=0.5)


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
