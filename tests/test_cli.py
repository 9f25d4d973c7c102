"""The ``crashoverride`` command: the offline demo and the doctor."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from crashoverride.testing import MockServer


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "crashoverride", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


def test_demo_runs_offline_says_the_model_is_scripted_and_every_claim_holds() -> None:
    began = time.monotonic()
    result = _run("demo")
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "The model is SCRIPTED" in out
    assert "13/13 checks passed: all claims held (scripted model" in out
    assert "FAIL" not in out
    for event in ("recovery.started", "recovery.tool_called", "recovery.succeeded",
                  "followup.succeeded"):  # fmt: skip
        assert event in out
    assert took < 30


def test_demo_live_without_credentials_refuses_clearly() -> None:
    result = _run("demo", "--live")
    assert result.returncode == 2
    assert "--live needs OPENAI_API_KEY or --base-url" in result.stderr


def test_doctor_without_model_access_is_unhealthy() -> None:
    result = _run("doctor")
    assert result.returncode == 1
    assert "caller locals write-through" in result.stdout
    assert "NOT healthy" in result.stdout


def test_doctor_with_a_reachable_endpoint_is_healthy_and_never_prints_the_key() -> None:
    with MockServer([]) as server:
        result = _run("doctor", "--base-url", server.base_url,
                      env={"OPENAI_API_KEY": "sk-do-not-print-me"})  # fmt: skip
    assert result.returncode == 0, result.stdout
    assert "sk-do-not-print-me" not in result.stdout
    assert "configured (OPENAI_API_KEY, not shown)" in result.stdout
    assert result.stdout.strip().endswith("healthy")


def test_doctor_with_an_unreachable_endpoint_is_unhealthy() -> None:
    result = _run("doctor", "--base-url", "http://127.0.0.1:9/v1")
    assert result.returncode == 1
    assert "FAIL endpoint http://127.0.0.1:9/v1" in result.stdout
