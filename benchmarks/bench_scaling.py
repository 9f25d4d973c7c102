"""Costs that stay flat as the failure gets bigger: one thing varied at a time.

A give-up ``with`` recovery against the loopback ``MockServer`` (the SDK already imported, one
recovery done first), with one aspect of the failure grown from small to huge:

* depth: the stack under the protected block, 10 frames to a ``RecursionError`` (~1,000);
* locals: the number of locals of the protected function, 10 to 10,000;
* bytes / list / repr: one local of 1 KB to 256 MB: a ``bytes``, a ``list`` (``[0] * n``, 8
  bytes an item) and an object whose ``repr`` renders all the data it holds (a naive container;
  pandas bounds its own repr, this one does not). Its repr is not called past a size the
  library estimates from the object's attributes (``_security.bounded``); a ``__repr__`` that
  makes up a large text from little data (``"x" * self.count``) is application code, called,
  and not bounded;
* secret: one ``str`` local under a secret-looking name (a key file), 1 KB to 16 MB: the
  redactor masks its value wherever it recurs;
* message: the exception's message, 1 KB to 100 MB;
* body: an ASGI request's body (Starlette behind ``CrashOverrideMiddleware``, through httpx's
  ASGI transport), 1 KB to ``max_replay_body`` (4 MB) and past it.

Three figures per point, each point in a fresh interpreter:

* prepare: from the ``raise`` to the first model request arriving at the server: everything
  the library does before the model is asked; the least disturbed of 5 recoveries (the machine
  is shared and loaded; the median is kept in ``scaling.json``);
* request: the bytes of that first request's JSON body;
* peak: the most memory the recovery allocated beyond what the process held before it
  (``tracemalloc``, one more recovery), which leaves the value itself out.

The large values are created, then a ``gc.collect()`` promotes them: a young 256 MB list would
otherwise be traversed by the first collection the recovery's allocations trigger, a cost of
the collector, not of the recovery. Maxima are 256 MB, not 1 GB: the machine these figures come
from is shared. The curves are drawn in ``benchmarks/scaling.svg`` (matplotlib: the ``bench``
extra); the table has one row per aspect.

    python -m benchmarks.bench_scaling [--child ASPECT SIZE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import Row, format_table, row

KB, MB = 1024, 1024 * 1024
ASPECTS: dict[str, tuple[str, list[int]]] = {
    "depth": ("stack depth (frames)", [10, 100, 500, 0]),  # 0: unbounded, a RecursionError
    "locals": ("locals in the frame", [10, 100, 1_000, 10_000]),
    "bytes": ("one bytes local (bytes)", [KB, MB, 16 * MB, 256 * MB]),
    "list": ("one list local (bytes of items)", [KB, MB, 16 * MB, 256 * MB]),
    "repr": ("one local's repr (characters)", [KB, MB, 16 * MB, 256 * MB]),
    "secret": ("one str local named as a secret", [KB, 64 * KB, MB, 16 * MB]),
    "message": ("exception message (characters)", [KB, MB, 16 * MB, 100 * MB]),
    "body": ("ASGI request body (bytes)", [KB, 64 * KB, MB, 4 * MB, 8 * MB]),
}
PREPARE_TARGET = "< 20 ms"
REQUEST_TARGET = "< 64 KB"
RUNS = 5  # recoveries timed per point (BENCH_SCALING_RUNS): the least disturbed is kept
TIMEOUT = 300.0  # the deadline: generous, so a slow point is a figure, not a failure
SVG = Path(__file__).with_name("scaling.svg")
DATA = Path(__file__).with_name("scaling.json")


# --------------------------------------------------------------------- one point (the child)


class _Bulky:
    """A container whose repr shows everything it holds, however much that is."""

    def __init__(self, size: int) -> None:
        self.data = "x" * size

    def __repr__(self) -> str:
        return f"Bulky({self.data})"


def _value(aspect: str, size: int) -> object:
    if aspect == "bytes":
        return b"x" * size
    if aspect == "list":
        return [0] * (size // 8)
    return _Bulky(size)


def _protected(aspect: str, size: int) -> Callable[[Any], None]:
    """A function whose ``with co.handler()`` block fails in the way ``aspect`` varies."""
    if aspect == "locals":
        lines = [f"    v{i} = {i}" for i in range(size)]
        source = "def protected(co):\n" + "\n".join(lines)
        source += "\n    with co.handler():\n        raise ValueError('boom')\n"
        namespace: dict[str, Any] = {}
        exec(compile(source, "<many locals>", "exec"), namespace)
        return namespace["protected"]  # type: ignore[no-any-return]
    if aspect == "depth":

        def down(level: int) -> None:
            if size and level >= size:
                raise ValueError(f"{level} frames down")
            down(level + 1)

        def deep(co: Any) -> None:
            with co.handler():
                down(0)

        return deep
    if aspect == "message":
        message = "m" * size

        def loud(co: Any) -> None:
            with co.handler():
                raise ValueError(message)

        return loud
    if aspect == "secret":
        held = "".join(f"{i:08x}" for i in range(size // 8))

        def keeping(co: Any) -> None:
            private_key = held  # masked wherever it recurs: the redactor learns its value
            with co.handler():
                raise ValueError(f"cannot load a {len(private_key)}-character key")

        return keeping
    value = _value(aspect, size)
    gc.collect()

    def holding(co: Any) -> None:
        big = value  # the one large local
        with co.handler():
            raise ValueError(f"failed next to a {type(big).__name__}")

    return holding


class _Clock:
    """When the model's requests arrive (the server's handler threads call ``_receive``)."""

    def __init__(self) -> None:
        self.began = 0.0
        self.arrivals: list[float] = []

    def start(self) -> None:
        self.arrivals.clear()
        self.began = time.perf_counter()


def _server(clock: _Clock) -> Any:
    from crashoverride.testing import MockServer

    class Timed(MockServer):
        def _receive(self, request: Any) -> Any:
            clock.arrivals.append(time.perf_counter())
            return super()._receive(request)

    return Timed()


def _with_recovery(aspect: str, size: int) -> Callable[[Any, _Clock], None]:
    protected = _protected(aspect, size)

    def once(co: Any, clock: _Clock) -> None:
        clock.start()
        try:
            protected(co)
        except (ValueError, RecursionError):
            return
        raise RuntimeError("the recovery did not re-raise")

    return once


def _body_recovery(size: int) -> Callable[[Any, _Clock], None]:
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    payload = b"b" * size
    apps: dict[int, Any] = {}

    def app_for(co: Any, clock: _Clock) -> Any:
        async def upload(request: Request) -> PlainTextResponse:
            body = await request.body()
            clock.start()
            raise LookupError(f"cannot parse {len(body)} bytes")

        app = Starlette(routes=[Route("/upload", upload, methods=["POST"])])
        app.add_middleware(CrashOverrideMiddleware, crash_override=co, warm_up=False)
        return app

    def once(co: Any, clock: _Clock) -> None:
        app = apps.setdefault(id(co), app_for(co, clock))

        async def post() -> int:
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                response = await client.post("/upload", content=payload)
            return response.status_code

        status = asyncio.run(post())
        if status != 500:
            raise RuntimeError(f"expected the original 500, got {status}")

    return once


def child(aspect: str, size: int) -> dict[str, Any]:
    import agents  # noqa: F401  (the SDK already imported, as in a warmed-up server)
    import structlog

    from crashoverride.testing import give_up

    # An application's decision (the library never configures structlog): events are dropped,
    # so the figures do not measure a terminal.
    structlog.configure(processors=[], logger_factory=structlog.ReturnLoggerFactory())

    clock = _Clock()
    with _server(clock) as server:
        co = server.crash_override(timeout=TIMEOUT, breaker_threshold=10**9)
        server.serve([give_up("benchmark")] * 100)
        # The first recovery of the process imports the run machinery: not what is measured.
        _with_recovery("locals", 1)(co, clock)
        once = _body_recovery(size) if aspect == "body" else _with_recovery(aspect, size)
        gc.collect()
        times, sizes = [], []
        runs = int(os.environ.get("BENCH_SCALING_RUNS", RUNS))
        for _ in range(runs):
            seen = len(server.requests)
            once(co, clock)
            if not clock.arrivals:  # the deadline came before the model was asked
                raise RuntimeError(f"no model request within {TIMEOUT:g}s")
            times.append((clock.arrivals[0] - clock.began) * 1000)
            sizes.append(len(json.dumps(server.requests[seen].body)))
        gc.collect()
        tracemalloc.start()
        held = tracemalloc.get_traced_memory()[0]
        once(co, clock)
        peak = tracemalloc.get_traced_memory()[1] - held
        tracemalloc.stop()
    return {
        "prepare_ms": min(times),
        "prepare_median_ms": statistics.median(times),
        "request": max(sizes),
        "peak": peak,
    }


# -------------------------------------------------------------------------- all the points


def _point(aspect: str, size: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_scaling", "--child", aspect, str(size)],
        capture_output=True, text=True, env=env, timeout=900,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{aspect} {size}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _size(aspect: str, size: int) -> str:
    if aspect == "depth":
        return "RecursionError" if size == 0 else f"{size} frames"
    if aspect == "locals":
        return f"{size} locals"
    for unit, scale in (("MB", MB), ("KB", KB)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def measure(aspects: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for aspect in aspects or list(ASPECTS):
        points = []
        for size in ASPECTS[aspect][1]:
            print(f"   {aspect} {_size(aspect, size)}", file=sys.stderr, flush=True)
            try:
                points.append({"size": size, **_point(aspect, size)})
            except (RuntimeError, subprocess.TimeoutExpired) as problem:
                print(f"   {aspect} {_size(aspect, size)}: {problem}", file=sys.stderr)
                break  # larger sizes would fail the same way, later
        results[aspect] = points
    return results


def plot(results: dict[str, list[dict[str, Any]]], path: Path = SVG) -> bool:
    """Draw the curves (one column per aspect: prepare, request, peak); False: no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    metrics = [
        ("prepare_ms", "prepare (ms)", 20.0),
        ("request", "first request (KB)", 64.0),
        ("peak", "peak memory (MB)", None),
    ]
    aspects = list(results)
    fig, axes = plt.subplots(
        len(metrics), len(aspects), figsize=(3.0 * len(aspects), 7.5), squeeze=False
    )
    for column, aspect in enumerate(aspects):
        points = results[aspect]
        xs = list(range(len(points)))
        labels = [_size(aspect, p["size"]).replace(" frames", "").replace(" locals", "")
                  for p in points]  # fmt: skip
        for line, (key, title, goal) in enumerate(metrics):
            ax = axes[line][column]
            scale = {"request": 1 / KB, "peak": 1 / MB}.get(key, 1.0)
            ax.plot(xs, [p[key] * scale for p in points], marker="o")
            if goal is not None:
                ax.axhline(goal, color="tab:red", linestyle="--", linewidth=0.8)
            ax.set_ylim(bottom=0)
            ax.set_xticks(xs, labels, fontsize=7, rotation=20)
            ax.tick_params(axis="y", labelsize=7)
            if column == 0:
                ax.set_ylabel(title, fontsize=8)
            if line == 0:
                ax.set_title(ASPECTS[aspect][0], fontsize=9)
    fig.suptitle("A give-up recovery as the failure grows (dashed: the goal)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return True


def rows(results: dict[str, list[dict[str, Any]]]) -> list[Row]:
    out = []
    for aspect, points in results.items():
        if not points:
            continue
        first, last = points[0], points[-1]
        curve = ", ".join(
            f"{_size(aspect, p['size'])}: {p['prepare_ms']:.1f} ms / {p['request'] / KB:.1f} KB / "
            f"{p['peak'] / MB:.1f} MB"
            for p in points
        )
        out.append(
            row(
                f"scaling, {ASPECTS[aspect][0]}: prepare at {_size(aspect, last['size'])}",
                last["prepare_ms"], "ms", baseline=first["prepare_ms"], target=PREPARE_TARGET,
                note=f"baseline: {_size(aspect, first['size'])}; prepare / request / peak: "
                f"{curve}",
            )
        )  # fmt: skip
    largest = max((p["request"] for points in results.values() for p in points), default=0)
    out.append(
        row("scaling: largest first model request, every aspect and size", largest / KB, "KB",
            target=REQUEST_TARGET, note=f"curves: {SVG.name}")
    )  # fmt: skip
    return out


def run() -> list[Row]:
    results = measure()
    DATA.write_text(json.dumps(results, indent=1) + "\n")
    plot(results)
    return rows(results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--child", nargs=2, metavar=("ASPECT", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--aspects", nargs="*", choices=list(ASPECTS))
    parser.add_argument("--json", type=Path, help="write the points here (default: not kept)")
    parser.add_argument("--svg", type=Path, help="draw the curves here")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    results = measure(args.aspects)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.svg:
        plot(results, args.svg)
    print(format_table(rows(results)))


if __name__ == "__main__":
    main()
