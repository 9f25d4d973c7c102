"""The journal of declared effects in Redis: a unit of work with an id (a task id, an
idempotency key) run again by another process finds what the first one's effects did.

Each ``CrashOverride`` below stands for a process of its own: it keeps its journals itself, so
all that two of them share is Redis (tests/integrations/test_celery_redelivery.py runs the same
through real worker processes). Only the "outside world" is a list of the charges made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from crashoverride import (
    NOT_DONE,
    ConfigurationError,
    CrashOverride,
    EffectUncertain,
    RedisCoordination,
    integration,
)
from tests.fleet.support import FLEET_KEY, clean, close_fleet, fleet_redis, free_port, new_namespace

CHARGES: list[int] = []


class Killed(BaseException):
    """The process dies in the middle of the call (nothing catches a BaseException)."""


def charge(order: int, amount: int) -> str:
    CHARGES.append(order)
    return f"ch_{order}_{len(CHARGES)}"


async def acharge(order: int, amount: int) -> str:
    return charge(order, amount)


def charge_then_die(order: int) -> str:
    CHARGES.append(order)
    raise Killed


def charge_with_tuple(order: int) -> tuple[str, int]:
    CHARGES.append(order)
    return ("ch", order)  # JSON would give back a list: not stored faithfully


def charge_with_secret(order: int) -> dict[str, str]:
    CHARGES.append(order)
    return {"charge": f"ch_{order}", "api_key": "sk-live-abcdefghijklmnopqrstuvwx"}


def by_order(order: int, *rest: Any) -> str:
    return f"charge order {order}"


@pytest.fixture
def fleet() -> Iterator[tuple[str, str, list[CrashOverride]]]:
    CHARGES.clear()
    apps: list[CrashOverride] = []
    with fleet_redis() as url:
        namespace = new_namespace()
        try:
            yield url, namespace, apps
        finally:
            close_fleet(*apps)
            clean(url, namespace)


def process(fleet: tuple[str, str, list[CrashOverride]], **options: Any) -> CrashOverride:
    """A ``CrashOverride`` as another process of the fleet would make it."""
    url, namespace, apps = fleet
    options = {"key": FLEET_KEY, **options}
    app = CrashOverride(
        coordination=RedisCoordination(url, namespace=namespace, op_timeout=1.0, **options)
    )
    apps.append(app)
    return app


def run(app: CrashOverride, unit_id: str, effect: Any, *args: Any) -> Any:
    with integration.unit_of_work(app.handler(), unit_id):
        return effect(*args)


def test_a_run_in_another_process_gets_the_recorded_charge(fleet: Any) -> None:
    first, second = process(fleet), process(fleet)
    declared = first.effect(charge, key=by_order), second.effect(charge, key=by_order)
    assert run(first, "task-1", declared[0], 1, 100) == "ch_1_1"
    with capture_logs() as logs:
        assert run(second, "task-1", declared[1], 1, 100) == "ch_1_1"  # replayed: no charge
    assert CHARGES == [1]
    assert [e["event"] for e in logs] == ["effect.replayed"]
    assert run(second, "task-2", declared[1], 1, 100) == "ch_1_2"  # another unit charges


@pytest.mark.anyio
async def test_an_async_effect_is_journaled_in_redis_too(fleet: Any) -> None:
    first, second = process(fleet), process(fleet)
    with integration.unit_of_work(first.handler(), "task-3"):
        assert await first.effect(acharge, key=by_order)(3, 100) == "ch_3_1"
    with integration.unit_of_work(second.handler(), "task-3"):
        assert await second.effect(acharge, key=by_order)(3, 100) == "ch_3_1"
    assert CHARGES == [3]


def test_a_call_cut_short_by_a_dying_process_is_uncertain_elsewhere(fleet: Any) -> None:
    # Journaled as started before it ran, never seen to end: without a probe the next run
    # refuses to charge blind; with one it asks the outside world.
    first, second, third = process(fleet), process(fleet), process(fleet)
    with pytest.raises(Killed):
        run(first, "task-4", first.effect(charge_then_die, key=by_order), 4)
    with pytest.raises(EffectUncertain, match="charge order 4"):
        run(second, "task-4", second.effect(charge_then_die, key=by_order), 4)
    asked: list[int] = []

    def look_up(order: int) -> Any:
        asked.append(order)
        return f"ch_{order}" if order in CHARGES else NOT_DONE

    probed = third.effect(charge_then_die, key=by_order, probe=look_up)
    assert run(third, "task-4", probed, 4) == "ch_4"
    assert (CHARGES, asked) == ([4], [4])


@pytest.mark.parametrize("effect", [charge_with_tuple, charge_with_secret])
def test_a_result_that_cannot_be_stored_as_it_is_is_withheld(fleet: Any, effect: Any) -> None:
    # Another process cannot get the result back as it was: it must not return a different
    # one, nor charge again. In the process that made the call, the result is at hand.
    url, namespace, _ = fleet
    first, second = process(fleet), process(fleet)
    mine = first.effect(effect, key=by_order)
    result = run(first, "task-5", mine, 5)
    assert run(first, "task-5", mine, 5) == result
    with pytest.raises(EffectUncertain):
        run(second, "task-5", second.effect(effect, key=by_order), 5)
    assert CHARGES == [5]
    stored = _stored(url, namespace)
    assert "sk-live" not in json.dumps(stored)
    ((entry,),) = [list(fields.values()) for fields in stored.values()]
    assert (entry["entry"]["state"], entry["entry"]["withheld"]) == ("done", True)


def test_an_entry_copied_forged_or_broken_is_no_entry(fleet: Any) -> None:
    url, namespace, _ = fleet
    first, second = process(fleet), process(fleet)
    run(first, "task-6", first.effect(charge, key=by_order), 6, 100)
    (source,) = _stored(url, namespace)
    run(first, "task-7", first.effect(charge, key=by_order), 7, 100)
    (target,) = set(_stored(url, namespace)) - {source}
    client = redis.Redis.from_url(url)
    try:
        (field, value), *_ = client.hgetall(source).items()
        # Copied to another unit, and to another call of the same unit; a value edited to
        # return another receipt; something that is no entry at all.
        client.hset(target, field, value)
        client.hset(source, b"1" + field[1:], value)
        edited = json.loads(value)
        edited["entry"]["result"] = "ch_forged"
        client.hset(source, field.replace(b"6", b"8"), json.dumps(edited))
        client.hset(target, b"0:nonsense", b"\xff{")
    finally:
        client.close()
    declared = second.effect(charge, key=by_order)
    with capture_logs() as logs:
        assert run(second, "task-7", declared, 6, 100) == "ch_6_3"  # not task-6's receipt
        with integration.unit_of_work(second.handler(), "task-6"):
            assert [declared(6, 100), declared(6, 100)] == ["ch_6_1", "ch_6_4"]
    assert CHARGES == [6, 7, 6, 6]
    refused = [e["reason"] for e in logs if e["event"] == "effect.refused"]
    assert sorted(refused) == [
        "bad signature (not signed with this fleet's key)",
        "not a journal entry (UnicodeDecodeError)",
        "written for another call, unit or namespace",
        "written for another call, unit or namespace",
    ]


def test_an_unreachable_redis_never_fails_the_call(fleet: Any) -> None:
    # The journal goes on in this process: a retry here still finds the charge.
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    app = process((url, new_namespace(), fleet[2]))
    declared = app.effect(charge, key=by_order)
    with capture_logs() as logs:
        assert run(app, "task-9", declared, 9, 100) == "ch_9_1"
        assert run(app, "task-9", declared, 9, 100) == "ch_9_1"
    assert CHARGES == [9]
    degraded = [e for e in logs if e["event"] == "coordination.degraded"]
    assert len(degraded) == 1  # then Redis is left alone for retry_after
    assert "journal of declared effects" in degraded[0]["reason"]


def test_without_a_fleet_key_the_journal_stays_in_each_process(fleet: Any) -> None:
    first = process(fleet, key=None, apply_fixes="never")
    second = process(fleet, key=None, apply_fixes="never")
    with capture_logs() as logs:
        run(first, "task-10", first.effect(charge, key=by_order), 10, 1)
        run(first, "task-10", first.effect(charge, key=by_order), 10, 1)
    run(second, "task-10", second.effect(charge, key=by_order), 10, 1)
    assert CHARGES == [10, 10]  # unsigned entries in Redis could be forged: none are written
    assert not _stored(fleet[0], fleet[1])
    (told,) = [e for e in logs if e["event"] == "coordination.degraded"]
    assert "no fleet key" in told["reason"]


def test_a_journal_is_kept_for_journal_ttl(fleet: Any) -> None:
    url, namespace, _ = fleet
    app = process(fleet, journal_ttl=600)
    run(app, "task-11", app.effect(charge, key=by_order), 11, 1)
    client = redis.Redis.from_url(url)
    try:
        (name,) = _stored(url, namespace)
        assert 0 < client.pttl(name) <= 600_000
    finally:
        client.close()
    for wrong in (0, -1, "1h", 31 * 86_400):
        with pytest.raises(ConfigurationError, match="journal_ttl"):
            RedisCoordination(url, key=FLEET_KEY, journal_ttl=wrong)


def _stored(url: str, namespace: str) -> dict[str, dict[str, Any]]:
    """The journals in Redis of ``namespace``: hash name -> field -> the stored JSON."""
    client = redis.Redis.from_url(url)
    try:
        found = {}
        for name in client.scan_iter(match=f"co:{namespace}:effects:*"):
            fields = client.hgetall(name)
            found[name.decode()] = {k.decode(): json.loads(v) for k, v in fields.items()}
        return found
    finally:
        client.close()
