"""The ASGI example runs offline and shows a repaired request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "asgi_app.py"


def test_the_asgi_example_runs_offline() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, check=True
    )
    out = done.stdout
    assert 'GET /stock/widget -> 200 {"sku":"widget","in_stock":4}' in out
    assert 'GET /stock/gadget -> 200 {"sku":"gadget","in_stock":0}' in out
    assert "recovery recovered via agent: INVENTORY renamed" in out
    assert out.count("recovery.started") == 1  # the repair held for the second request
