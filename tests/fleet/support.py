"""Redis for the fleet tests: the local one (a database of their own), or a private server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
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
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = start_redis(port, workdir)
        try:
            yield f"redis://127.0.0.1:{port}/0", proc
        finally:
            proc.kill()
            proc.wait(10)


def start_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    """A redis-server on ``port``, without persistence, once it answers (the caller stops it):
    a test's own, or one started again where a killed one listened."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("the fleet tests need `redis-server` on PATH", pytrace=False)
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not answers("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"redis-server did not start on port {port}", pytrace=False)
        time.sleep(0.02)
    return proc


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
        link = getattr(app._effects_store, "link", None)  # the journal's (declared effects)
        if link is not None:
            link.close()


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what comes and never
    answers: a Redis that hangs (its URL is ``url``). It also tells whether each connection it
    accepted was closed by the client again (``open_connections``)."""

    def __init__(self) -> None:
        import selectors
        import threading

        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self.accepted = 0
        self._open: set[socket.socket] = set()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-redis", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _serve(self) -> None:
        import selectors

        while not self._stop.is_set():
            for found, _ in self._selector.select(timeout=0.01):
                sock = found.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    conn, _ = sock.accept()
                    conn.setblocking(False)
                    self.accepted += 1
                    self._open.add(conn)
                    self._selector.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:  # the client closed it
                    self._selector.unregister(sock)
                    self._open.discard(sock)
                    sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for conn in self._open:
            conn.close()
        self._selector.close()
        self._listener.close()


@contextmanager
def silent_redis() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


async def leader_then_others(
    on_leader: Any,
    on_other: Any,
    count: int,
    logs: list[dict[str, Any]],
    *,
    release: threading.Event,
    waiting: Callable[[], bool],
) -> dict[int, int]:
    """A burst across two apps: odd arguments fail on the first, and once it holds the lease,
    even ones on the second. The leader's agent code waits for ``release``, set once the
    second app waits in Redis (``waiting``): however slow the machine, the burst meets the
    lease, never an outcome already landed. Their results, by argument."""
    import anyio

    from tests.helpers import await_for

    results: dict[int, int] = {}

    async def run(job: Any, i: int) -> None:
        results[i] = await job(i)

    release.clear()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(1, count, 2):
                tg.start_soon(run, on_leader, i)
            await await_for(lambda: any(e["event"] == "fleet.lease_taken" for e in logs))
            for i in range(0, count, 2):
                tg.start_soon(run, on_other, i)
            await await_for(waiting)  # polled: a sync look at Redis, as the tests do elsewhere
            release.set()
    finally:
        release.set()  # a failing test must not leave agent code waiting
    return results


def assert_skipped_for_budget(error: BaseException, logs: list[dict[str, Any]]) -> None:
    """The failure was not recovered for the fleet budget, and its note and event say so."""
    assert "fleet budget reached" in "".join(getattr(error, "__notes__", []))
    (skipped,) = [e for e in logs if e["event"] == "recovery.skipped"]
    assert "max_agent_runs_per_minute" in skipped["reason"]
