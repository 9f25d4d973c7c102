"""The Celery app a worker of ``crashoverride demo --scene redelivery`` runs (``celery -A``).

Built from the environment the scene gives each worker: the Redis, the scene's namespace,
whether the charge is declared, and whether this worker is the one killed after the charge.
"""

from __future__ import annotations

import os

from crashoverride._cli.redelivery import shop

app = shop(
    os.environ["REDIS_URL"],
    os.environ["SCENE_NS"],
    declared=os.environ.get("SCENE_DECLARED", "1") == "1",
    kill_after_charge=os.environ.get("SCENE_KILL_AT") == "after",
)
