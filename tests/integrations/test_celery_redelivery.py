"""A Celery worker killed with SIGKILL right after (or during) a charge: the task is redelivered
to another worker, recovered there, and the card was charged once; the same shop without the
declaration charges again (examples/celery_redelivery.py: real worker processes, a real Redis,
only the model scripted).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integrations.celery_support import redis_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "celery_redelivery.py"


def scene(*flags: str) -> tuple[str, str]:
    with redis_url() as url:
        env = {**os.environ, "REDIS_URL": url, "NO_COLOR": "1"}
        env.pop("SCENE_NS", None)
        ran = subprocess.run(
            [sys.executable, str(EXAMPLE), *flags], env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    return ran.stdout, ran.stderr


def test_a_redelivered_task_does_not_charge_the_card_again() -> None:
    out, log = scene()
    assert "worker 1 was killed with SIGKILL right after the charge" in out
    assert "worker 2 got the redelivery: 'order 7 paid, receipt ch_1'" in out
    assert "the card was charged 1 time(s)" in out
    # The redelivered run found the charge, and so did the agent's rerun().
    assert log.count("effect.replayed") == 2, log[-4000:]


def test_without_the_declaration_the_redelivery_charges_again() -> None:
    out, _ = scene("--undeclared")
    # Worker 1's charge, the redelivered run's, and the agent's rerun().
    assert "the card was charged 3 time(s)" in out


def test_a_charge_cut_short_by_the_kill_is_settled_by_its_probe() -> None:
    # The journal says "started": the redelivery asks the processor instead of charging blind.
    out, log = scene("--mid-charge")
    assert "worker 1 was killed with SIGKILL inside the charge" in out
    assert "the card was charged 1 time(s)" in out
    assert "effect.probed" in log, log[-4000:]
