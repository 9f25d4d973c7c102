"""The fleet's listener (eager records, revocations) against closing apps and Redis outages.

A listener runs on the fleet's helper loop for as long as its app's coordination is open: it
must end with it (closing an app, even as the listener connects, leaves no connection open),
and a Redis that goes away must cost one ``coordination.degraded`` per outage, not one per
``retry_after``, while the listener keeps trying and listens again once Redis is back.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride.testing import done, exec_python, script
from tests.fleet import test_fleet as base
from tests.fleet.support import close_fleet, new_namespace, private_redis, start_redis
from tests.fleet.test_fleet import (
    NS,
    _clients,
    _publish_by_hand,
    _subscribers,
    app,
    as_deployed,
    events,
)
from tests.helpers import await_for, wait_for

FIX = (
    "replace_function(base.transform, 'def transform(value):\\n    return value * 10\\n')\nrerun()"
)


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    as_deployed()
    NS["current"] = new_namespace()
    yield
    as_deployed()


def test_closing_apps_as_their_listeners_start_leaves_no_connection_open() -> None:
    # Each app publishes a verified fix, so it listens for its revocation from then on, and
    # is closed at another moment of that listener's start (subscribing, reading the index):
    # a cancellation redis-py loses there must not leave it running on the closed client.
    with private_redis() as (url, _):
        for moment in range(20):
            NS["current"] = new_namespace()  # a failure of its own: it leads and publishes
            co = app(url, script(exec_python(FIX), done("fixed")))

            @co.handler()
            def job(i: int) -> int:
                return base.transform(i)

            with capture_logs() as logs:
                assert job(1) == 10
            assert events(logs, "fleet.fix_published")
            time.sleep(moment * 0.002)
            close_fleet(co)
            as_deployed()
        wait_for(lambda: _clients(url) == 0)  # no listener left, no connection of theirs


@pytest.mark.anyio
async def test_a_listener_reports_an_outage_once_and_listens_again_after_it() -> None:
    with private_redis() as (url, server):
        port = urlsplit(url).port
        assert port is not None
        eager = app(url, script(), apply_fixes="eager", retry_after=0.05)
        with capture_logs() as logs, tempfile.TemporaryDirectory() as workdir:
            await eager.awarm_up()
            await await_for(lambda: _subscribers(url) == 1)
            server.kill()
            server.wait(10)
            await await_for(lambda: events(logs, "coordination.degraded"))
            await anyio.sleep(1.5)  # thirty retry_after: tried again and again meanwhile
            again = start_redis(port, workdir)  # Redis is back, empty
            try:
                await await_for(lambda: _subscribers(url) == 1)  # it listens again
                source = "def transform(value):\n    return value * 7\n"
                record_id = await anyio.to_thread.run_sync(_publish_by_hand, url, source)
                await await_for(lambda: events(logs, "fleet.fix_applied"))
            finally:
                close_fleet(eager)
                again.kill()
                again.wait(10)
    (degraded,) = events(logs, "coordination.degraded")  # one outage, one event
    assert degraded["fleet_role"] == "eager" and degraded["retry_after"] == 0.05
    assert events(logs, "fleet.fix_applied")[0]["fix_record"] == record_id
    assert base.transform(3) == 21  # the listener's purpose survived the outage
