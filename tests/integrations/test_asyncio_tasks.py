"""Task wrappers: recovered tasks return a value and spare their siblings; others fail as usual."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from crashoverride import ConfigurationError, CrashOverride
from crashoverride.integrations.asyncio import task
from crashoverride.testing import done, exec_python, give_up, script

pytestmark = pytest.mark.anyio
# asyncio's own TaskGroup and create_task exist only on the asyncio backend.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def test_agent_sets_the_result_of_a_failed_coroutine(anyio_backend: str) -> None:
    co = CrashOverride(model=script(exec_python("set_result(kwargs['n'] + 1)"), done()))
    guard = task(co, prompt="Return n + 1.")

    @guard
    async def increment(*, n: int) -> int:
        await anyio.lowlevel.checkpoint()
        raise NotImplementedError

    assert await increment(n=41) == 42
    assert guard.report is not None and guard.report.recovered
    assert guard.report.handler == "task"
    assert increment.__name__ == "increment"


async def test_rerun_after_the_agent_repairs_the_code(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent patches this module's ``parse``: start from (and restore) the broken one.
    monkeypatch.setitem(globals(), "parse", _broken_parse)
    model = script(
        exec_python(
            "def parse(text):\n    return int(text.strip())\nglobals()['parse'] = parse\nrerun()"
        ),
        done("patched parse"),
    )
    co = CrashOverride(model=model)
    calls: list[str] = []

    @task(co)
    async def load(text: str) -> int:
        calls.append(text)
        await anyio.lowlevel.checkpoint()
        return parse(text)

    assert await load(" 7 ") == 7
    assert calls == [" 7 ", " 7 "]  # the failed call, then exactly one re-run
    assert await load("8") == 8  # later calls use the repaired function


async def test_a_task_call_is_a_unit_of_work_its_rerun_does_not_charge_again(
    anyio_backend: str,
) -> None:
    # The agent repairs the shipping step and reruns the task: the charge the failed call made
    # is declared, so the rerun gets its recorded result instead of charging a second time.
    # The agent defines the missing shipping step in this module: one name per backend, so
    # the second backend's first call fails as the first one's did.
    ship = f"ship_{anyio_backend}"
    co = CrashOverride(model=script(exec_python(_fix_and_rerun(ship)), done()))
    charges: list[int] = []

    @co.effect(key=lambda order: f"charge order {order}")
    async def charge(order: int) -> str:
        charges.append(order)
        await anyio.lowlevel.checkpoint()
        return f"ch_{order}_{len(charges)}"

    @task(co)
    async def checkout(order: int) -> str:
        receipt = await charge(order)
        return f"{receipt} {globals()[ship](order)}"  # missing until the agent adds it

    try:
        assert await checkout(17) == "ch_17_1 shipped 17"
        assert charges == [17]  # charged once, though the task ran twice
        assert await checkout(18) == "ch_18_2 shipped 18"  # the next call is a unit of its own
    finally:
        globals().pop(ship, None)


async def test_a_blind_retry_of_an_interrupted_charge_in_a_task_is_uncertain(
    anyio_backend: str,
) -> None:
    # The charge timed out waiting for the provider's answer: it may have gone through. The
    # agent's rerun must not charge blind; the task fails with its original TimeoutError.
    co = CrashOverride(model=script(exec_python("rerun()"), done()))
    charges: list[int] = []

    @co.effect(key=lambda order: f"charge order {order}")
    async def charge(order: int) -> str:
        charges.append(order)
        await anyio.sleep(0 if len(charges) > 1 else 30)
        return "ch"

    @task(co)
    async def checkout(order: int) -> str:
        with anyio.fail_after(0.2):
            return await charge(order)

    with pytest.raises(TimeoutError) as caught:
        await checkout(5)
    assert charges == [5]
    assert any("EffectUncertain" in note for note in caught.value.__notes__), caught.value


def _fix_and_rerun(name: str) -> str:
    return f"globals()[{name!r}] = lambda order: f'shipped {{order}}'\nrerun()"


def _broken_parse(text: str) -> int:
    raise ValueError(f"cannot parse {text!r}")


parse = _broken_parse


async def test_unrecovered_task_raises_its_original_exception(anyio_backend: str) -> None:
    co = CrashOverride(model=script(give_up("no trustworthy value")))

    @task(co)
    async def fetch() -> int:
        raise KeyError("article_text")

    with pytest.raises(KeyError, match="article_text") as info:
        await fetch()
    assert any("gave up" in note for note in info.value.__notes__)


async def test_uncaught_exception_types_pass_without_a_recovery(anyio_backend: str) -> None:
    model = script()  # any model call would fail the test: no steps scripted
    co = CrashOverride(model=model, catch=KeyError)

    @task(co)
    async def fetch() -> int:
        raise ValueError("not ours")

    with pytest.raises(ValueError, match="not ours"):
        await fetch()
    assert not model.calls


@asyncio_only
async def test_asyncio_taskgroup_recovered_task_spares_its_siblings(anyio_backend: str) -> None:
    co = CrashOverride(model=script(exec_python("set_result('recovered')"), done()))
    guard = task(co)
    finished: list[str] = []

    @guard
    async def broken() -> str:
        await asyncio.sleep(0.01)
        raise RuntimeError("extractor broke")

    async def sibling() -> str:
        await asyncio.sleep(0.3)  # still running while the recovery happens
        finished.append("sibling")
        return "sibling"

    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(broken())
        second = tg.create_task(sibling())
    assert (first.result(), second.result()) == ("recovered", "sibling")
    assert finished == ["sibling"]


@asyncio_only
async def test_asyncio_taskgroup_unrecovered_task_cancels_siblings_as_usual(
    anyio_backend: str,
) -> None:
    co = CrashOverride(model=script(give_up("cannot")))
    cancelled: list[str] = []

    @task(co)
    async def broken() -> str:
        raise RuntimeError("extractor broke")

    async def sibling() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append("sibling")
            raise

    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(broken())
            tg.create_task(sibling())
    assert [type(e) for e in info.value.exceptions] == [RuntimeError]
    assert str(info.value.exceptions[0]) == "extractor broke"
    assert cancelled == ["sibling"]


async def test_anyio_task_group_recovered_task_spares_its_siblings(anyio_backend: str) -> None:
    co = CrashOverride(model=script(exec_python("set_result(len(args))"), done()))
    results: dict[str, Any] = {}

    @task(co)
    async def broken(*parts: str) -> int:
        await anyio.sleep(0.01)
        raise RuntimeError("boom")

    async def run_broken() -> None:
        results["broken"] = await broken("a", "b")

    async def sibling() -> None:
        await anyio.sleep(0.3)
        results["sibling"] = "done"

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_broken)
        tg.start_soon(sibling)
    assert results == {"broken": 2, "sibling": "done"}


async def test_anyio_task_group_unrecovered_task_cancels_siblings(anyio_backend: str) -> None:
    co = CrashOverride(model=script(give_up("cannot")))
    cancelled: list[str] = []

    @task(co)
    async def broken() -> None:
        raise RuntimeError("boom")

    async def sibling() -> None:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.append("sibling")
            raise

    with pytest.raises(ExceptionGroup) as info:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sibling)
            tg.start_soon(broken)
    assert [str(e) for e in info.value.exceptions] == ["boom"]
    assert cancelled == ["sibling"]


@asyncio_only
async def test_wrapped_coroutine_object_and_create_task(anyio_backend: str) -> None:
    model = script(
        exec_python("rerun()"),  # refused for a coroutine object: the agent sees the error
        exec_python("set_result(caller['page'].upper())"),
        done(),
    )
    co = CrashOverride(model=model)
    guard = task(co, prompt="Return the page text upper-cased.")

    async def fetch(url: str) -> str:
        page = f"text of {url}"
        await asyncio.sleep(0)
        raise ConnectionError(page)

    spawned = guard.create_task(fetch("a.example"), name="fetch-a")
    assert spawned in guard._tasks  # held until it ends: never garbage-collected mid-flight
    assert await spawned == "TEXT OF A.EXAMPLE"
    await asyncio.sleep(0)
    assert spawned not in guard._tasks
    first_output = str(model.calls[1].input)
    assert "rerun() is not available" in first_output


@asyncio_only
async def test_cancellation_is_never_recovered(anyio_backend: str) -> None:
    model = script()
    co = CrashOverride(model=model)
    started = asyncio.Event()

    @task(co)
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    running = asyncio.create_task(slow())
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not model.calls


def test_only_coroutines_are_accepted() -> None:
    guard = task(CrashOverride())

    def plain() -> None:
        pass

    with pytest.raises(ConfigurationError):
        guard(plain)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        guard.wrap(42)  # type: ignore[arg-type]


def test_async_scraper_example_runs_offline() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "async_scraper.py")],
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for n in range(1, 11):
        assert f"saved https://news.example/a/{n}: Text of article {n}." in out
    assert "agent runs: 1, replays after the repair: 2" in out
    assert "payload.get('article_text', payload.get('body'))" in out  # the follow-up's fix file


@pytest.mark.parametrize(
    ("declared", "receipt", "expected"),
    [(True, "ch_1", ["ch_1"]), (False, "ch_2", ["ch_1", "ch_2"])],
)
async def test_a_rerun_returns_the_recorded_charge_instead_of_charging_again(
    anyio_backend: str, declared: bool, receipt: str, expected: list[str]
) -> None:
    # Each run of a protected coroutine is a unit of work: its rerun finds the charge the
    # failed run made. Undeclared, the same rerun charges twice.
    co = CrashOverride(model=script(exec_python("STOCK['pen'] = 3\nrerun()"), done()))
    charges: list[str] = []

    def charge(order: int) -> str:
        charges.append(f"ch_{len(charges) + 1}")
        return charges[-1]

    if declared:
        charge = co.effect(charge, key=lambda order: f"charge order {order}")

    @task(co)
    async def buy(order: int, item: str) -> str:
        receipt = charge(order)
        await anyio.lowlevel.checkpoint()
        return f"{receipt}: {STOCK[item]} left"

    STOCK.clear()
    assert await buy(1, "pen") == f"{receipt}: 3 left"
    assert charges == expected


STOCK: dict[str, int] = {}
