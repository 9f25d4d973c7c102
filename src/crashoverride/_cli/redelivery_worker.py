"""The shop a worker of ``crashoverride demo --scene redelivery`` runs (``celery -A``), and of
examples/celery_redelivery.py: a Celery app whose task charges a card, then renders a receipt.

`checkout` charges the order, then renders the receipt. Worker 1 takes the task (`acks_late`:
the message stays unacknowledged until the task ends) and is killed, right after the charge or
inside it. Redis delivers the task again, to worker 2. With the charge declared (`co.effect`),
worker 2's run finds in the journal (in Redis, through `RedisCoordination`) that this task id's
charge was done and gets the receipt back without charging; a charge cut short ("started" in
the journal) is settled by asking the processor (`probe=`) instead of charging blind. Then the
receipt template turns out to be renamed: the (scripted) agent restores it and runs the task
body again (`rerun()`), which finds the charge again.

Configured by the environment the driver (``redelivery.py``) gives each worker: ``REDIS_URL``,
``SCENE_NS`` (the queue and every key of this run), ``SCENE_DECLARED`` (``0``: the same shop
without ``co.effect``) and, for worker 1 only, ``SCENE_KILL_AT`` (``after`` or ``inside`` the
charge: where it stops, to be killed).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from crashoverride import NOT_DONE, CrashOverride, RedisCoordination
from crashoverride.integrations.celery import CrashOverrideTask, install
from crashoverride.testing import done, exec_python, script

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
NS = os.environ.get("SCENE_NS", "shop")  # the driver gives each run its own
DECLARED = os.environ.get("SCENE_DECLARED", "1") == "1"
KILL_AT = os.environ.get("SCENE_KILL_AT", "")  # worker 1 only: "after" or "inside" the charge
FLEET_KEY = "demo-fleet-key-use-a-secret"  # the same in every worker; a real secret in prod

app = Celery("shop", broker=URL, backend=URL, task_cls=CrashOverrideTask)
app.conf.update(
    task_default_queue=NS,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # A message a dead worker left unacknowledged comes back after 2 s (the default is an hour);
    # the scene's keys are its own, so other applications' messages are left alone.
    broker_transport_options={
        "visibility_timeout": 2, "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
        "unacked_key": f"{NS}:unacked", "unacked_index_key": f"{NS}:unacked_index",
        "unacked_mutex_key": f"{NS}:unacked_mutex",
    },
)  # fmt: skip

crash_override = CrashOverride(
    project_prompt="Shop worker. A card must never be charged twice for one order.",
    # What a model would do here, scripted: the scene runs offline.
    model=script(
        exec_python("TEMPLATES['receipt'] = TEMPLATES['paid']\nrerun()"),
        done("the receipt template was renamed to 'paid'; restored it and finished the task"),
    ),
    coordination=RedisCoordination(URL, namespace=NS, key=FLEET_KEY, op_timeout=1.0),
)
install(app, crash_override)

# A module global: the agent's code runs with the task's globals.
TEMPLATES = {"paid": "order {order} paid, receipt {receipt}"}  # 'receipt' was renamed


def processor() -> Any:
    return redis.Redis.from_url(URL, decode_responses=True)


def charge(order: int, cents: int) -> str:
    """The card processor: each charge is an entry of the list ``<NS>:charges``."""
    with processor() as card:
        n = card.rpush(f"{NS}:charges", f"order {order}: {cents} cents")
        if KILL_AT == "inside":  # the processor took it; the answer never comes back
            card.set(f"{NS}:worker-1", "charging")
            time.sleep(3600)
    return f"ch_{n}"


def find_charge(order: int, cents: int) -> Any:
    """Asks the processor whether the order was charged: its receipt, or NOT_DONE."""
    with processor() as card:
        charges = card.lrange(f"{NS}:charges", 0, -1)
    wanted = f"order {order}: {cents} cents"
    return f"ch_{charges.index(wanted) + 1}" if wanted in charges else NOT_DONE


if DECLARED:
    charge = crash_override.effect(charge, key=lambda order, cents: f"charge order {order}",
                                   probe=find_charge)  # fmt: skip


@app.task(name="shop.checkout", acks_late=True, recovery_prompt="Complete the paid checkout.")  # type: ignore[untyped-decorator]
def checkout(order: int) -> str:
    receipt = charge(order, 4200)
    if KILL_AT == "after":  # worker 1 stops here, charged, and is killed
        with processor() as card:
            card.set(f"{NS}:worker-1", "charged")
        time.sleep(3600)
    return TEMPLATES["receipt"].format(order=order, receipt=receipt)
