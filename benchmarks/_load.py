"""HTTP load generators for ``bench_asgi``: wrk, or a keep-alive client on raw asyncio.

wrk (C, one thread per server here) is the one to use: on a two-core machine a Python client
saturates before uvicorn does. ``python_load`` is the fall-back where wrk is not installed; the
rows say which one ran.

Both return, per server, the requests completed and the CPU seconds the server process spent
over the same stretch (``Process.cpu_seconds``: every thread, Sentry's transport thread
included).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks._asgi_servers import REQUEST, Process

WRK = "wrk"


@dataclass
class Sample:
    requests: int
    wall: float  # seconds the load generator ran against this server
    cpu: float | None  # CPU seconds the server spent meanwhile (None: not measurable here)


def wrk_path() -> str | None:
    return shutil.which(WRK)


_DONE = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _parse_wrk(out: str) -> tuple[int, float]:
    found = _DONE.search(out)
    if found is None:
        raise RuntimeError(f"wrk printed no request count:\n{out}")
    if "Non-2xx or 3xx responses" in out or "Socket errors" in out:
        # A server answering errors, or dropping connections, is not the one to measure.
        raise RuntimeError(f"wrk saw errors:\n{out}")
    return int(found.group(1)), float(found.group(2)) * _SCALE[found.group(3)]


def wrk_load(
    servers: dict[str, Process], seconds: float, connections: int, settle: Callable[[], None]
) -> dict[str, Sample]:
    """One wrk per server, all started at once; each server's CPU is read before they start
    and after they have all finished and ``settle`` returned (Sentry's transport may still be
    sending what the requests queued: that work is theirs too)."""
    before = {name: server.cpu_seconds() for name, server in servers.items()}
    url = "http://127.0.0.1:{}/json"
    command = [WRK, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
    procs = {
        name: subprocess.Popen(
            [*command, url.format(server.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, server in servers.items()
    }
    outputs = {name: proc.communicate()[0] for name, proc in procs.items()}
    settle()
    samples = {}
    for name, server in servers.items():
        if procs[name].returncode != 0:
            raise RuntimeError(f"wrk exited {procs[name].returncode}:\n{outputs[name]}")
        requests, wall = _parse_wrk(outputs[name])
        after, first = server.cpu_seconds(), before[name]
        cpu = after - first if after is not None and first is not None else None
        samples[name] = Sample(requests, wall, cpu)
    return samples


# ------------------------------------------------------------------- Python load generator


class _Connection(asyncio.Protocol):
    """One keep-alive connection sending the next request as soon as a response is complete."""

    def __init__(self, counter: list[int]) -> None:
        self.counter = counter
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            start = head.find(b"content-length:")
            length = int(head[start + 15 : head.find(b"\r\n", start)].strip() or 0)
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            if not head.startswith(b"http/1.1 200"):
                raise RuntimeError(f"unexpected response: {head[:40]!r}")
            self.buffer = self.buffer[total:]
            self.counter[0] += 1
            assert self.transport is not None
            self.transport.write(REQUEST)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _python_load(
    servers: dict[str, Process], seconds: float, connections: int
) -> dict[str, Sample]:
    loop = asyncio.get_running_loop()
    counters = {name: [0] for name in servers}
    protocols: list[_Connection] = []
    for name, server in servers.items():
        for _ in range(connections):
            _, protocol = await loop.create_connection(
                lambda name=name: _Connection(counters[name]), "127.0.0.1", server.port
            )
            protocols.append(protocol)
    await asyncio.sleep(0.2)  # every connection is busy before the window opens
    before = {name: (counters[name][0], s.cpu_seconds()) for name, s in servers.items()}
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - began
    samples = {}
    for name, server in servers.items():
        count, first = before[name]
        after = server.cpu_seconds()
        cpu = after - first if after is not None and first is not None else None
        samples[name] = Sample(counters[name][0] - count, wall, cpu)
    for protocol in protocols:
        assert protocol.transport is not None
        protocol.transport.close()
    await asyncio.gather(*(p.closed for p in protocols))
    return samples


def python_load(
    servers: dict[str, Process], seconds: float, connections: int, settle: Callable[[], None]
) -> dict[str, Sample]:
    """Drive every server at once from this process for a window of ``seconds`` inside a
    continuous load; CPU is read at the window's edges (steady state: ``settle`` is not
    needed)."""
    return asyncio.run(_python_load(servers, seconds, connections))
