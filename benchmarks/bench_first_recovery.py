"""Event-loop stalls while a live server recovers: its first failure, then a burst.

Three processes, so none of them competes with the measuring one for a GIL: the loopback
``MockServer`` (the model), a uvicorn + Starlette app behind ``CrashOverrideMiddleware`` with a
``/health`` route and a failing ``/fail`` route, and this one, which polls ``/health``
back-to-back on one keep-alive connection and records how long each answer took. A health
check that waits is a request the recovery froze: the worst one is the longest stall.

* first: a fresh server process with the middleware's defaults gets its first failing request;
  the model answers it with ``respond(...)``. The middleware imported the SDK at lifespan
  startup (``warm_up=True``), so what remains is the recovery itself. Repeated on ``--repeats``
  fresh servers.
* lazy (informational): the same with ``warm_up=False``: the first failure imports the SDK
  while the server is serving.
* burst: a fresh server process gets ``--burst`` failing requests at once, ``single_flight=False``
  (every request runs its own agent), the model hangs, ``timeout`` 8 s: every request ends with
  the original 500 at its deadline. The recovery time is what each client waited. Every
  request's agent session is alive at once: their SDK orchestration runs on the process's agent
  loop (a thread of its own), the start of each recovery passes the loop's lane one at a time
  (``_placement.lane``); what still stalls the loop is the cyclic garbage collector's full
  collections over the sessions' objects (about 1,100 tracked objects a session).
* burst-defaults (informational): the same burst with the default limits (four agent runs at a
  time; the others wait for a slot within their budget).
* burst-bare (contrast): the same burst against the same app without the middleware: what the
  server itself costs the loop when 500 requests arrive together.

    python -m benchmarks.bench_first_recovery [--burst 500] [--timeout 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._common import Row, format_table, row

STALL_TARGET = "< 100 ms"
SCENARIOS = ("first", "lazy", "burst", "burst-defaults", "burst-bare")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------- the two servers


def _mock(scenario: str) -> None:
    """Serve the model until stdin closes; the first line printed is its base URL."""
    from crashoverride.testing import MockServer, done, hang
    from crashoverride.testing.asgi import respond

    if not scenario.startswith("burst"):
        steps: list[Any] = [respond(200, {"recovered": True}), done("answered")]
    else:
        steps = [hang(times=None)]  # every request hangs past the recovery's deadline
    with MockServer(steps, max_hang=30) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


def _app(scenario: str, model_url: str, timeout: float, burst: int) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from crashoverride import CrashOverride
    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    async def health(_: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def fail(_: Any) -> PlainTextResponse:
        raise LookupError("the price of this item moved to another field")

    # "burst": every failure runs its own agent at once (no single-flight, no process limit):
    # the worst case. "burst-defaults": no single-flight, the default limits otherwise (four
    # agent runs at a time, the others wait for a slot within their budget).
    limits: dict[str, Any] = (
        {"max_concurrent_recoveries": burst, "concurrency_wait": timeout}
        if scenario == "burst" else {}
    )  # fmt: skip
    co = CrashOverride(
        model="bench-model", base_url=model_url, api_key="sk-bench", timeout=timeout,
        single_flight=not scenario.startswith("burst"), breaker_threshold=10**9, **limits,
    )  # fmt: skip

    routes = [Route("/health", health), Route("/fail", fail)]
    app = Starlette(routes=routes)
    if scenario == "burst-bare":  # the contrast: the same app and burst, no crashoverride
        return app
    app.add_middleware(
        CrashOverrideMiddleware, crash_override=co, prompt="Answer the request.", timeout=timeout,
        warm_up=scenario != "lazy",
    )  # fmt: skip
    return app


_ENDED = ("recovery.succeeded", "recovery.failed", "recovery.skipped", "recovery.cancelled")


def _serve(
    scenario: str, fd: int, model_url: str, timeout: float, burst: int, durations: str
) -> None:
    import structlog
    import uvicorn

    # An application decision (the library never configures structlog): a burst would
    # otherwise measure the terminal. The server's own view of each recovery (failure to
    # outcome, as the report measures it) goes to a file as it ends: uvicorn ends the process
    # by re-raising SIGTERM once it has shut down, so nothing can be written at exit.
    out = open(durations, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def keep(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("event") in _ENDED and "duration_ms" in event:
            out.write(f"{float(event['duration_ms']) / 1000}\n")
        return event

    structlog.configure(processors=[keep], logger_factory=structlog.ReturnLoggerFactory())
    app = _app(scenario, model_url, timeout, burst)
    heavy = [name for name in ("agents", "openai") if name in sys.modules]
    if heavy:  # the middleware's warm-up, if any, comes at lifespan startup
        raise RuntimeError(f"not a cold start: {heavy} already imported")
    config = uvicorn.Config(
        app, log_level="critical", access_log=False, lifespan="on", loop="asyncio", http="h11",
        backlog=4096,
    )  # fmt: skip
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


class _Processes:
    """The model process and a fresh app server process for one scenario."""

    def __init__(self, scenario: str, timeout: float, burst: int) -> None:
        here = [sys.executable, "-m", "benchmarks.bench_first_recovery"]
        self.mock = subprocess.Popen(
            [*here, "--mock", scenario], cwd=_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.mock.stdout is not None
        model_url = self.mock.stdout.readline().strip()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.port: int = self.sock.getsockname()[1]
        fd = self.sock.fileno()
        self._dir = tempfile.TemporaryDirectory(prefix="bench-first-")
        self.durations = os.path.join(self._dir.name, "durations.json")
        self.app = subprocess.Popen(
            [*here, "--serve", scenario, "--fd", str(fd), "--model-url", model_url,
             "--timeout", str(timeout), "--burst", str(burst), "--durations", self.durations],
            cwd=_ROOT, pass_fds=(fd,),
        )  # fmt: skip

    def close(self) -> None:
        for proc in (self.app, self.mock):
            if proc is self.mock and proc.stdin is not None:
                proc.stdin.close()
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.mock.stdout is not None:
            self.mock.stdout.close()
        self.sock.close()

    def server_times(self) -> list[float]:
        """Each recovery's duration as the server saw it (written when it shut down)."""
        try:
            with open(self.durations) as data:
                return sorted(float(line) for line in data if line.strip())
        except (OSError, ValueError):
            return []
        finally:
            self._dir.cleanup()


