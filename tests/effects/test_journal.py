"""Declared effects within one process: a replay or the agent's own code never repeats one.

Every test goes through the public API (``CrashOverride.effect``, handlers, the scripted-model
kit); the "outside world" is a list of the charges made.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from crashoverride import NOT_DONE, ConfigurationError, CrashOverride, EffectUncertain
from crashoverride.testing import MockServer, done, exec_python, give_up, script
from tests.helpers import recurse_to_the_limit


def fix_and_rerun(name: str) -> str:
    """The agent defines the missing ``name`` (each test its own: agent code writes module
    globals) and has the call made again."""
    return f"globals()[{name!r}] = lambda order: f'shipped {{order}}'\nrerun()"


def _shop(co: CrashOverride) -> tuple[list[int], Any]:
    charges: list[int] = []

    @co.effect(key=lambda order, amount: f"charge order {order}")
    def charge(order: int, amount: int) -> str:
        charges.append(order)
        return f"ch_{order}_{len(charges)}"

    return charges, charge


def test_a_rerun_returns_the_recorded_charge_instead_of_charging_again() -> None:
    co = CrashOverride(model=script(exec_python(fix_and_rerun("ship_a")), done()))
    charges, charge = _shop(co)
    receipts: list[str] = []

    @co.handler()
    def checkout(order: int) -> str:
        receipts.append(charge(order, 100))
        return ship_a(order)  # noqa: F821  (missing until the agent defines it)

    assert checkout(17) == "shipped 17"
    assert charges == [17]  # charged once, though the whole call ran twice
    assert receipts == ["ch_17_1", "ch_17_1"]  # the re-run got the recorded receipt


def test_without_the_declaration_the_rerun_charges_twice() -> None:
    # The same shop with its charge not declared: what the journal prevents.
    co = CrashOverride(model=script(exec_python(fix_and_rerun("ship_b")), done()))
    charges: list[int] = []

    def charge(order: int, amount: int) -> str:
        charges.append(order)
        return f"ch_{order}"

    @co.handler()
    def checkout(order: int) -> str:
        charge(order, 100)
        return ship_b(order)  # noqa: F821

    assert checkout(18) == "shipped 18"
    assert charges == [18, 18]


def test_agent_code_calling_the_effect_again_gets_the_recorded_result() -> None:
    # Each piece of agent code is an attempt of the unit: the charge the failed block made is
    # its first call of "charge order 19", so it gets that receipt, however often it tries.
    co = CrashOverride(
        model=script(
            exec_python("caller['receipt'] = charge(19, 100)"),
            exec_python("caller['again'] = charge(19, 100)"),
            done(),
        )
    )
    charges, charge = _shop(co)
    receipt = again = None
    with co.handler():
        charge(19, 100)
        raise KeyError("shipping")
    assert charges == [19]
    assert receipt == again == "ch_19_1"


def test_each_call_is_matched_to_the_same_call_of_the_first_run() -> None:
    # Two charges with one key in the first run are two effects: the replay's first call
    # gets the first receipt, its second the second, and a third call (new) runs.
    co = CrashOverride(model=script(exec_python(fix_and_rerun("ship_c")), done()))
    charges: list[int] = []

    @co.effect(key=lambda order: f"instalment of {order}")
    def instalment(order: int) -> str:
        charges.append(order)
        return f"in_{len(charges)}"

    runs: list[list[str]] = []

    @co.handler()
    def pay(order: int) -> str:
        runs.append([instalment(order), instalment(order)])
        if len(runs) == 2:
            runs[-1].append(instalment(order))
        return ship_c(order)  # noqa: F821

    assert pay(3) == "shipped 3"
    assert runs == [["in_1", "in_2"], ["in_1", "in_2", "in_3"]]
    assert charges == [3, 3, 3]


def test_an_effect_that_raised_runs_again() -> None:
    co = CrashOverride(model=script(exec_python("rerun()"), done()))
    tries: list[int] = []

    @co.effect
    def send(mail: str) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("smtp down")
        return "sent"

    @co.handler()
    def notify() -> str:
        return send("hello")

    assert notify() == "sent"
    assert len(tries) == 2  # the failed send did not happen: it is made by the re-run


def test_outside_any_unit_an_effect_is_a_plain_call() -> None:
    co = CrashOverride()
    charges, charge = _shop(co)
    assert [charge(1, 5), charge(1, 5)] == ["ch_1_1", "ch_1_2"]
    assert charges == [1, 1]
    assert charge.__name__ == "charge"


def test_the_agent_sees_the_unit_s_journal_in_its_brief_and_through_effects() -> None:
    with MockServer([exec_python("caller['seen'] = effects()"), done()]) as server:
        co = server.crash_override()
        charges, charge = _shop(co)
        seen: Any = None
        with co.handler():
            charge(21, 100)
            raise KeyError("shipping")
        first = json.dumps(server.requests[0].messages)
    assert seen == [
        {"effect": "charge order 21", "key": "_shop.<locals>.charge:charge order 21",
         "state": "done", "result": "ch_21_1"}
    ]  # fmt: skip
    assert "charge order 21 -> 'ch_21_1' (done)" in first
    assert charges == [21]


@pytest.mark.anyio
async def test_an_interrupted_effect_without_a_probe_is_uncertain_in_the_replay() -> None:
    # The first attempt's charge timed out while waiting for the processor: it may have gone
    # through. The re-run must not charge blind: it fails with EffectUncertain, which the
    # agent sees; the original failure stands.
    co = CrashOverride(model=script(exec_python("rerun()"), done()))
    started: list[int] = []

    @co.effect(key=lambda order: f"charge order {order}")
    async def charge(order: int) -> str:
        started.append(order)
        await anyio.sleep(0 if len(started) > 1 else 10)
        return "ch"

    @co.handler()
    async def checkout(order: int) -> str:
        with anyio.fail_after(0.05):
            return await charge(order)

    with pytest.raises(TimeoutError) as caught:
        await checkout(5)
    assert started == [5]
    assert any("EffectUncertain" in note for note in caught.value.__notes__), caught.value


@pytest.mark.anyio
async def test_an_interrupted_effect_is_settled_by_its_probe() -> None:
    co = CrashOverride(model=script(exec_python("rerun()"), done()))
    processor: dict[int, str] = {}
    asked: list[int] = []

    async def find(order: int) -> Any:
        asked.append(order)
        return processor.get(order, NOT_DONE)

    @co.effect(key=lambda order: f"charge order {order}", probe=find)
    async def charge(order: int) -> str:
        processor[order] = f"ch_{order}"  # the processor took it...
        if len(asked) == 0:
            await anyio.sleep(10)  # ...but the answer never came back in time
        return processor[order]

    @co.handler()
    async def checkout(order: int) -> str:
        with anyio.fail_after(0.05):
            return await charge(order)

    assert await checkout(6) == "ch_6"
    assert asked == [6]


def test_bad_declarations_fail_at_once() -> None:
    co = CrashOverride()
    with pytest.raises(ConfigurationError, match="key"):
        co.effect(print, key="order")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="probe"):
        co.effect(print, probe=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="generator"):

        @co.effect
        def gen() -> Any:
            yield 1


def test_effect_uncertain_is_public_and_says_what_to_do() -> None:
    error = EffectUncertain("charge order 1", "task-9")
    assert "probe=" in str(error) and error.effect == "charge order 1" and error.unit == "task-9"


def test_a_unit_of_work_with_an_id_is_found_again_by_its_next_run() -> None:
    # What an integration does for a task id or an idempotency key: the second run of unit
    # "order-8" (a retry) gets the charge the first run made; another id charges anew.
    from crashoverride import integration

    co = CrashOverride()
    charges, charge = _shop(co)
    handler = co.handler()
    receipts = []
    for unit_id in ("order-8", "order-8", "order-9"):
        with integration.unit_of_work(handler, unit_id):
            receipts.append(charge(8, 100))
    assert receipts == ["ch_8_1", "ch_8_1", "ch_8_2"]
    assert charges == [8, 8]
    with integration.unit_of_work(handler):  # no id: a unit of this run only
        assert charge(8, 100) == "ch_8_3"


def test_a_key_that_fails_later_does_not_break_the_recovery() -> None:
    # key= runs only when the journal is first consulted (never on the happy path): one that
    # raises then leaves its entry unmatched and the recovery goes on.
    co = CrashOverride(model=script(exec_python("caller['seen'] = effects()"), done()))
    calls: list[int] = []

    @co.effect(key=lambda order: 1 / order)
    def charge(order: int) -> None:
        calls.append(order)

    seen: Any = None
    with co.handler():
        charge(0)
        raise KeyError("shipping")
    assert calls == [0]
    assert seen[0]["effect"] == "(an effect whose key= raised ZeroDivisionError)"


def _transform(value: int) -> int:
    raise NotImplementedError("transform")


@pytest.mark.anyio
async def test_single_flight_waiters_replay_without_charging_again() -> None:
    # Twenty concurrent orders fail alike: one agent run repairs the code, the nineteen others
    # wait and replay through it. Every order charged before failing; none is charged twice.
    patch = (
        "def _transform(value):\n    return value * 10\n"
        "globals()['_transform'] = _transform\nrerun()"
    )
    co = CrashOverride(model=script(exec_python(patch), done()), timeout=60)
    charged: list[int] = []

    @co.effect(key=lambda order: order)
    async def charge(order: int) -> str:
        charged.append(order)
        await anyio.lowlevel.checkpoint()
        return f"ch_{order}"

    @co.handler()
    async def checkout(order: int) -> tuple[str, int]:
        receipt = await charge(order)
        return receipt, _transform(order)

    results: dict[int, tuple[str, int]] = {}

    async def run(order: int) -> None:
        results[order] = await checkout(order)

    original = _transform
    try:
        async with anyio.create_task_group() as tg:
            for order in range(20):
                tg.start_soon(run, order)
    finally:
        globals()["_transform"] = original
    assert results == {order: (f"ch_{order}", order * 10) for order in range(20)}
    assert sorted(charged) == list(range(20))  # each order charged once: replays found it


def test_a_call_new_to_the_journal_runs_without_asking_the_probe() -> None:
    # The failed run never reached the charge: the re-run's charge is new, so it runs; the
    # probe is only for a call begun before and never seen to end.
    asked: list[int] = []
    co = CrashOverride(model=script(exec_python(fix_and_rerun("ship_d")), done()))
    charges: list[int] = []

    def find(order: int) -> Any:
        asked.append(order)
        return "ch_from_probe"

    @co.effect(key=lambda order: order, probe=find)
    def charge(order: int) -> str:
        charges.append(order)
        return f"ch_{order}"

    @co.handler()
    def checkout(order: int) -> str:
        shipped = ship_d(order)  # noqa: F821  (fails the first time, before the charge)
        return f"{charge(order)} {shipped}"

    assert checkout(4) == "ch_4 shipped 4"
    assert charges == [4] and asked == []


def test_a_runaway_recursion_through_units_fails_in_the_application_s_code() -> None:
    # Each protected call and block opens a unit once effects are declared: where not even
    # that has the stack, it goes on without one, and the RecursionError is the recursion's.
    pads = range(0, 40, 3)
    co = CrashOverride(
        model=script(*(give_up("infinite recursion") for _ in pads)), breaker_threshold=10**6
    )
    co.effect(print)
    block = co.handler()
    assert block.settings is not None  # built now, as a handler used before would have

    @co.handler()
    def forever(n: int) -> int:
        with block:
            return forever(n + 1)

    recurse_to_the_limit(forever, pads)
