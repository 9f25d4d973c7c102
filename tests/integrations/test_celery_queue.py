"""Follow-ups sent to a queue no running worker consumes are reported, and the doctor says so.

A real worker on a real Redis consumes one queue; follow-ups go to another (as when a worker
is started with the wrong ``-Q``): each is reported by a ``followup.unconsumed`` warning, from
one broadcast answer cached between submits. Sent to the consumed queue, nothing is reported.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from structlog.testing import capture_logs

from crashoverride import RecoveryReport
from crashoverride.followups import FollowupJob
from crashoverride.integrations.celery import (
    CeleryRunner,
    CrashOverrideTask,
    install,
    queue_consumers,
)
from tests.integrations.celery_support import redis_url

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

TOKEN = os.urandom(4).hex()
CONSUMED = f"co-queue-{TOKEN}"
UNCONSUMED = f"co-queue-{TOKEN}-nobody"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with redis_url() as found:
        yield found


@pytest.fixture(scope="module")
def worker_app(url: str) -> Iterator[Celery]:
    app = Celery("co_queue_test", broker=url, backend=url, task_cls=CrashOverrideTask)
    app.conf.update(task_default_queue=CONSUMED, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)  # fmt: skip
    install(app, followup_queue=CONSUMED)
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[CONSUMED],
                      loglevel="WARNING", shutdown_timeout=30):  # fmt: skip
        yield app
    _purge(app, UNCONSUMED)
    app.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _purge(app: Celery, queue: str) -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def _job(objective: str) -> FollowupJob:
    report = RecoveryReport(
        recovery_id="rec_test", handler="with", fingerprint="f", exc_type="builtins.KeyError",
        exception="KeyError('rate')", traceback="", outcome="recovered", reason="test",
        via="agent", model="scripted",
    )  # fmt: skip
    return FollowupJob(id="fu_" + os.urandom(6).hex(), objective=objective, origin="handler",
                       context="", report=report, timeout=60.0, max_turns=5)  # fmt: skip


def _wait_for_checks() -> None:
    for thread in threading.enumerate():
        if thread.name == "crashoverride-celery-queues":
            thread.join(10)


def _unconsumed(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "followup.unconsumed"]


def test_the_running_worker_is_seen_consuming_its_queue(worker_app: Celery) -> None:
    deadline = time.monotonic() + 20
    consumers = queue_consumers(worker_app, CONSUMED)
    while not consumers and time.monotonic() < deadline:  # the worker may still be starting
        consumers = queue_consumers(worker_app, CONSUMED)
    assert consumers and all("@" in name for name in consumers)
    assert queue_consumers(worker_app, UNCONSUMED) == set()


def test_followups_to_a_queue_nobody_consumes_are_reported(worker_app: Celery) -> None:
    runner = CeleryRunner(worker_app, queue=UNCONSUMED)
    first, second = _job("open a ticket"), _job("send an alert")
    with capture_logs() as logs:
        runner.submit_job(first)
        _wait_for_checks()
        reported = _unconsumed(logs)
        assert [(e["followup_id"], e["queue"], e["log_level"]) for e in reported] == [
            (first.id, UNCONSUMED, "warning")
        ]
        assert f"-Q celery,{UNCONSUMED}" in reported[0]["fix"]
        # The answer is cached: the next submit is reported at once, with no broadcast.
        runner.submit_job(second)
        assert [e["followup_id"] for e in _unconsumed(logs)] == [first.id, second.id]
        assert not [t for t in threading.enumerate() if t.name == "crashoverride-celery-queues"]


def test_followups_to_a_consumed_queue_are_not_reported(worker_app: Celery) -> None:
    runner = CeleryRunner(worker_app, queue=CONSUMED)
    with capture_logs() as logs:
        runner.submit_job(_job("open a ticket"))
        _wait_for_checks()
    assert _unconsumed(logs) == []


def _doctor(tmp_path: Path, url: str, queue: str) -> dict[str, Any]:
    module = tmp_path / "queue_app.py"
    module.write_text(
        textwrap.dedent(f"""
        from celery import Celery
        from crashoverride.integrations.celery import install

        app = Celery("co_queue_doctor", broker={url!r})
        install(app, followup_queue={queue!r})
    """)
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "crashoverride", "doctor", "--json",
         "--celery-app", "queue_app:app"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    report = json.loads(done.stdout)
    (check,) = [c for c in report["checks"] if c["name"] == "celery follow-up queue"]
    return dict(check)


def test_doctor_reports_the_followup_queue_consumers(
    worker_app: Celery, tmp_path: Path, url: str
) -> None:
    consumed = _doctor(tmp_path, url, CONSUMED)
    assert (consumed["status"], consumed["queue"]) == ("ok", CONSUMED)
    assert consumed["consumers"]
    nobody = _doctor(tmp_path, url, UNCONSUMED)
    assert (nobody["status"], nobody["queue"]) == ("fail", UNCONSUMED)
    assert "no running worker consumes" in nobody["detail"]