# ------------------------------------------------------------------------------ the client


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> int:
    """One keep-alive GET; returns the status."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    start = head.find(b"content-length:")
    length = int(head[start + 15 : head.find(b"\r\n", start)].strip()) if start >= 0 else 0
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def _wait_ready(port: int) -> None:
    async with asyncio.timeout(60):  # a fresh server imports Starlette and uvicorn first
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                if await _get(reader, writer, "/health") == 200:
                    return
            finally:
                writer.close()
                await writer.wait_closed()


class _HealthPoller:
    """``/health`` back to back on one keep-alive connection: (sent at, seconds taken)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[tuple[float, float]] = []
        self._stop = False

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            while not self._stop:
                began = time.perf_counter()
                if await _get(reader, writer, "/health") != 200:
                    raise RuntimeError("/health failed")
                self.samples.append((began, time.perf_counter() - began))
        finally:
            writer.close()
            await writer.wait_closed()

    def stop(self) -> None:
        self._stop = True

    def worst(self, start: float, end: float) -> float:
        """Longest health check that was waiting at any time in [start, end]."""
        return max(taken for sent, taken in self.samples if sent + taken >= start and sent <= end)


async def _failing_request(port: int) -> tuple[int, float]:
    began = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        status = await _get(reader, writer, "/fail")
    finally:
        writer.close()
        await writer.wait_closed()
    return status, time.perf_counter() - began


async def _scenario(port: int, burst: int) -> dict[str, Any]:
    await _wait_ready(port)
    poller = _HealthPoller(port)
    polling = asyncio.create_task(poller.run())
    await asyncio.sleep(1.0)  # a baseline of healthy answers before anything fails
    quiet = poller.worst(0.0, time.perf_counter())
    began = time.perf_counter()
    results = await asyncio.gather(*(_failing_request(port) for _ in range(burst)))
    ended = time.perf_counter()
    await asyncio.sleep(0.3)
    poller.stop()
    await polling
    return {
        "quiet": quiet,
        "worst": poller.worst(began, ended),
        "times": sorted(seconds for _, seconds in results),
        "statuses": sorted({status for status, _ in results}),
        "wall": ended - began,
        "polls": len(poller.samples),
    }


