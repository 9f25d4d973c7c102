"""The examples run offline, as a user would run them, and show what their docstrings claim."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True, text=True, timeout=120, cwd=path.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_cgi_script_persists_its_fix_and_the_next_run_needs_no_recovery(tmp_path: Path) -> None:
    script = tmp_path / "cgi_script.py"
    shutil.copy(EXAMPLES / "cgi_script.py", script)
    first = _run(script, "3.5", "--write")
    assert "the model is scripted" in first
    assert '{"weight_kg": 3.5, "fee": 8.5}' in first
    assert "source change written" in first
    assert "import math" in script.read_text()  # the import the live fix relied on came along
    second = _run(script, "7")
    assert '{"weight_kg": 7.0, "fee": 12.1}' in second
    assert "no recovery was needed" in second
    assert "recovery.started" not in second


def test_cgi_script_by_default_only_proposes_a_patch(tmp_path: Path) -> None:
    script = tmp_path / "cgi_script.py"
    shutil.copy(EXAMPLES / "cgi_script.py", script)
    original = script.read_text()
    out = _run(script, "1")
    assert '"fee": 4.9' in out and "source change proposed" in out
    assert script.read_text() == original
    assert len(list(tmp_path.glob("cgi_script.py.rec_*.patch"))) == 1


def test_just_in_time_implementation() -> None:
    out = _run(EXAMPLES / "just_in_time.py")
    assert "first report: p95 = 67.5" in out
    assert "second report: p95 = 67.5" in out
    assert "recoveries: 1" in out


def test_fastapi_example_answers_with_respond() -> None:
    out = _run(EXAMPLES / "fastapi_app.py")
    lines = [line for line in out.splitlines() if line.startswith("GET ")]
    chf = '{"amount":10.0,"currency":"CHF","converted":8.8}'
    eur = '{"amount":10.0,"currency":"EUR","converted":9.2}'
    assert lines == [
        f"GET /convert?amount=10&currency=CHF -> 200 {chf}",
        f"GET /convert?amount=10&currency=CHF -> 200 {chf}",
        f"GET /convert?amount=10&currency=EUR -> 200 {eur}",
    ]
    assert out.count("recovery.started") == 1  # the refreshed cache served the second request


def test_queue_consumer_integration_written_against_the_public_contract() -> None:
    out = _run(EXAMPLES / "queue_consumer.py")
    assert "the model is scripted" in out
    assert "recoveries: 1" in out
    assert "order 2: 2 item(s) for user2@example.com" in out
    assert "order 3: 3 item(s) for user3@example.com" in out
    source = (EXAMPLES / "queue_consumer.py").read_text()
    assert "crashoverride._" not in source  # only the public contract
