"""A fleet of processes meeting the same bug, with and without ``RedisCoordination``.

* burst: 4 worker processes each meet 50 identical failures at once (asyncio tasks). Each hosts
  its own loopback ``MockServer`` scripted for one agent run, so agent runs are counted where
  they happen. In-process coordination: one agent run per process (4). Fleet: one in all; the
  others apply the leader's signed fix and replay. The agent's work takes ``--work`` seconds
  (0.5 s; real models take longer). Wall time: from the start signal to the last answer.
* overhead: one process, recoveries of distinct failures one after another (each its own
  fingerprint; scripted model, the agent gives up at once): median time per recovery with the
  fleet backend vs in-process. The difference is what coordination adds (Redis round trips,
  helper-thread hops, the lease).
* fallback: the same, with a Redis that stopped answering (SIGSTOP) after the first
  recovery: each recovery waits ``op_timeout`` (0.1 s) for Redis, then goes on in-process.
* silent first connection: a process's FIRST recovery, with a Redis that accepts connections
  and never answers (a socket server of the benchmark's own): the connection attempt goes on
  in the background, the recovery waits ``op_timeout`` for it, then goes on in-process. Each
  sample is a fresh ``CrashOverride`` (a first connection of its own).
* happy path: ``with co.handler()`` with ``coordination=RedisCoordination(...)`` vs
  ``contextlib.suppress`` (target as for the in-process default: <= 1.25x).

Needs a Redis at 127.0.0.1:6379 (database 15 is flushed).

    python -m benchmarks.bench_fleet [--processes 4] [--failures 50] [--work 0.5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import Row, format_table, row

REDIS_URL = "redis://127.0.0.1:6379/15"  # flushed: a database of its own
KEY = "bench-fleet-key-0123456789"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def transform(value: int) -> int:
    raise NotImplementedError("transform")


def _patch(work: float) -> str:
    return (
        f"import anyio\nawait anyio.sleep({work})\n"
        "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
        "rerun()"
    )


def _coordination(mode: str, namespace: str) -> Any:
    if mode == "in-process":
        return None
    from crashoverride import RedisCoordination

    return RedisCoordination(REDIS_URL, namespace=namespace, key=KEY)


# ------------------------------------------------------------------------------------ burst


def _worker(mode: str, namespace: str, failures: int, work: float) -> None:
    """One fleet process: a burst of identical failures; prints agent runs and wall time."""
    import anyio
    import structlog

    from crashoverride import CrashOverride
    from crashoverride.testing import MockServer, done, exec_python

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    with MockServer([exec_python(_patch(work)), done("patched")]) as model:
        co = CrashOverride(
            model="bench", base_url=model.base_url, api_key="sk-bench", timeout=60,
            coordination=_coordination(mode, namespace), breaker_threshold=10**6,
        )  # fmt: skip
        co.warm_up()  # the SDK import is not what this measures

        @co.handler(prompt="Return the transformed value.")
        async def job(i: int) -> int:
            return transform(i)

        async def burst() -> list[int]:
            results: list[int] = []

            async def one(i: int) -> None:
                results.append(await job(i))

            async with anyio.create_task_group() as tg:
                for i in range(failures):
                    tg.start_soon(one, i)
            return results

        print("ready", flush=True)
        sys.stdin.readline()
        began = time.time()
        results = anyio.run(burst)
        ended = time.time()
        runs = sum(
            1 for r in model.requests
            if not any(m.get("role") == "tool" for m in r.body["messages"])
        )  # fmt: skip
    correct = sorted(results) == [i * 10 for i in range(failures)]
    print(json.dumps({"began": began, "ended": ended, "runs": runs, "correct": correct}))


def _burst(mode: str, processes: int, failures: int, work: float) -> dict[str, Any]:
    namespace = f"bench-{os.urandom(4).hex()}"
    command = [sys.executable, "-m", "benchmarks.bench_fleet", "--worker", mode, namespace,
               str(failures), str(work)]  # fmt: skip
    procs = [
        subprocess.Popen(
            command, cwd=_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker did not start")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "runs": sum(r["runs"] for r in reports),
        "wall": max(r["ended"] for r in reports) - min(r["began"] for r in reports),
        "correct": all(r["correct"] for r in reports),
    }


# --------------------------------------------------------------------------------- overhead


def _distinct_failures(count: int) -> list[Any]:
    # Each function lives in a "file" of its own: a fingerprint of its own.
    functions = []
    for i in range(count):
        namespace: dict[str, Any] = {}
        exec(compile("def fail():\n    raise LookupError('x')\n", f"<bench-{i}>", "exec"),
             namespace)  # fmt: skip
        functions.append(namespace["fail"])
    return functions


def _per_recovery_ms(mode: str, count: int, *, url: str = REDIS_URL, stop: Any = None) -> float:
    """Median ms per recovery after the first (which connects); ``stop`` runs after it."""
    from crashoverride import CrashOverride, RedisCoordination
    from crashoverride.testing import give_up, script

    model = script(*[give_up("not this time") for _ in range(count)])
    namespace = f"bench-{os.urandom(4).hex()}"
    fleet = None
    if mode != "in-process":  # retry Redis at every failure: each one meets the dead Redis
        fleet = RedisCoordination(url, namespace=namespace, key=KEY, retry_after=0.001)
    co = CrashOverride(model=model, coordination=fleet, breaker_threshold=10**6)
    samples = []
    for i, fail in enumerate(_distinct_failures(count)):
        if i == 1 and stop is not None:
            stop()
        began = time.perf_counter()
        with contextlib.suppress(LookupError), co.handler(prompt="-"):
            fail()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples[1:])


def _fallback_ms(count: int) -> float:
    """Per recovery, with a Redis that stopped answering (SIGSTOP) after the first one."""
    import shutil
    import signal
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(0.5)
            url = f"redis://127.0.0.1:{port}/0"
            return _per_recovery_ms("fleet", count, url=url,
                                    stop=lambda: server.send_signal(signal.SIGSTOP))  # fmt: skip
        finally:
            server.send_signal(signal.SIGCONT)
            server.kill()
            server.wait(10)


def _silent_first_ms(samples: int) -> float:
    """A first recovery (and so a first connection), with a Redis that never answers."""
    from crashoverride import CrashOverride, RedisCoordination
    from crashoverride.testing import give_up, script
    from tests.fleet.support import close_fleet, silent_redis

    (fail,) = _distinct_failures(1)
    measured = []
    with silent_redis() as server:
        for _ in range(samples):
            fleet = RedisCoordination(server.url, namespace="bench-silent", key=KEY)
            co = CrashOverride(model=script(give_up("not this time")), coordination=fleet)
            began = time.perf_counter()
            with contextlib.suppress(LookupError), co.handler(prompt="-"):
                fail()
            measured.append((time.perf_counter() - began) * 1000)
            close_fleet(co)  # its connection attempt, still going on, is closed
    return statistics.median(measured)


def _happy_rows() -> list[Row]:
    from benchmarks.bench_happy import _sync_rows
    from crashoverride import CrashOverride

    # The same measurement as bench_happy's first row, on an app configured for a fleet.
    measured = _sync_rows(CrashOverride(coordination=_coordination("fleet", "bench-happy")))[0]
    return [row("fleet: happy path, with co.handler() vs contextlib.suppress", measured["value"],
                "ns", baseline=measured["baseline"], target="<= 1.25",
                note="coordination=RedisCoordination: no Redis call")]  # fmt: skip


def run(processes: int = 4, failures: int = 50, work: float = 0.5) -> list[Row]:
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    local = _burst("in-process", processes, failures, work)
    fleet = _burst("fleet", processes, failures, work)
    if not (local["correct"] and fleet["correct"]):
        raise RuntimeError(f"wrong results: in-process {local}, fleet {fleet}")
    shape = f"{processes} processes x {failures} identical failures"
    from structlog.testing import capture_logs

    with capture_logs():  # the events of 80 recoveries are not what this measures
        overhead = {mode: _per_recovery_ms(mode, 40) for mode in ("in-process", "fleet")}
        stopped = _fallback_ms(12)
        silent = _silent_first_ms(7)
    redis.Redis.from_url(REDIS_URL).flushdb()
    return [
        row(f"fleet burst ({shape}): agent runs, Redis vs in-process", fleet["runs"], "runs",
            baseline=local["runs"], target="1 run",
            note="counted at each process's mock model"),
        row(f"fleet burst ({shape}): wall time, Redis vs in-process", fleet["wall"], "s",
            baseline=local["wall"], note=f"agent work {work:g}s; every answer correct"),
        row("fleet: time per recovery (scripted give-up), Redis vs in-process",
            overhead["fleet"], "ms", baseline=overhead["in-process"],
            note=f"coordination adds {overhead['fleet'] - overhead['in-process']:.2f} ms"),
        row("fleet: time per recovery with Redis stopped (SIGSTOP), vs in-process", stopped,
            "ms", baseline=overhead["in-process"], target="fallback ~100 ms",
            note=f"falls back in-process after {stopped - overhead['in-process']:.0f} ms "
                 "(op_timeout 0.1 s)"),
        row("fleet: Redis that accepts but never answers, first connection, vs in-process",
            silent, "ms", baseline=overhead["in-process"], target="fallback ~100 ms",
            note=f"falls back after {silent - overhead['in-process']:.0f} ms (op_timeout "
                 "0.1 s, connecting included)"),
        *_happy_rows(),
    ]  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        raise SystemExit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--failures", type=int, default=50)
    parser.add_argument("--work", type=float, default=0.5)
    options = parser.parse_args()
    print(format_table(run(options.processes, options.failures, options.work)))
