"""Only a verified fix goes to the fleet: the unit ran again through the changed code
(``rerun()``, ``replay_request()``), or the application's postcondition held."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RecoveryReport, RedisCoordination
from crashoverride.testing import done, exec_python, script
from tests.fleet.support import FLEET_KEY, clean, close_fleet, fleet_redis, new_namespace


def scale(value: int) -> int:
    raise NotImplementedError("scale")


ORIGINAL = scale.__code__
PATCH = "replace_function(scale, 'def scale(value):\\n    return value * 10\\n')\n"


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    scale.__code__ = ORIGINAL
    yield
    scale.__code__ = ORIGINAL


@pytest.fixture
def fleet() -> Iterator[tuple[str, str]]:
    with fleet_redis() as url:
        namespace = new_namespace()
        try:
            yield url, namespace
        finally:
            clean(url, namespace)


def records(url: str, namespace: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"co:{namespace}:*:fix"))
    finally:
        client.close()


def recover(fleet: tuple[str, str], agent_code: str, **handler: Any) -> list[dict[str, Any]]:
    url, namespace = fleet
    reports: list[RecoveryReport] = []
    co = CrashOverride(
        model=script(exec_python(agent_code), done("fixed")), timeout=30,
        coordination=RedisCoordination(url, namespace=namespace, key=FLEET_KEY, op_timeout=2.0),
        on_recovery=reports.append,
    )  # fmt: skip

    @co.handler(**handler)
    def job(value: int) -> int:
        return scale(value)

    with capture_logs() as logs:
        assert job(4) == 40
    close_fleet(co)
    (report,) = reports
    assert report.outcome == "recovered"
    return logs


def test_a_fix_the_unit_never_ran_through_stays_in_its_process(fleet: tuple[str, str]) -> None:
    # The agent patched the code and answered the call itself: the new code never ran.
    logs = recover(fleet, PATCH + "set_result(40)")
    assert records(*fleet) == []
    (withheld,) = [e for e in logs if e["event"] == "fleet.fix_withheld"]
    assert "not verified" in withheld["reason"]
    assert not [e for e in logs if e["event"] == "fleet.fix_published"]
    assert scale(2) == 20  # it still runs here


def test_a_fix_the_unit_reran_through_is_published(fleet: tuple[str, str]) -> None:
    logs = recover(fleet, PATCH + "rerun()")
    assert len(records(*fleet)) == 1
    assert [e for e in logs if e["event"] == "fleet.fix_published"]


def test_a_fix_whose_postcondition_held_is_published(fleet: tuple[str, str]) -> None:
    def held(view: Any) -> bool:
        return bool(view["result"] == view["args"][0] * 10)

    logs = recover(fleet, PATCH + "set_result(40)", postcondition=held)
    assert len(records(*fleet)) == 1
    assert not [e for e in logs if e["event"] == "fleet.fix_withheld"]