def measure(scenario: str, burst: int, timeout: float) -> dict[str, Any]:
    processes = _Processes(scenario, timeout, burst)
    try:
        result = asyncio.run(_scenario(processes.port, burst))
    finally:
        processes.close()
    result["server_times"] = processes.server_times()
    return result


def _p95(values: list[float]) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def _firsts(scenario: str, repeats: int, timeout: float) -> dict[str, Any]:
    """The first-failure scenario on ``repeats`` fresh servers: medians, and the worst."""
    results = [measure(scenario, 1, timeout) for _ in range(repeats)]
    worst = [r["worst"] * 1000 for r in results]
    return {
        "worst": statistics.median(worst),
        "max": max(worst),
        "quiet": statistics.median(r["quiet"] * 1000 for r in results),
        "recovery": statistics.median(r["times"][0] for r in results),
        "statuses": sorted({s for r in results for s in r["statuses"]}),
    }


def run(burst: int = 500, timeout: float = 8.0, repeats: int = 5) -> list[Row]:
    first = _firsts("first", repeats, timeout)
    lazy = _firsts("lazy", repeats, timeout)
    many = measure("burst", burst, timeout)
    times = many["times"]
    inside = many["server_times"]
    limited = measure("burst-defaults", burst, timeout)
    bare = measure("burst-bare", burst, timeout)

    def first_note(r: dict[str, Any], what: str) -> str:
        return (
            f"{what}; median of {repeats} fresh servers (worst {r['max']:.0f} ms); recovery "
            f"{r['recovery']:.2f}s -> {r['statuses']}; /health before the failure "
            f"{r['quiet']:.1f} ms"
        )

    return [
        row(
            "first failing request of a fresh uvicorn server: worst /health latency",
            first["worst"], "ms", target=STALL_TARGET,
            note=first_note(first, "middleware defaults: SDK imported at lifespan startup"),
        ),
        row(
            "first failing request, middleware warm_up=False: worst /health latency",
            lazy["worst"], "ms",
            note=first_note(lazy, "informational: the first failure imports the SDK"),
        ),
        row(
            f"burst of {burst} failing requests, hanging model, timeout {timeout:g}s: "
            "p95 recovery time",
            _p95(times), "s", target=f"<= {timeout + 1:g} s",
            note=f"fresh server, single_flight=False; median {statistics.median(times):.2f}s, "
            f"max {times[-1]:.2f}s, statuses {many['statuses']}",
        ),
        row(
            f"burst of {burst} failing requests: each recovery inside the server "
            "(failure to outcome), max",
            max(inside) if inside else float("nan"), "s", target=f"<= {timeout + 1:g} s",
            note=f"{len(inside)} recoveries reported; p95 "
            f"{_p95(inside) if inside else float('nan'):.2f}s; the client's time above adds "
            "the wait for the loop to reach the failure and to send the 500",
        ),
        row(
            f"burst of {burst} failing requests: worst /health latency", many["worst"] * 1000,
            "ms", target=STALL_TARGET,
            note=f"{many['polls']} health checks; worst before the burst "
            f"{many['quiet'] * 1000:.1f} ms; the SDK sessions run on the agent loop's thread; "
            f"{burst} agent sessions alive at once",
        ),
        row(
            f"burst of {burst} failing requests: worst /health latency, crashoverride vs the "
            "same app without it",
            many["worst"] * 1000, "ms", baseline=bare["worst"] * 1000,
            note=f"contrast: the bare app answers the burst's 500s at once; what uvicorn and "
            f"Starlette cost the loop for {burst} requests arriving together is in both",
        ),
        row(
            f"burst of {burst} failing requests, default limits (4 agent runs at a time): "
            "worst /health latency",
            limited["worst"] * 1000, "ms",
            note=f"informational; single_flight=False, the others wait for a slot within their "
            f"budget; p95 recovery {_p95(limited['times']):.2f}s, statuses "
            f"{limited['statuses']}; {limited['polls']} health checks",
        ),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=8.0)
    parser.add_argument(
        "--repeats", type=int, default=5, help="fresh servers per first-failure row"
    )
    parser.add_argument("--mock", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--serve", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-url", help=argparse.SUPPRESS)
    parser.add_argument("--durations", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mock:
        _mock(args.mock)
    elif args.serve:
        _serve(args.serve, args.fd, args.model_url, args.timeout, args.burst, args.durations)
    else:
        print(format_table(run(args.burst, args.timeout, args.repeats)))


if __name__ == "__main__":
    main()
