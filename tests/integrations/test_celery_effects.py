"""Celery: a task run is a unit of work named by its task id; a retry of it (``self.retry()``)
or the agent's ``rerun()`` finds the charge an earlier run made instead of charging again.

A real worker on a real Redis, the journal in Redis (``RedisCoordination``); only the model is
scripted. The redelivery of a task whose worker was killed (SIGKILL) is
tests/integrations/test_celery_redelivery.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.integrations.celery import CrashOverrideTask, install
from crashoverride.testing import StepLike, done, exec_python, script
from tests.fleet.support import FLEET_KEY, clean, close_fleet
from tests.integrations.celery_support import redis_url
from tests.integrations.test_celery import _close

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

CHARGES: list[int] = []


def _charge(order: int) -> str:
    CHARGES.append(order)
    return f"ch_{order}_{len(CHARGES)}"


# Declared once, as an application does at import time; the journal a call is written to is
# the one of the unit of work it runs in (the task run's, kept by the worker's CrashOverride).
charge = CrashOverride().effect(_charge, key=lambda order: f"charge order {order}")


def _define_tasks(app: Celery) -> None:
    @app.task(shared=False, name="e.pay_then_retry", bind=True)
    def pay_then_retry(self: Any, order: int) -> str:
        receipt: str = charge(order)
        if self.request.retries == 0:  # the mail server was down: try the task again
            raise self.retry(countdown=0, max_retries=1)
        return receipt

    @app.task(shared=False, name="e.pay_then_ship", recovery_prompt="Ship the paid order.")
    def pay_then_ship(order: int) -> str:
        receipt: str = charge(order)
        return f"{receipt}, {ship_e(order)}"  # noqa: F821  (missing until the agent adds it)


@pytest.fixture(scope="module")
def worker_app() -> Iterator[Celery]:
    token = os.urandom(4).hex()
    queue = f"co-effects-{token}"
    with redis_url() as url:
        app = Celery("co_effects", broker=url, backend=url, task_cls=CrashOverrideTask)
        app.conf.update(
            task_default_queue=queue,
            result_expires=600,
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
            co_url=url,
            co_namespace=queue,
        )
        install(app)
        _define_tasks(app)
        with start_worker(
            app, pool="solo", perform_ping_check=False, queues=[queue], loglevel="WARNING"
        ):
            yield app
        close_fleet(app.conf.crashoverride)
        clean(url, queue)
        _close(app)


def _use(app: Celery, *steps: StepLike) -> Any:
    CHARGES.clear()
    model = script(*steps)
    fleet = RedisCoordination(
        app.conf.co_url, namespace=app.conf.co_namespace, key=FLEET_KEY, op_timeout=1.0
    )
    previous = app.conf.get("crashoverride")
    if previous is not None:
        close_fleet(previous)
    app.conf.crashoverride = CrashOverride(model=model, coordination=fleet)
    return model


def test_a_retried_task_does_not_charge_again(worker_app: Celery) -> None:
    model = _use(worker_app)  # no agent: Retry is Celery's control flow
    with capture_logs() as logs:
        sent = worker_app.send_task("e.pay_then_retry", args=(31,))
        assert sent.get(timeout=60) == "ch_31_1"  # the second run got the first run's receipt
    assert CHARGES == [31]
    assert [e["event"] for e in logs if e["event"].startswith("effect.")] == ["effect.replayed"]
    assert not model.calls


def test_a_rerun_by_the_agent_does_not_charge_again(worker_app: Celery) -> None:
    model = _use(
        worker_app,
        exec_python("globals()['ship_e'] = lambda order: f'shipped {order}'\nrerun()"),
        done("added ship_e and ran the task again"),
    )
    sent = worker_app.send_task("e.pay_then_ship", args=(32,))
    assert sent.get(timeout=60) == "ch_32_1, shipped 32"
    assert CHARGES == [32]
    assert len(model.calls) == 2
