"""A real Redis for the Celery tests: the configured one, the local one, or a private server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# A database number the usual local setups leave alone.
REDIS_DB = 11

HOW_TO_GET_REDIS = (
    "The Celery tests need a real Redis and found none. Either set "
    "CRASHOVERRIDE_TEST_REDIS_URL=redis://HOST:PORT/DB, run a Redis on 127.0.0.1:6379 "
    "(e.g. `docker run -p 6379:6379 redis`), or install `redis-server` on PATH "
    "(e.g. `apt-get install redis-server`) so the tests can start a private one."
)


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a Redis answers PING at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_url() -> Iterator[str]:
    configured = os.environ.get("CRASHOVERRIDE_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if answers("127.0.0.1", 6379):
        yield f"redis://127.0.0.1:6379/{REDIS_DB}"
        return
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail(HOW_TO_GET_REDIS, pytrace=False)
    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not answers("127.0.0.1", port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}. " + HOW_TO_GET_REDIS)
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/{REDIS_DB}"
        finally:
            proc.terminate()
            proc.wait(10)
