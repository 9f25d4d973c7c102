"""The uvicorn servers ``bench_asgi`` compares, and the local HTTP sink Sentry reports to.

Each server is its own process serving the same small Starlette JSON endpoint; they differ only
in what wraps the app (``KINDS``). Sentry is configured as its Starlette guide shows, with the
DSN pointing at ``sink`` (a process of its own on this machine that answers every envelope
``200``), so its transport really serialises, compresses and sends each event:

- ``sentry``: ``sentry_sdk.init(dsn=..., traces_sample_rate=1.0)``, the guide's "error
  monitoring + tracing" set-up; every other option at its default, so the default integrations
  and the auto-enabling ones (``StarletteIntegration`` among them, which wraps the app in
  Sentry's ASGI middleware) are on. The guide's ``send_default_pii=True`` is left out: sentry-sdk
  3 replaced it (``data_collection``), and it only changes what a request's event carries.
- ``sentry-errors``: ``sentry_sdk.init(dsn=...)``, error monitoring alone (tracing off): the
  closest to what crashoverride does, which only acts on a failure.
- ``both``: ``CrashOverrideMiddleware`` inside, Sentry's set-up of ``sentry`` around it.

    python -m benchmarks._asgi_servers --serve KIND --fd FD [--cpu N] [--dsn DSN]
    python -m benchmarks._asgi_servers --sink --fd FD
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, ClassVar

KINDS = ("plain", "protected", "sentry", "sentry-errors", "both")
# For experiments (``bench_asgi --kinds``): ``noop``, a pass-through middleware (the floor any
# middleware pays); ``sentry-errors-lean``, ``sentry-errors`` with only the Starlette integration
# (the auto-enabling ones import every library they instrument that is installed: in a venv of
# every extra, ~1,900 modules the garbage collector then walks).
EXTRA_KINDS = ("noop", "sentry-errors-lean")
REQUEST = b"GET /json HTTP/1.1\r\nHost: bench\r\n\r\n"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def app(protected: bool, noop: bool = False) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world", "items": [1, 2, 3]})

    application = Starlette(routes=[Route("/json", hello)])
    if protected:
        from crashoverride import CrashOverride
        from crashoverride.integrations.asgi import CrashOverrideMiddleware

        application.add_middleware(
            CrashOverrideMiddleware, crash_override=CrashOverride(), prompt="Answer truthfully."
        )
    if noop:

        class PassThrough:
            def __init__(self, app: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                await self.app(scope, receive, send)

        application.add_middleware(PassThrough)
    return application


def _serve(kind: str, fd: int, cpu: int | None, dsn: str | None) -> None:
    import uvicorn

    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})  # before Sentry starts its threads: they inherit it
    if kind.startswith("sentry") or kind == "both":
        import sentry_sdk

        if kind == "sentry-errors-lean":
            from sentry_sdk.integrations.starlette import StarletteIntegration

            sentry_sdk.init(
                dsn=dsn, auto_enabling_integrations=False, integrations=[StarletteIntegration()]
            )
        elif kind == "sentry-errors":
            sentry_sdk.init(dsn=dsn)
        else:
            sentry_sdk.init(dsn=dsn, traces_sample_rate=1.0)
    # ``socket.socket(fileno=...)`` detects the family; uvicorn's own ``fd=`` assumes a UNIX
    # socket, which would leave Nagle's algorithm on and measure TCP delays instead.
    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        app(kind in ("protected", "both"), kind == "noop"), log_level="warning", access_log=False,
        lifespan="on", loop="asyncio", http="h11",
    )  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])


class Process:
    """A child process of this module listening on a socket bound here (so its port is known
    before it starts)."""

    def __init__(self, args: list[str]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port: int = self.sock.getsockname()[1]
        fd = self.sock.fileno()
        command = [sys.executable, "-m", "benchmarks._asgi_servers", *args, "--fd", str(fd)]
        self.proc = subprocess.Popen(command, pass_fds=(fd,), cwd=_ROOT)

    def get(self, path: bytes = b"/json") -> bytes:
        """One GET on a fresh connection: the response's body."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(REQUEST.replace(b"/json", path, 1))
            data = b""
            while b"\r\n\r\n" not in data or len(data) < _length(data):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected response: {data[:40]!r}")
        return data.split(b"\r\n\r\n", 1)[1]

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get()
                return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the benchmark process exited: {self.proc.args}")
            time.sleep(0.1)
        raise RuntimeError(f"the benchmark process did not start: {self.proc.args}")

    def cpu_seconds(self) -> float | None:
        """CPU time of every live thread of the process (Linux: ns resolution, where
        ``/proc/PID/stat`` counts 10 ms ticks); None where ``/proc`` has no schedstat."""
        total = 0
        try:
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return total / 1e9

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def server(kind: str, cpu: int | None, dsn: str) -> Process:
    args = ["--serve", kind, "--dsn", dsn]
    return Process(args + (["--cpu", str(cpu)] if cpu is not None else []))


def sink() -> Process:
    return Process(["--sink"])


def _length(data: bytes) -> int:
    """Bytes of a complete response or request whose head is in ``data`` (Content-Length)."""
    end = data.find(b"\r\n\r\n")
    head = data[:end].lower()
    start = head.find(b"content-length:")
    if start < 0:
        return end + 4
    line_end = head.find(b"\r\n", start)
    return end + 4 + int(head[start + 15 : line_end if line_end >= 0 else len(head)].strip())


# ------------------------------------------------------------------------------------ sink


class _Sink(asyncio.Protocol):
    """Answers every request 200 on a keep-alive connection, counts the POSTs (envelopes) by
    path (a DSN's project id is in it: one per server), and tells the counts to ``GET /count``
    as JSON."""

    received: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer and len(self.buffer) >= _length(self.buffer):
            total = _length(self.buffer)
            request, self.buffer = self.buffer[:total], self.buffer[total:]
            method, path = request.split(b" ", 2)[:2]
            body = b"{}"
            if method == b"POST":
                key = path.decode("latin-1")
                _Sink.received[key] = _Sink.received.get(key, 0) + 1
            elif path == b"/count":
                body = json.dumps(_Sink.received).encode()
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )


def received(sink: Process) -> dict[str, int]:
    """Envelopes the sink received so far, by the project id of the DSN they were sent to."""
    counts: dict[str, int] = json.loads(sink.get(b"/count"))
    return {path.split("/")[2]: n for path, n in counts.items() if path.startswith("/api/")}


async def _sink(fd: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Sink, sock=socket.socket(fileno=fd))
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", choices=KINDS + EXTRA_KINDS)
    parser.add_argument("--sink", action="store_true")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--cpu", type=int)
    parser.add_argument("--dsn")
    args = parser.parse_args(argv)
    if args.sink:
        asyncio.run(_sink(args.fd))
    else:
        _serve(args.serve, args.fd, args.cpu, args.dsn)


if __name__ == "__main__":
    main()
