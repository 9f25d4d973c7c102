"""``crashoverride demo --scene redelivery``: real Celery workers, the machine's Redis, a scripted
model. A worker killed right after a declared charge: the card is charged once; the same shop
without ``co.effect`` charges it again. Without a Redis the scene says what to start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.integrations.celery_support import redis_url


def _demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "crashoverride", "demo", *args],
        capture_output=True, text=True, timeout=600, env={**base, **env},
    )  # fmt: skip


@pytest.mark.slow
def test_the_redelivery_scene_charges_once_with_the_declaration_and_again_without() -> None:
    with redis_url() as url:
        result = _demo("--scene", "redelivery", env={"REDIS_URL": url})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "The model is SCRIPTED" in out
    assert out.count("worker 1 was killed with SIGKILL right after the charge") == 2
    assert "worker 2 got the redelivery: 'order 7 paid, receipt ch_1'" in out
    with_effect, without = out.split("-- without co.effect")
    assert "the card was charged 1 time(s)" in with_effect
    assert "the card was charged 3 time(s)" in without
    assert "4/4 checks passed: all claims held (scripted model" in out
    assert "FAIL" not in out


def test_without_a_redis_the_scene_says_what_to_start() -> None:
    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = _demo("--scene", "redelivery", env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    assert result.returncode == 2
    assert f"needs a Redis and none answers at 127.0.0.1:{port}" in result.stderr
    assert "redis-server" in result.stderr
    assert "REDIS_URL" in result.stderr
    assert result.stdout == ""  # nothing started


def test_the_help_lists_every_scene() -> None:
    result = _demo("--help", env={})
    assert result.returncode == 0
    for name in ("scraper", "endpoint", "followup", "redelivery"):
        assert f"\n  {name} " in result.stdout
    assert "crashoverride[demo,celery]" in result.stdout
