"""docs/guides/celery-operations.md: its example runs offline and shows what the guide says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "celery-operations.md"


def test_the_logging_example_routes_events_through_the_crashoverride_logger() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("CELERY_BROKER_URL", None)
    env.pop("CELERY_RESULT_BACKEND", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "celery_logging.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT / "examples",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Each event is a record of the stdlib logger "crashoverride", at its own level.
    assert "crashoverride INFO event='recovery.succeeded'" in lines
    assert "crashoverride WARNING event='followup.failed'" in lines
    assert "invoice 4 total: 5000 cents (state SUCCESS)" in lines
    assert any(
        line.startswith("follow-up task: state FAILURE: follow-up fu_")
        and line.endswith("the agent gave up: no ticket tracker is configured in this worker")
        for line in lines
    ), done.stdout
    # The worker's own handler formatted them: the record's level, not WARNING from stdout.
    assert "INFO/MainProcess] event='recovery.started'" in done.stderr


def test_the_guide_shows_the_example_and_names_the_logger() -> None:
    text = GUIDE.read_text()
    assert '--8<-- "examples/celery_logging.py"' in text
    assert "`crashoverride`" in text and "--pool solo" in text and "autoretry_for" in text
