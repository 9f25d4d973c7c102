"""A waiter's side of fleet single-flight, through a real Redis: the outcome message it hears
carries the leader's signed fix record, which it verifies as it would a stored one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.testing import done, exec_python, script
from tests.fleet.support import FLEET_KEY, clean, close_fleet, fleet_redis, new_namespace
from tests.helpers import wait_for

PATCH = "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\nrerun()"


def transform(value: int) -> int:
    raise NotImplementedError("transform")


ORIGINAL = transform.__code__


@pytest.fixture
def fleet() -> Iterator[tuple[str, str]]:
    transform.__code__ = ORIGINAL
    namespace = new_namespace()
    with fleet_redis() as url:
        try:
            yield url, namespace
        finally:
            clean(url, namespace)
            transform.__code__ = ORIGINAL


def _keys(namespace: str) -> dict[str, str]:
    from crashoverride._fleet.scripts import keys_for
    from crashoverride.integration import fingerprint

    try:
        transform(0)
    except NotImplementedError as exc:
        return keys_for(namespace, fingerprint(exc))
    raise AssertionError("unreachable")


def _forged(namespace: str) -> str:
    """A fix record for this failure, signed with a key that is not the fleet's."""
    from crashoverride._fleet import records
    from crashoverride._repair import journal

    source = "def transform(value):\n    return 666\n"
    new: dict[str, Any] = {}
    exec(compile(source, "<forged>", "exec"), {}, new)
    target = {"module": __name__, "qualname": "transform", "source": source,
              "code_hash": journal.digest(ORIGINAL),
              "new_hash": journal.digest(new["transform"].__code__)}  # fmt: skip
    record = records.make(namespace=namespace, fingerprint="forged", targets=[target],
                          recovery_id="rec_forged0001", approved_by="nobody")  # fmt: skip
    return records.sign(record, b"not-the-fleet-key-0123456789")


def test_a_record_heard_with_the_outcome_is_verified_like_a_stored_one(
    fleet: tuple[str, str],
) -> None:
    url, namespace = fleet
    keys = _keys(namespace)
    client = redis.Redis.from_url(url)
    # A leader elsewhere holds the lease (token 1): this app's failure waits for its outcome.
    client.set(keys["fence"], 1)
    client.set(keys["lease"], "1|4242-elsewhere", px=60_000)
    model = script(exec_python(PATCH), done("patched"))
    co = CrashOverride(model=model, timeout=20, coordination=RedisCoordination(
        url, namespace=namespace, key=FLEET_KEY, op_timeout=2.0))  # fmt: skip

    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    results: list[int] = []
    with capture_logs() as logs:
        waiter = threading.Thread(target=lambda: results.append(job(4)))
        waiter.start()
        wait_for(lambda: client.pubsub_numsub(keys["channel"])[0][1] == 1, 20, "the waiter")
        # Someone who can publish on the channel announces a "recovery" with planted code.
        outcome = {"token": 1, "recovered": True, "fix": "rec_forged0001"}
        client.publish(keys["channel"], json.dumps(outcome | {"record": _forged(namespace)}))
        waiter.join(30)
    client.close()
    close_fleet(co)
    # Refused like a tampered stored record: the planted code never ran; the unit, replayed
    # through unchanged code, failed again, and an agent run of this process recovered it.
    (refused,) = [e for e in logs if e["event"] == "fleet.fix_refused"]
    assert "bad signature" in refused["reason"]
    assert [e for e in logs if e["event"] == "fleet.fix_applied"] == []
    assert results == [40] and len(model.calls) == 2
