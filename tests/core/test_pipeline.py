"""Regression tests for the one pipeline: re-entrancy, slots, single-flight, verdict, interrupts,
recursion, leaks and cancellation bookkeeping (issue 10's confirmed defects 4-11, 18, 19)."""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride.testing import Script, done, exec_python, give_up, script
from tests.helpers import recurse_to_the_limit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Payload:
    """A local whose lifetime the leak tests watch."""


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


# -- 4. a failure raised inside a recovery never waits on that recovery -----------------------


def test_agent_verifying_by_calling_the_function_again_does_not_wait_on_itself() -> None:
    model = script(
        exec_python(
            "try:\n    divide(0)\nexcept ZeroDivisionError as again:\n"
            "    print('verify failed as expected:', again.__notes__)\n"
        ),
        exec_python("set_result(-1)"),
        done(),
    )
    co = CrashOverride(model=model, timeout=3)

    @co.handler()
    def divide(x: int) -> float:
        return 1 / x

    globals()["divide"] = divide  # what the agent's namespace sees (the module's globals)
    assert divide(0) == -1
    assert divide.__wrapped__  # type: ignore[attr-defined]
    report = co.handler().report  # a fresh handler has no report in this context
    assert report is None
    assert "raised by agent code of recovery" in model.calls[1].input[-1]["output"]


# -- 5. interrupting a sync wait for a slot never leaks the slot -----------------------------


