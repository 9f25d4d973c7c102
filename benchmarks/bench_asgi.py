"""Requests per second through uvicorn, with and without ``CrashOverrideMiddleware``.

Two uvicorn processes serve the same small Starlette JSON endpoint, one of them behind the
middleware (no request fails, so this is the cost every healthy request pays). A keep-alive
load generator written on raw asyncio protocols (so the client is not what is measured) drives
both servers at the same time (see ``measure`` for why), or in turn with ``--mode alternating``;
figures are medians of the repetitions.

    python -m benchmarks.bench_asgi [--repeats 7] [--seconds 2] [--connections 32] [--mode ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import Row, format_table, row

TARGET = ">= 0.95"
_REQUEST = b"GET /json HTTP/1.1\r\nHost: bench\r\n\r\n"


# ---------------------------------------------------------------------------------- servers


def _app(protected: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world", "items": [1, 2, 3]})

    app = Starlette(routes=[Route("/json", hello)])
    if protected:
        from crashoverride import CrashOverride
        from crashoverride.integrations.asgi import CrashOverrideMiddleware

        app.add_middleware(
            CrashOverrideMiddleware, crash_override=CrashOverride(), prompt="Answer truthfully."
        )
    return app


def _serve(kind: str, fd: int, cpu: int | None) -> None:
    import uvicorn

    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})

    # ``socket.socket(fileno=...)`` detects the family; uvicorn's own ``fd=`` assumes a UNIX
    # socket, which would leave Nagle's algorithm on and measure TCP delays instead.
    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        _app(kind == "protected"), log_level="warning", access_log=False,
        lifespan="on", loop="asyncio", http="h11",
    )  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])


class _Server:
    def __init__(self, kind: str, cpu: int | None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port: int = self.sock.getsockname()[1]
        fd = self.sock.fileno()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        command = [sys.executable, "-m", "benchmarks.bench_asgi", "--serve", kind, "--fd", str(fd)]
        if cpu is not None:
            command += ["--cpu", str(cpu)]
        self.proc = subprocess.Popen(
            command,
            pass_fds=(fd,),
            cwd=root,
        )

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(_REQUEST)
                    if conn.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("the benchmark server exited")
            time.sleep(0.1)
        raise RuntimeError("the benchmark server did not start")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


# ------------------------------------------------------------------------------ load client


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
        transport.write(_REQUEST)

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
            self.transport.write(_REQUEST)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _load(ports: dict[str, int], seconds: float, connections: int) -> dict[str, float]:
    """Drive every server in ``ports`` at once; requests per second of each."""
    loop = asyncio.get_running_loop()
    counters = {name: [0] for name in ports}
    protocols: list[_Connection] = []
    for name, port in ports.items():
        for _ in range(connections):
            _, protocol = await loop.create_connection(
                lambda name=name: _Connection(counters[name]), "127.0.0.1", port
            )
            protocols.append(protocol)
    await asyncio.sleep(0.2)  # every connection is busy before the window opens
    before = {name: counter[0] for name, counter in counters.items()}
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - began
    done = {name: counters[name][0] - before[name] for name in ports}
    for protocol in protocols:
        assert protocol.transport is not None
        protocol.transport.close()
    await asyncio.gather(*(p.closed for p in protocols))
    return {name: count / elapsed for name, count in done.items()}


def _server_cpu() -> int | None:
    """One CPU both servers share (the scheduler then splits it fairly between them); the
    load generator keeps to the others."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    os.sched_setaffinity(0, set(cpus[1:]))
    return cpus[0]


def measure(
    repeats: int = 7, seconds: float = 2.0, connections: int = 32, mode: str = "concurrent"
) -> dict[str, float]:
    """Median requests per second of each server.

    Servers are pinned to one CPU and the load generator to the others (client and server
    migrating between CPUs made single runs swing by +-20%). ``concurrent`` (default) loads
    both servers at the same time: the scheduler shares their CPU fairly, so the ratio is the
    ratio of per-request CPU cost, and load from anything else on the machine hits both alike.
    ``alternating`` loads one at a time, swapping the order every repetition: absolute figures
    are those of a server alone.
    """
    cpu = _server_cpu()
    servers = {"plain": _Server("plain", cpu), "protected": _Server("protected", cpu)}
    try:
        for server in servers.values():
            server.wait_ready()
        ports = {name: server.port for name, server in servers.items()}
        asyncio.run(_load(ports, 0.5, connections))  # warm-up: imports, caches, connections
        samples: dict[str, list[float]] = {name: [] for name in servers}
        for i in range(repeats):
            if mode == "concurrent":
                rounds = [ports]
            else:
                order = list(ports) if i % 2 == 0 else list(reversed(ports))
                rounds = [{name: ports[name]} for name in order]
            for subset in rounds:
                for name, value in asyncio.run(_load(subset, seconds, connections)).items():
                    samples[name].append(value)
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        for server in servers.values():
            server.close()


def measure_direct(calls: int = 5_000, rounds: int = 9) -> dict[str, float]:
    """Median microseconds per request when the app is called directly (no server, no network).

    Stricter than the uvicorn figure: the middleware's cost is not diluted by HTTP parsing.
    """
    apps = {"plain": _app(False), "protected": _app(True)}
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/json", "raw_path": b"/json", "root_path": "",
        "query_string": b"", "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    async def batch(app: Any) -> float:
        began = time.perf_counter()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        return (time.perf_counter() - began) / calls * 1e6

    samples: dict[str, list[float]] = {name: [] for name in apps}
    for i in range(rounds + 1):
        order = list(apps) if i % 2 == 0 else list(reversed(apps))
        for name in order:
            value = asyncio.run(batch(apps[name]))
            if i:  # the first round warms up
                samples[name].append(value)
    return {name: statistics.median(values) for name, values in samples.items()}


def run(
    repeats: int = 7, seconds: float = 2.0, connections: int = 32, mode: str = "concurrent"
) -> list[Row]:
    rps = measure(repeats, seconds, connections, mode)
    direct = measure_direct()
    # Expressed as requests per second so that, like the uvicorn row, higher is better.
    return [
        row(
            "uvicorn + Starlette JSON endpoint: with CrashOverrideMiddleware vs without",
            rps["protected"], "req/s", baseline=rps["plain"], target=TARGET,
            note=f"{mode}, median of {repeats} x {seconds:g}s, {connections} keep-alive "
            "connections per server, h11",
        ),
        row(
            "Starlette JSON endpoint called directly (no server): with middleware vs without",
            1e6 / direct["protected"], "req/s", baseline=1e6 / direct["plain"],
            note="informational: the middleware's cost undiluted by HTTP parsing",
        ),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--mode", choices=("concurrent", "alternating"), default="concurrent")
    parser.add_argument("--serve", choices=("plain", "protected"), help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.fd, args.cpu)
        return
    rows = run(args.repeats, args.seconds, args.connections, args.mode)
    print(format_table(rows))
    server = rows[0]
    print(
        f"\nthrough uvicorn: {server['value']:.0f} req/s with the middleware, "
        f"{server['baseline']:.0f} req/s without, ratio {server['ratio']:.3f} "
        f"(target {server['target']})"
    )


if __name__ == "__main__":
    main()
