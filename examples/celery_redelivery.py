"""A Celery worker is killed (SIGKILL) right after it charged a card; the task is redelivered to
another worker, which recovers it, and the card was charged once.

`checkout` charges the order, then sends the receipt. Worker 1 takes the task (`acks_late`: the
message stays unacknowledged until the task ends) and is killed after the charge. Worker 2 gets
the redelivery. Its run of `checkout` calls `charge` again, and finds in the journal (in Redis,
through `RedisCoordination`) that this task id's charge was done: it gets the receipt back
without charging. Then the receipt template turns out to be renamed; the recovery agent repairs
it and runs the task body again (`rerun()`), which finds the charge again.

    python examples/celery_redelivery.py               # the charge declared with co.effect
    python examples/celery_redelivery.py --undeclared  # the same shop without it: 3 charges
    python examples/celery_redelivery.py --mid-charge  # killed inside the charge: the probe

`--mid-charge` kills worker 1 while the charge is under way (the processor took it, the call
never returned): the journal says "started", and worker 2 asks the processor (`probe=`) instead
of charging blind; without a probe the redelivery would fail with `EffectUncertain`.

Real worker processes, a real Redis (broker, result backend, journal, and the "card processor",
a Redis list); only the model is scripted. Needs a Redis: `REDIS_URL` (default
redis://127.0.0.1:6379/11). Everything it writes is under a fresh namespace, removed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
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
FLEET_KEY = "example-fleet-key-use-a-secret"  # the same in every worker; a real secret in prod

app = Celery("shop", broker=URL, backend=URL, task_cls=CrashOverrideTask)
app.conf.update(
    task_default_queue=NS,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # A message left unacknowledged by a dead worker is delivered again after 2 s (the default
    # is an hour); the scene's keys are its own, so other apps' messages are left alone.
    broker_transport_options={
        "visibility_timeout": 2, "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
        "unacked_key": f"{NS}:unacked", "unacked_index_key": f"{NS}:unacked_index",
        "unacked_mutex_key": f"{NS}:unacked_mutex",
    },
)  # fmt: skip

crash_override = CrashOverride(
    project_prompt="Shop worker. A card must never be charged twice for one order.",
    # What a model would do here, scripted so the example runs offline.
    model=script(
        exec_python("TEMPLATES['receipt'] = TEMPLATES['paid']\nrerun()"),
        done("the receipt template was renamed to 'paid'; restored it and finished the task"),
    ),
    coordination=RedisCoordination(URL, namespace=NS, key=FLEET_KEY, op_timeout=1.0),
)
install(app, crash_override)

TEMPLATES = {"paid": "order {order} paid, receipt {receipt}"}  # 'receipt' was renamed


def processor() -> Any:
    return redis.Redis.from_url(URL, decode_responses=True)


def charge(order: int, cents: int) -> str:
    """The card processor: each charge is an entry of the list ``NS:charges``."""
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


@app.task(name="shop.checkout", acks_late=True, recovery_prompt="Complete the paid checkout.")
def checkout(order: int) -> str:
    receipt = charge(order, 4200)
    if KILL_AT == "after":  # worker 1 stops here, charged, and is killed
        with processor() as card:
            card.set(f"{NS}:worker-1", "charged")
        time.sleep(3600)
    return TEMPLATES["receipt"].format(order=order, receipt=receipt)


# ------------------------------------------------------------------------------ the scene


def worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    here = Path(__file__).resolve().parent
    command = [sys.executable, "-m", "celery", "-A", "celery_redelivery", "worker",
               "--pool=solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
               "--loglevel=WARNING", "-Q", NS]  # fmt: skip
    # Its banner is left out; its log (stderr) is shown.
    return subprocess.Popen(command, cwd=here, env={**os.environ, **env}, stdout=subprocess.DEVNULL)


def scene(kill_at: str) -> int:
    """Run the scene; how many times the card was charged."""
    with processor() as card:
        first = worker({"SCENE_KILL_AT": kill_at})
        try:
            sent = checkout.delay(7)
            deadline = time.monotonic() + 60
            while card.get(f"{NS}:worker-1") is None:
                if time.monotonic() > deadline or first.poll() is not None:
                    raise SystemExit("worker 1 never charged")
                time.sleep(0.05)
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            when = "inside the charge" if kill_at == "inside" else "right after the charge"
            print(f"worker 1 was killed with SIGKILL {when}, before acknowledging the task")
            second = worker({})
            try:
                print(f"worker 2 got the redelivery: {sent.get(timeout=120)!r}")
            finally:
                second.terminate()
                second.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(30)
        charges = card.lrange(f"{NS}:charges", 0, -1)
        for name in card.scan_iter(match=f"*{NS}*"):  # the scene's keys: queue, journal, ...
            card.delete(name)
    return len(charges)


def main() -> None:
    kill_at = "inside" if "--mid-charge" in sys.argv else "after"
    charged = scene(kill_at)
    print(f"the card was charged {charged} time(s)")


if __name__ == "__main__":
    if "SCENE_NS" not in os.environ:  # the workers must share the driver's namespace
        os.environ["SCENE_NS"] = f"shop-{os.urandom(4).hex()}"
        os.environ["SCENE_DECLARED"] = "0" if "--undeclared" in sys.argv else "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    main()