def test_interrupting_a_sync_wait_for_a_slot_hands_the_slot_on() -> None:
    model = (
        Script(exec_python("import time\ntime.sleep(1.0)\ncaller['value'] = 1"), done())
        .run(exec_python("caller['value'] = 3"), done())
        .model()
    )
    co = CrashOverride(model=model, max_concurrent_recoveries=1, concurrency_wait=5)

    def holder() -> None:
        with co.handler(name="holder"):
            value = int("one")
        assert value == 1

    # A runner started in the background may ignore SIGINT: Ctrl-C is what this test is about.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    first = threading.Thread(target=holder)
    first.start()
    try:
        time.sleep(0.3)  # the holder has the only slot now
        threading.Timer(0.3, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            with co.handler(name="waiter"):
                int("two")
    finally:
        signal.signal(signal.SIGINT, previous)
    first.join(30)
    with co.handler(name="later") as later:
        value = int("three")
    assert value == 3, later.report


# -- 6. single-flight holds under slot contention: one agent run per fingerprint -------------


@pytest.mark.slow
def test_waiters_never_run_their_own_agent_while_the_leader_waits_for_a_slot() -> None:
    model = (
        Script(exec_python("import time\ntime.sleep(0.8)\ncaller['x'] = 0"), done())  # unrelated
        .run(exec_python("import time\ntime.sleep(0.9)\nset_result(5)"), done())  # the leader
        .run(exec_python("set_result(6)"), done())  # a second run of the same failure, if any
        .model()
    )
    co = CrashOverride(model=model, timeout=1, max_concurrent_recoveries=1, concurrency_wait=10)

    @co.handler()
    def same(i: int) -> int:
        raise LookupError("same place every time")

    def unrelated() -> None:
        with co.handler():
            x = 1 // 0
        del x

    results: list[Any] = []

    def call(i: int) -> None:
        try:
            results.append(same(i))
        except LookupError as exc:
            results.append(exc)

    with capture_logs() as logs:
        threads = [threading.Thread(target=unrelated)]
        threads += [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join(30)
    lookup = [e for e in _events(logs, "recovery.started") if "LookupError" in e["fingerprint"]]
    assert len(lookup) <= 1, lookup


# -- 7. one verdict: "recovered" needs evidence --------------------------------------------


def test_a_postcondition_returning_a_reason_is_not_recovered() -> None:
    model = script(exec_python("caller['value'] = 2"), done())
    co = CrashOverride(model=model)
    with pytest.raises(ValueError) as raised:
        with co.handler(postcondition=lambda view: "value must be positive, got 2?"):
            value = int("x")
        del value
    assert "value must be positive" in raised.value.__notes__[-1]


def test_a_with_block_is_not_recovered_by_a_final_message_alone() -> None:
    model = script(done("I could not fix it"))
    co = CrashOverride(model=model)
    with pytest.raises(ValueError) as raised:
        with co.handler() as handler:
            int("x")
    assert "no evidence of recovery" in raised.value.__notes__[-1]
    assert handler.report is not None and handler.report.outcome == "failed"


def test_a_with_block_is_not_recovered_when_every_snippet_was_denied() -> None:
    model = script(exec_python("caller['value'] = 1"), done("fixed"))
    co = CrashOverride(model=model, approve=lambda code: False)
    with pytest.raises(ValueError):
        with co.handler():
            value = int("x")
        del value


# -- 8. an interrupt raised by agent code keeps the user's exception -------------------------


def test_agent_raised_keyboard_interrupt_keeps_the_users_exception(
    capfd: pytest.CaptureFixture[str],
) -> None:
    co = CrashOverride(model=script(exec_python("raise KeyboardInterrupt")))
    original: BaseException | None = None
    with pytest.raises(KeyboardInterrupt) as raised:
        try:
            with co.handler():
                int("x")
        except ValueError as exc:  # pragma: no cover - the interrupt must come out instead
            original = exc
    assert original is None
    assert isinstance(raised.value.__context__, ValueError)
    gc.collect()
    assert "Task was destroyed" not in capfd.readouterr().err


@pytest.mark.anyio
async def test_agent_raised_keyboard_interrupt_keeps_the_users_exception_async(
    anyio_backend: str,
) -> None:
    co = CrashOverride(model=script(exec_python("raise KeyboardInterrupt")))
    with pytest.raises(KeyboardInterrupt) as raised:
        async with co.handler():
            int("x")
    assert isinstance(raised.value.__context__, ValueError)


# -- 9. one exception, one recovery, one note ----------------------------------------------


def test_a_recursive_failure_is_recovered_once_with_one_note() -> None:
    model = Script(give_up("cannot")).run(exec_python("set_result(7)"), done()).model()
    co = CrashOverride(model=model, breaker_threshold=2)

    @co.handler()
    def depth(n: int) -> int:
        if n == 5:
            raise RuntimeError("bottom")
        return depth(n + 1)

    with capture_logs() as logs:
        with pytest.raises(RuntimeError) as raised:
            depth(0)
    assert len(_events(logs, "recovery.started")) == 1
    assert len(_events(logs, "recovery.skipped")) == 0
    assert len(raised.value.__notes__) == 1

    @co.handler()
    def unrelated() -> int:
        raise KeyError("elsewhere")

    assert unrelated() == 7  # the breaker did not open on one exception's way out


def test_infinite_recursion_carries_one_note() -> None:
    co = CrashOverride(model=script(give_up("infinite recursion")))

    @co.handler()
    def forever(n: int) -> int:
        return forever(n + 1)

    with pytest.raises(RecursionError) as raised:
        forever(0)
    assert len(raised.value.__notes__) == 1
    assert len("".join(raised.value.__notes__)) < 2_000


def test_a_failure_at_the_recursion_limit_keeps_its_exception_and_one_note() -> None:
    # Whatever stack is left where the failure surfaces, our own code running out of it must
    # not replace the user's RecursionError, nor leave it without its one note.
    pads = range(0, 80, 3)
    co = CrashOverride(
        model=script(*(give_up("infinite recursion") for _ in pads)),
        breaker_threshold=10**6,
    )

    @co.handler()
    def forever(n: int) -> int:
        return forever(n + 1)

    for pad, error in zip(pads, recurse_to_the_limit(forever, pads), strict=True):
        notes = [n for n in getattr(error, "__notes__", ()) if "crashoverride" in n]
        assert len(notes) == 1, (pad, getattr(error, "__notes__", None))


def test_a_recursion_through_a_with_block_keeps_the_user_s_recursion_error() -> None:
    # The block's exit runs at the depth the recursion reached: whatever of it has no stack
    # left lets the user's RecursionError go on (it used to be replaced by one raised in
    # ``__exit__``, looking up the handler's settings).
    pads = range(0, 40, 3)
    co = CrashOverride(
        model=script(*(give_up("infinite recursion") for _ in pads)), breaker_threshold=10**6
    )
    block = co.handler()
    assert block.settings is not None  # built now, as a handler used before would have

    @co.handler()
    def forever(n: int) -> int:
        with block:
            return forever(n + 1)

    recurse_to_the_limit(forever, pads)


# -- 10. handlers in a loop leave no context entries and no reports behind --------------------


_LOOP_SCRIPT = """
import contextvars, gc
from crashoverride import CrashOverride, RecoveryReport
from crashoverride.testing import done, exec_python, script

steps = []
for _ in range(200):
    steps += [exec_python("caller['value'] = 1"), done()]
model = script(*steps)
co = CrashOverride(model=model)
sizes = []
for _ in range(200):
    with co.handler(prompt="loop"):
        value = int("x")
    assert value == 1
    sizes.append(len(contextvars.copy_context()))
del model, co  # the scripted model records every request (tools included): not ours
gc.collect()
alive = [o for o in gc.get_objects() if isinstance(o, RecoveryReport)]
print(sizes[-1] - sizes[0], len(alive))
"""


@pytest.mark.slow
def test_a_handler_per_iteration_keeps_no_reports_alive() -> None:
    # A fresh interpreter: the test runner's own bookkeeping must not count as a leak.
    done = subprocess.run(
        [sys.executable, "-c", _LOOP_SCRIPT], capture_output=True, text=True, timeout=300,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    added_entries, reports_alive = map(int, done.stdout.split()[-2:])
    assert added_entries == 0  # one variable for every handler, not one per handler
    assert reports_alive <= 1  # the latest, reachable through the context, at most


# -- 11. a finished recovery is freed by reference counting ----------------------------------


def test_the_sync_decorator_frees_the_failed_frame_without_cyclic_gc() -> None:
    co = CrashOverride(model=script(exec_python("set_result(1)"), done()))
    watched: list[weakref.ref[Payload]] = []

    @co.handler()
    def work() -> int:
        payload = Payload()
        watched.append(weakref.ref(payload))
        raise ValueError("boom")

    gc.collect()
    gc.disable()
    try:
        assert work() == 1
        assert watched[0]() is None
    finally:
        gc.enable()


# -- 18. every started recovery ends with exactly one terminal event --------------------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_cancelled_recovery_ends_with_one_terminal_event(anyio_backend: str) -> None:
    co = CrashOverride(model=script(exec_python("import anyio\nawait anyio.sleep(30)")))
    with capture_logs() as logs:
        with anyio.move_on_after(1.0):
            async with co.handler():
                int("x")
        await anyio.sleep(0.2)
    gc.collect()
    kinds = [e["event"] for e in logs if e["event"].startswith("recovery.")]
    terminal = [k for k in kinds if k.split(".")[1] in ("succeeded", "failed", "skipped",
                                                          "cancelled")]  # fmt: skip
    assert "recovery.started" in kinds
    assert terminal == ["recovery.cancelled"], kinds
    if anyio_backend == "asyncio":
        names = [t.get_coro().__qualname__ for t in asyncio.all_tasks()]  # type: ignore[union-attr]
        assert not [n for n in names if "run" in n.lower() and "agent" in n.lower()], names


# -- 19. await-snippets of a sync block called from async code run on the owner's thread -------

_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


def test_await_snippets_run_on_the_owner_thread_with_its_context() -> None:
    model = script(
        exec_python(
            "import asyncio, threading\nawait asyncio.sleep(0)\n"
            "caller['seen'] = (threading.get_ident(), REQUEST.get())"
        ),
        done(),
    )
    co = CrashOverride(model=model)

    def sync_code() -> tuple[int, str]:
        with co.handler():
            seen = int("x")
        return seen  # type: ignore[return-value]

    async def main() -> tuple[tuple[int, str], int]:
        _REQUEST.set("r-42")
        return sync_code(), threading.get_ident()

    globals()["REQUEST"] = _REQUEST
    seen, owner = asyncio.run(main())
    assert seen == (owner, "r-42")


# -- 3. a follow-up's agent code on the application's loop is stopped at its deadline ---------

_FOLLOWUP_SPIN = """
import anyio
from crashoverride import CrashOverride
from crashoverride.followups import TaskGroupRunner
from crashoverride.testing import done, exec_python, script

model = script(
    exec_python("caller['value'] = 1"), done(),  # the recovery
    exec_python("while True:\\n    pass"), done(),  # the follow-up spins on the app's loop
)
co = CrashOverride(model=model, followups=["check the repair"], followup_timeout=1)
results = []

async def main():
    async with TaskGroupRunner(grace=30):
        async with co.handler():
            value = int("x")
        results.append(value)
    print("done", results)

anyio.run(main)
"""


@pytest.mark.slow
def test_a_spinning_followup_on_the_app_loop_is_stopped_at_its_deadline() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FOLLOWUP_SPIN], capture_output=True, text=True, timeout=60,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done [1]" in done.stdout
    assert "followup.failed" in done.stdout and "timed out after 1s" in done.stdout


def test_a_finished_recovery_is_freed_by_reference_counting() -> None:
    # Defect 11: nothing of a finished recovery may wait for the cyclic collector (a busy server
    # would carry every record, guard and closure until the next full collection).
    co = CrashOverride(
        model=script(*(s for _ in range(10) for s in (exec_python("caller['value'] = 1"),
                                                         done()))),
        single_flight=False,
    )  # fmt: skip

    def one() -> None:
        value = 0
        with co.handler():
            raise KeyError("x")
        assert value == 1

    one()  # first-use caches
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(9):
            one()
        gc.collect()
        left = {type(o).__module__ for o in gc.garbage if hasattr(o, "__dict__")}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not {m for m in left if m.startswith("crashoverride")}, left
