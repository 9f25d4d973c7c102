"""Redis servers of a benchmark's own, and a MONITOR that says who sent what.

``redis_server`` and ``redis_cluster`` start real ``redis-server`` processes on free loopback
ports in a temporary directory (no persistence), wait until they serve, and kill them by PID on
the way out. ``Monitor`` reads ``MONITOR`` on every node until stopped and attributes each
command to the connection name (``CLIENT SETNAME``) of the client that sent it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

READY_WITHIN = 30.0  # seconds: a loaded machine starts processes slowly
_QUIET = ("--save", "", "--appendonly", "no", "--bind", "127.0.0.1")
_STOP = "bench-monitor-stop"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"this benchmark needs `{name}` on PATH")
    return found


def _until(ready: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    import redis

    deadline = time.monotonic() + READY_WITHIN
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready")
        time.sleep(0.02)


def _asks(port: int, check: Callable[[Any], bool]) -> Callable[[], bool]:
    def probe() -> bool:
        import redis

        with redis.Redis(port=port, protocol=2) as client:
            return check(client)

    return probe


@contextmanager
def _processes() -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as workdir:
        try:
            yield Path(workdir), procs
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(10)


def _start(procs: list[subprocess.Popen[bytes]], *args: str) -> None:
    quiet = subprocess.DEVNULL
    procs.append(subprocess.Popen([_binary("redis-server"), *args], stdout=quiet, stderr=quiet))


@contextmanager
def redis_server() -> Iterator[tuple[str, list[int]]]:
    """One redis-server: its URL and ``[port]``."""
    port = _free_port()
    with _processes() as (workdir, procs):
        _start(procs, "--port", str(port), "--dir", str(workdir), *_QUIET)
        _until(_asks(port, lambda c: bool(c.ping())), "redis-server", procs)
        yield f"redis://127.0.0.1:{port}/0", [port]


@contextmanager
def redis_cluster(masters: int = 3) -> Iterator[tuple[str, list[int]]]:
    """A Redis Cluster of ``masters`` masters, no replicas: one node's URL, and every port."""
    ports = [_free_port() for _ in range(masters)]
    with _processes() as (workdir, procs):
        for port in ports:
            _start(procs, "--port", str(port), "--cluster-enabled", "yes",
                   "--cluster-port", str(_free_port()),
                   "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
                   "--dir", str(workdir), *_QUIET)  # fmt: skip
        for port in ports:
            _until(_asks(port, lambda c: bool(c.ping())), f"cluster node {port}", procs)
        subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

        def ok(client: Any) -> bool:
            info = client.execute_command("CLUSTER INFO")
            return bool(info["cluster_state"] == "ok"
                        and int(info["cluster_known_nodes"]) == masters)  # fmt: skip

        for port in ports:  # every node knows the others and serves every slot
            _until(_asks(port, ok), "the cluster", procs)
        yield f"redis://127.0.0.1:{ports[0]}", ports


class Monitor:
    """``MONITOR`` on each of ``ports`` (``with``), until ``stop()``, which returns every
    command a named client sent: ``{"time", "name", "command", "land", "lua"}`` (``lua``: how
    many commands its script ran, which MONITOR shows right after it as ``[lua]``)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.lines: dict[int, list[str]] = {port: [] for port in ports}
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> Monitor:
        for port in self.ports:
            started = threading.Event()
            thread = threading.Thread(target=self._read, args=(port, started), daemon=True)
            thread.start()
            started.wait(10)
            self.threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _read(self, port: int, started: threading.Event) -> None:
        import redis

        with (
            redis.Redis(port=port, protocol=2, socket_timeout=None) as client,
            client.monitor() as monitor,
        ):
            started.set()
            while True:
                raw = monitor.connection.read_response()
                line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                if _STOP in line:
                    return
                self.lines[port].append(line)

    def stop(self) -> list[dict[str, Any]]:
        import redis

        for port, thread in zip(self.ports, self.threads, strict=True):
            if thread.is_alive():
                with redis.Redis(port=port, protocol=2) as client:
                    client.echo(_STOP)
                thread.join(10)
        return [entry for port in self.ports for entry in _attributed(self.lines[port])]


def _attributed(lines: list[str]) -> list[dict[str, Any]]:
    """One node's MONITOR lines as commands of named clients."""
    parsed = []
    for line in lines:
        stamp, rest = line.split(" ", 1)
        client, _, command = rest[1:].partition("] ")
        parsed.append((float(stamp), client.split(" ", 1)[-1], command))
    names = {}
    for _, client, command in parsed:
        if command.startswith('"CLIENT" "SETNAME" "'):
            names[client] = command.split('"')[5]
    entries: list[dict[str, Any]] = []
    for stamp, client, command in parsed:
        if client == "lua":
            if entries:
                entries[-1]["lua"] += 1
            continue
        name = names.get(client)
        if name is None:
            continue
        entries.append({"time": stamp, "name": name, "command": command.split('"')[1].upper(),
                        "land": "KEYS[3], ARGV[3]" in command, "lua": 0})  # fmt: skip
    return entries
