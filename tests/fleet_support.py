"""Redis for the fleet tests: the local one (a database of their own), or a private server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.integrations.celery_support import answers

# Not a database other tests use (Celery's 11, the ledger's 13).
FLEET_DB = 14
FLEET_KEY = "fleet-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of the test's own (its URL and process): a test may kill it."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("the fleet tests need `redis-server` on PATH", pytrace=False)
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not answers("127.0.0.1", port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}", pytrace=False)
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0", proc
        finally:
            proc.kill()
            proc.wait(10)


@contextmanager
def fleet_redis() -> Iterator[str]:
    """The local Redis's ``FLEET_DB``, else a private server. Nothing is flushed: each test
    works in a namespace of its own (``new_namespace``) and removes its keys (``clean``), so
    runs of these tests at the same time, and other users of the database, do not collide."""
    if answers("127.0.0.1", 6379):
        yield f"redis://127.0.0.1:6379/{FLEET_DB}"
        return
    with private_redis() as (url, _):
        yield url


def new_namespace() -> str:
    return "test-" + os.urandom(5).hex()


def clean(url: str, namespace: str) -> None:
    """Remove every key naming ``namespace``: the fleet's (``co:NAMESPACE:...``), and a Celery
    queue's and its bindings when the namespace named the queue."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=f"*{namespace}*", count=500))
        if names:
            client.delete(*names)
    finally:
        client.close()


def close_fleet(*apps: Any) -> None:
    """Close the Redis clients of these ``CrashOverride`` apps (no unclosed socket at exit)."""
    for app in apps:
        state = app._limits_state
        link = getattr(getattr(state, "coordination", None), "link", None)
        if link is not None:
            link.close()
