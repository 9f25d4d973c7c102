"""The websocket example runs offline and shows a message repaired on an open connection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "websocket_app.py"

pytestmark = pytest.mark.slow


def test_the_websocket_example_runs_offline() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, check=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(("<-", "->"))]
    assert lines == [
        '<- {"hello":"send a shipment reference"}',  # once: the restart's greeting is not sent
        "-> A17",
        '<- {"ref":"A17","status":"in transit","eta":"2026-12-09"}',
        "-> B42",
        '<- {"ref":"B42","status":"delivered","eta":"2026-12-01"}',
    ]
    assert "recovery recovered via agent: SHIPMENTS renamed" in done.stdout
    assert done.stdout.count("recovery.started") == 1  # the repair held for the next message
