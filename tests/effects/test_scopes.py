"""Which unit a call of a declared effect belongs to: nested blocks, ``with`` blocks, threads.

A ``with co.handler(...)`` block opens no unit (it would double its happy path's cost): a
failure in it is the enclosing unit's, or else made of the effect calls its thread made
since it began. A protected call or block inside a unit is part of that unit: whatever runs
the unit again runs it again too.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, script


def _charges(co: CrashOverride) -> tuple[list[int], Any]:
    made: list[int] = []

    @co.effect(key=lambda order: f"charge order {order}")
    def charge(order: int) -> str:
        made.append(order)
        return f"ch_{order}_{len(made)}"

    return made, charge


def test_a_with_block_inside_a_protected_call_journals_into_the_call_s_unit() -> None:
    # Regression: the inner ``with`` opened a unit of its own, so the outer call's re-run did
    # not find the charge made inside it and charged the card again.
    fix = "globals()['ship_n'] = lambda order: f'shipped {order}'\nrerun()"
    co = CrashOverride(model=script(exec_python(fix), done()))
    made, charge = _charges(co)
    inner = co.handler(prompt="Charge the order.")

    @co.handler()
    def checkout(order: int) -> str:
        with inner:
            charge(order)
        return ship_n(order)  # type: ignore[name-defined]  # noqa: F821

    assert checkout(17) == "shipped 17"
    assert made == [17]


def test_a_protected_call_inside_another_is_part_of_its_unit() -> None:
    # Regression: the inner decorated call opened a fresh unit in the outer call's re-run,
    # which charged again instead of finding the first run's charge.
    fix = "globals()['ship_m'] = lambda order: f'shipped {order}'\nrerun()"
    co = CrashOverride(model=script(exec_python(fix), done()))
    made, charge = _charges(co)

    @co.handler(prompt="Pay for the order.")
    def pay(order: int) -> str:
        return charge(order)  # type: ignore[no-any-return]

    @co.handler()
    def checkout(order: int) -> str:
        pay(order)
        return ship_m(order)  # type: ignore[name-defined]  # noqa: F821

    assert checkout(18) == "shipped 18"
    assert made == [18]


def test_a_with_block_s_unit_holds_only_the_calls_made_since_it_began() -> None:
    # The same charge made before the block is not the block's: the agent's call runs.
    co = CrashOverride(model=script(exec_python("caller['receipt'] = charge(20)"), done()))
    made, charge = _charges(co)
    charge(20)  # an earlier, separate charge of this thread, outside any block
    receipt = None
    with co.handler():
        raise KeyError("the block charged nothing before failing")
    assert made == [20, 20]
    assert receipt == "ch_20_2"


def test_a_handler_shared_by_threads_keeps_each_block_s_calls_apart() -> None:
    # One handler object, two threads each inside it at once: each failure's unit is its own
    # thread's block, so each agent's call finds that thread's charge (and no other).
    both_inside = threading.Barrier(2)
    step = exec_python("caller['receipt'] = charge(caller['order'])")
    co = CrashOverride(model=script(step, done(), step, done()))
    made, charge = _charges(co)
    shared = co.handler(prompt="Charge the order.")
    receipts: dict[int, Any] = {}

    def worker(order: int) -> None:
        receipt = None
        with shared:
            charge(order)
            both_inside.wait(timeout=30)
            raise KeyError(order)
        receipts[order] = receipt

    threads = [threading.Thread(target=worker, args=(order,)) for order in (31, 32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(made) == [31, 32]
    assert {order: receipt.split("_")[1] for order, receipt in receipts.items()} == {
        31: "31",
        32: "32",
    }


def test_a_handler_nested_in_itself_keeps_the_outer_block_s_calls() -> None:
    # The inner entry of the same handler cannot move the outer one's mark: the outer
    # block's failure still finds the charge it made before entering it again.
    co = CrashOverride(model=script(exec_python("caller['again'] = charge(41)"), done()))
    made, charge = _charges(co)
    block = co.handler(prompt="Charge the order.")
    again = None
    with block:
        charge(41)
        with block:
            pass
        raise KeyError("after the inner block")
    assert made == [41]
    assert again == "ch_41_1"


def test_a_block_whose_calls_were_not_all_kept_makes_new_calls_uncertain() -> None:
    # More calls than a thread keeps: a call the journal cannot find may be one of those
    # lost, so the agent's code gets EffectUncertain rather than a possible second charge.
    from crashoverride._effects.journal import AMBIENT_KEPT

    co = CrashOverride(
        model=script(
            exec_python(
                "try:\n    charge(-1)\nexcept Exception as e:\n"
                "    caller['said'] = f'{type(e).__name__}: {e}'"
            ),
            give_up("cannot tell"),
        )
    )
    made, charge = _charges(co)
    said = ""
    try:
        with co.handler():
            for order in range(AMBIENT_KEPT + 5):
                charge(order)
            raise KeyError("after many charges")
    except KeyError:
        pass
    assert -1 not in made
    assert said.startswith("EffectUncertain: "), said
    assert "lost some of the block's calls" in said


def test_the_docs_say_how_many_calls_a_thread_keeps() -> None:
    from pathlib import Path

    from crashoverride._effects.journal import AMBIENT_KEPT

    guide = Path(__file__).parents[2] / "docs" / "guides" / "side-effects.md"
    readme = guide.read_text(encoding="utf-8")
    assert f"(the last {AMBIENT_KEPT} per\nthread)" in readme
    assert f"more\nthan {AMBIENT_KEPT} calls" in readme


@pytest.mark.anyio
async def test_an_async_with_inside_a_protected_coroutine_is_part_of_its_unit() -> None:
    fix = "globals()['ship_a2'] = lambda order: f'shipped {order}'\nrerun()"
    co = CrashOverride(model=script(exec_python(fix), done()))
    made: list[int] = []

    @co.effect(key=lambda order: f"charge order {order}")
    async def charge(order: int) -> str:
        made.append(order)
        return f"ch_{order}"

    @co.handler()
    async def checkout(order: int) -> str:
        async with co.handler(prompt="Charge the order."):
            await charge(order)
        return ship_a2(order)  # type: ignore[name-defined]  # noqa: F821

    assert await checkout(19) == "shipped 19"
    assert made == [19]
