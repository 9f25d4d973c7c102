"""Requests per second through uvicorn: the bare app vs the app behind ``CrashOverrideMiddleware``,
behind sentry-sdk's integration, and behind both, measured side by side in one run.

Five uvicorn processes serve the same small Starlette JSON endpoint (``_asgi_servers``: what
each one adds, and how Sentry is configured, with its DSN pointing at a local sink). No request
fails, so this is the cost every healthy request pays. wrk drives every server at the same time
(see ``measure`` for why); where wrk is not installed, a keep-alive client on raw asyncio does,
and every row says so (``_load``).

The figure compared is requests per CPU second of the server process, every thread counted:
the requests per second the server sustains when it has one CPU to itself. Counting CPU rather
than wall time keeps the comparison fair while the servers share one CPU (the scheduler shares
it by thread, so Sentry's transport thread would otherwise win its process a larger share) and
while other processes load the machine.

    python -m benchmarks.bench_asgi [--repeats 7] [--seconds 2] [--connections 32] [--mode ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import _asgi_servers, _load
from benchmarks._asgi_servers import KINDS, Process
from benchmarks._common import Row, format_table, row

TARGET = ">= 0.95"
_PROJECT = {kind: str(i) for i, kind in enumerate(KINDS, 1)}  # each server's DSN project id
_SENTRY = ("sentry", "sentry-errors", "both")


@contextmanager
def _pinned() -> Iterator[int | None]:
    """One CPU for the servers (the scheduler then splits it between them), the others for
    this process and what it starts (load generators, the sink); restored afterwards, so the
    benchmarks run after this one keep every CPU."""
    if not hasattr(os, "sched_getaffinity"):
        yield None
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield None
        return
    os.sched_setaffinity(0, set(cpus[1:]))
    try:
        yield cpus[0]
    finally:
        os.sched_setaffinity(0, set(cpus))


def _settler(sink: Process) -> Any:
    def settle() -> None:
        # Until the sink has heard nothing new for 0.3 s (at most 10 s): Sentry's transport
        # thread sends what the requests queued after they were answered.
        deadline = time.monotonic() + 10
        last = _asgi_servers.received(sink)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = _asgi_servers.received(sink)
            if now == last:
                return
            last = now

    return settle


def measure(
    repeats: int = 7,
    seconds: float = 2.0,
    connections: int = 32,
    mode: str = "concurrent",
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """Per server: median requests per CPU second (``rate``; per wall second where CPU time
    cannot be read), median requests per wall second (``rps``), and envelopes the sink got per
    request (``envelopes``). ``generator`` is which load generator ran.

    Servers are pinned to one CPU and the load generators to the others (client and server
    migrating between CPUs made single runs swing by +-20%). ``concurrent`` (default) loads
    every server at the same time: load from anything else on the machine hits all alike.
    ``alternating`` loads one at a time, rotating the order every repetition.
    """
    generator = "wrk" if _load.wrk_path() else "python"
    drive = _load.wrk_load if generator == "wrk" else _load.python_load
    with _pinned() as cpu:
        sink = _asgi_servers.sink()
        servers: dict[str, Process] = {}
        try:
            _wait_sink(sink)
            dsn = f"http://bench@127.0.0.1:{sink.port}/"
            for kind in kinds:
                servers[kind] = _asgi_servers.server(kind, cpu, dsn + _PROJECT.get(kind, "0"))
            for server in servers.values():
                server.wait_ready()
            settle = _settler(sink)
            drive(servers, 1.0, connections, settle)  # warm-up: imports, caches, connections
            samples: dict[str, list[_load.Sample]] = {name: [] for name in servers}
            sent: dict[str, int] = dict.fromkeys(servers, 0)
            for i in range(repeats):
                if mode == "concurrent":
                    rounds = [servers]
                else:
                    order = list(servers)[i % len(servers) :] + list(servers)[: i % len(servers)]
                    rounds = [{name: servers[name]} for name in order]
                for subset in rounds:
                    first = _asgi_servers.received(sink)
                    for name, sample in drive(subset, seconds, connections, settle).items():
                        samples[name].append(sample)
                    last = _asgi_servers.received(sink)
                    for name in subset:
                        project = _PROJECT.get(name, "0")
                        sent[name] += last.get(project, 0) - first.get(project, 0)
        finally:
            for server in servers.values():
                server.close()
            sink.close()
    per_cpu = all(s.cpu is not None for values in samples.values() for s in values)
    result: dict[str, Any] = {"generator": generator, "per_cpu": per_cpu}
    for name, values in samples.items():
        requests = sum(s.requests for s in values)
        result[name] = {
            "rate": statistics.median(
                s.requests / (s.cpu if per_cpu and s.cpu else s.wall) for s in values
            ),
            "rps": statistics.median(s.requests / s.wall for s in values),
            "envelopes": sent[name] / requests if requests else 0.0,
        }
    return result


def _wait_sink(sink: Process, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sink.get(b"/count")
            return
        except OSError:
            if time.monotonic() > deadline or sink.proc.poll() is not None:
                raise RuntimeError("the Sentry sink did not start") from None
            time.sleep(0.1)


def measure_direct(calls: int = 5_000, rounds: int = 9) -> dict[str, float]:
    """Median microseconds per request when the app is called directly (no server, no network).

    Stricter than the uvicorn figure: the middleware's cost is not diluted by HTTP parsing.
    """
    apps = {"plain": _asgi_servers.app(False), "protected": _asgi_servers.app(True)}
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
        # CPU time of this thread, like the servers' figures: what other processes take of the
        # machine meanwhile is not counted.
        began = time.thread_time()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        return (time.thread_time() - began) / calls * 1e6

    samples: dict[str, list[float]] = {name: [] for name in apps}
    for i in range(rounds + 1):
        order = list(apps) if i % 2 == 0 else list(reversed(apps))
        for name in order:
            value = asyncio.run(batch(apps[name]))
            if i:  # the first round warms up
                samples[name].append(value)
    return {name: statistics.median(values) for name, values in samples.items()}


_LABELS = {
    "protected": "with CrashOverrideMiddleware",
    "sentry": "with sentry-sdk, tracing (traces_sample_rate=1.0)",
    "sentry-errors": "with sentry-sdk, errors only (no tracing)",
    "both": "with CrashOverrideMiddleware and sentry-sdk (tracing)",
}


def _sentry_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sentry-sdk")
    except PackageNotFoundError:
        return "?"


def run(
    repeats: int = 7, seconds: float = 2.0, connections: int = 32, mode: str = "concurrent"
) -> list[Row]:
    m = measure(repeats, seconds, connections, mode)
    direct = measure_direct()
    plain = m["plain"]
    ratios = {name: m[name]["rate"] / plain["rate"] for name in _LABELS}
    smallest = ratios["protected"] >= max(ratios["sentry"], ratios["sentry-errors"])
    unit = "req/CPU-s" if m["per_cpu"] else "req/s"
    how = (
        f"{m['generator']}{'' if m['generator'] == 'wrk' else ' (wrk not found: a Python client)'}"
        f", {mode}, median of {repeats} x {seconds:g}s, {connections} connections per server, h11"
    )
    rows = []
    for name, label in _LABELS.items():
        note = f"{how}; wall req/s {m[name]['rps']:.0f} vs {plain['rps']:.0f}"
        if name in _SENTRY:
            note += (
                f"; sentry-sdk {_sentry_version()}: the sink received "
                f"{m[name]['envelopes']:.2f} envelopes a request"
            )
            if name != "sentry-errors":
                note += " (one transaction each, less what Sentry dropped under load)"
        if name == "protected":
            note += f"; smallest overhead of the peers (sentry rows below): {smallest}"
        rows.append(
            row(
                f"uvicorn + Starlette JSON endpoint: {label} vs without",
                m[name]["rate"], unit, baseline=plain["rate"],
                target=TARGET if name == "protected" else "", note=note,
            )
        )  # fmt: skip
    # Expressed as requests per second so that, like the uvicorn rows, higher is better.
    rows.append(
        row(
            "Starlette JSON endpoint called directly (no server): with middleware vs without",
            1e6 / direct["protected"], "req/s", baseline=1e6 / direct["plain"],
            note="informational: the middleware's cost undiluted by HTTP parsing",
        )
    )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--mode", choices=("concurrent", "alternating"), default="concurrent")
    parser.add_argument(
        "--kinds",
        help="comma-separated servers to compare instead of the rows (first: the baseline), "
        f"from {', '.join(KINDS + _asgi_servers.EXTRA_KINDS)}",
    )
    args = parser.parse_args(argv)
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
        m = measure(args.repeats, args.seconds, args.connections, args.mode, kinds)
        for kind in kinds:
            rate = m[kind]["rate"]
            print(f"{kind}: {rate:.0f}, ratio {rate / m[kinds[0]]['rate']:.3f} ({m['generator']})")
        return
    print(format_table(run(args.repeats, args.seconds, args.connections, args.mode)))


if __name__ == "__main__":
    main()
