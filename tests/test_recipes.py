"""Recipes: a recovered ``with`` block's state repair replays on the next occurrence, with no
model call, when the handler's postcondition then holds; across a fleet through the fix record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from tests.fleet_support import FLEET_KEY, clean, close_fleet, fleet_redis, new_namespace
from tests.helpers import done_step, exec_step, scripted

REPAIR = "caller['total'] = caller['x'] * 2"
REPAIR_AND_PATCH = (
    "replace_function(compute, 'def compute(x):\\n    return x * 2\\n')\n"
    "caller['total'] = compute(caller['x'])"
)


def compute(x: int) -> int:
    raise NotImplementedError("compute")


ORIGINAL = compute.__code__


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    compute.__code__ = ORIGINAL
    yield
    compute.__code__ = ORIGINAL


def doubled(names: Any) -> bool:
    return bool(names["total"] == names["x"] * 2)


def block(co: CrashOverride, x: int, **options: Any) -> int:
    total = 0
    with co.handler(prompt="total is twice x", **options):
        total = compute(x)
    return total


def test_a_recovered_with_block_replays_its_recipe_with_no_model_call() -> None:
    model = scripted(exec_step(REPAIR), done_step("set total"))
    reports: list[Any] = []
    co = CrashOverride(model=model, on_recovery=reports.append)
    assert block(co, 3, postcondition=doubled) == 6
    with capture_logs() as logs:
        assert block(co, 5, postcondition=doubled) == 10  # the same failure, another frame
    assert len(model.calls) == 2  # the first recovery's two turns, nothing more
    first, second = reports
    assert first.via == "agent"
    assert (second.via, second.fleet_role, second.outcome) == ("recipe", "recipe", "recovered")
    assert "saved 2 model calls" in second.reason
    (succeeded,) = [e for e in logs if e["event"] == "recovery.succeeded"]
    assert succeeded["model_calls_saved"] == 2


def test_without_a_postcondition_nothing_is_replayed() -> None:
    model = scripted(exec_step(REPAIR), done_step("set total"), exec_step(REPAIR), done_step())
    co = CrashOverride(model=model)
    assert block(co, 3) == 6
    assert block(co, 4) == 8
    assert len(model.calls) == 4  # two agent runs: a recipe is never judged by itself


def test_a_recipe_whose_postcondition_fails_hands_over_to_the_agent() -> None:
    wrong = "caller['total'] = 6"  # right for x=3 only: a value, not a repair
    model = scripted(exec_step(wrong), done_step(), exec_step(REPAIR), done_step())
    co = CrashOverride(model=model)
    assert block(co, 3, postcondition=doubled) == 6
    with capture_logs() as logs:
        assert block(co, 4, postcondition=doubled) == 8
    assert len(model.calls) == 4
    assert [e["via"] for e in logs if e["event"] == "recovery.succeeded"] == ["agent"]


def test_a_recipe_travels_in_the_fix_record_to_a_process_started_later() -> None:
    with fleet_redis() as url:
        namespace = new_namespace()

        def fleet() -> RedisCoordination:
            return RedisCoordination(url, namespace=namespace, key=FLEET_KEY, op_timeout=2.0)

        first_model = scripted(exec_step(REPAIR_AND_PATCH), done_step("patched"))
        first = CrashOverride(model=first_model, coordination=fleet())
        assert block(first, 3, postcondition=doubled) == 6
        compute.__code__ = ORIGINAL  # a process started later
        later_model = scripted()
        reports: list[Any] = []
        later = CrashOverride(model=later_model, coordination=fleet(), on_recovery=reports.append)
        with capture_logs() as logs:
            assert block(later, 7, postcondition=doubled) == 14
        close_fleet(first, later)
        clean(url, namespace)
    assert len(later_model.calls) == 0
    (report,) = reports
    assert (report.via, report.fleet_role) == ("recipe", "recipe")
    assert report.fix_record.startswith("fix_")
    assert compute(1) == 2  # the code fix came with it
    assert [e["event"] for e in logs if e["event"].startswith("fleet.")] == ["fleet.fix_applied"]
