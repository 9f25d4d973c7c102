"""A fleet at the size users run: 8 processes sharing Redis (then a Redis Cluster), each hit by
a burst of identical failures at once.

The fleet is 8 plain worker processes (``python -m benchmarks.bench_fleet_scale --worker``),
not uvicorn workers: the benchmark must start every burst at the same moment, which a go line
on each worker's stdin does exactly. Each worker hosts a loopback ``MockServer`` scripted for
agent runs, so runs are counted where they happen, and meets ``--failures`` identical failures
(asyncio tasks) per burst. Each burst is a new failure (``transform_<k>``, a fingerprint of its
own), so the fleet starts from nothing every time; the first burst only connects and warms up,
and is left out. The agent's work takes ``--work`` seconds (0.5 s).

Redis is a server of the benchmark's own (a private ``redis-server`` on a free port; then a
3-master Cluster, no replicas, ``cluster=True``), so no other client's commands are counted and
nothing else is flushed. Each worker names its connections (``?client_name=w3`` in its URL:
redis-py sends ``CLIENT SETNAME`` on each new connection).

Measured:

* agent runs fleet-wide, per burst (goal: 1).
* propagation: from the leader's fix record published to the fix applied in every other
  process. "Published" is when Redis executed the leader's ``LAND`` script (which stores the
  record and publishes the outcome), as ``MONITOR`` timestamps it (the server's clock: Redis
  7 feeds a command to MONITOR after running it); "applied" is the ``fleet.fix_applied`` event
  in each worker (``time.time()``, the same clock on one machine). It covers the outcome's
  delivery, the waiter's read of the record, its signature check, the new code compiled and
  put in place. Per burst, the slowest of the 7 (the fix "in all 8 processes": the leader has
  it already); p50/p95 over the bursts (goal p95 < 100 ms on loopback).
* Redis commands per burst, for the leader's process and for a waiter's (median of the 7):
  every command ``MONITOR`` shows from that process's named connections (an ``EVAL`` counts
  one; its script's own commands, ``[lua]`` in MONITOR, are not the client's and are counted
  apart; in a Cluster, MONITOR on every node). Connection set-up (``CLIENT SETNAME``/``SETINFO``,
  ``SELECT``, a Cluster client's ``CLUSTER SLOTS``...) is shown apart: a waiter opens a
  connection of its own to subscribe, each time. The process's other failures of the burst
  join its own leader and send nothing.
* waiters' added latency: when a waiter process's first unit got its answer (the one that
  waited in Redis, replayed through the applied fix), minus when the leader's agent run ended
  (its ``recovery.succeeded``), over every waiter and burst: p50/p95 (goal < 5 ms). Also shown:
  the same for each waiter process's last unit, after its other failures of the burst replayed
  too (on a machine with fewer cores than processes, those replays contend for them).

Needs ``redis-server`` and ``redis-cli`` (7+) on PATH.

    python -m benchmarks.bench_fleet_scale [--processes 8] [--failures 25] [--bursts 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import Row, format_table, row
from benchmarks.fleet_servers import Monitor, redis_cluster, redis_server

KEY = "bench-fleet-key-0123456789"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BURSTS = 200
# Every burst meets a function of its own: a new fingerprint, nothing stored for it yet.
for _k in range(MAX_BURSTS):
    exec(compile(f"def transform_{_k}(value):\n    raise NotImplementedError('transform')\n",
                 f"<{__name__}>", "exec"), globals())  # fmt: skip
# Generic: ``k`` is the failed call's local (the agent's namespace sees the caller's locals).
PATCH = (
    "import anyio\nawait anyio.sleep({work})\n"
    "replace_function(globals()[f'transform_{{k}}'],\n"
    "                 f'def transform_{{k}}(value):\\n    return value * 10\\n')\n"
    "rerun()"
)
WATCHED = ("fleet.fix_applied", "fleet.fix_published", "coordination.degraded", "run.ended")
SETUP = ("CLIENT", "SELECT", "CLUSTER", "COMMAND", "HELLO", "READONLY", "PING")


# ----------------------------------------------------------------------------------- worker


def _worker(url: str, cluster: bool, namespace: str, bursts: int, failures: int,
            work: float, op_timeout: float) -> None:  # fmt: skip
    """One process of the fleet: a burst per go line; a JSON report line per burst."""
    import anyio
    import structlog

    from crashoverride import CrashOverride, RedisCoordination
    from crashoverride.testing import MockServer, done, exec_python

    seen: list[tuple[str, float]] = []

    def stamp(_: Any, __: str, event: dict[str, Any]) -> Any:
        name = event["event"]
        if name == "recovery.succeeded" and event.get("fleet_role") == "leader":
            name = "run.ended"  # the leader's agent run and its verdict are over
        if name in WATCHED:
            seen.append((name, time.time()))
        raise structlog.DropEvent

    structlog.configure(processors=[stamp], logger_factory=structlog.ReturnLoggerFactory())
    module = sys.modules[__name__]
    steps = [exec_python(PATCH.format(work=work)), done("patched")] * bursts
    with MockServer(steps) as model:
        co = CrashOverride(
            model="bench", base_url=model.base_url, api_key="sk-bench", timeout=60,
            coordination=RedisCoordination(url, cluster=cluster, namespace=namespace, key=KEY,
                                           op_timeout=op_timeout),
            breaker_threshold=10**6,
        )  # fmt: skip
        co.warm_up()  # the SDK import is not what this measures

        @co.handler(prompt="Return the transformed value.")
        async def job(k: int, i: int) -> int:
            return int(getattr(module, f"transform_{k}")(i))

        async def burst(k: int) -> list[tuple[float, bool]]:
            answers: list[tuple[float, bool]] = []

            async def one(i: int) -> None:
                value = await job(k, i)
                answers.append((time.time(), value == i * 10))

            async with anyio.create_task_group() as tg:
                for i in range(failures):
                    tg.start_soon(one, i)
            return answers

        print("ready", flush=True)
        for line in sys.stdin:
            k = int(line)
            seen.clear()
            served = len(model.requests)
            began = time.time()
            answers = anyio.run(burst, k)
            runs = sum(1 for r in model.requests[served:]
                       if not any(m.get("role") == "tool" for m in r.body["messages"]))  # fmt: skip
            report = {"began": began, "first": min(t for t, _ in answers),
                      "last": max(t for t, _ in answers), "runs": runs,
                      "correct": all(ok for _, ok in answers), "events": seen}  # fmt: skip
            print(json.dumps(report), flush=True)


# ----------------------------------------------------------------------------------- runner


def _fleet(urls: tuple[str, list[int]], cluster: bool, processes: int, failures: int,
           bursts: int, work: float, op_timeout: float) -> dict[str, Any]:  # fmt: skip
    """Start the fleet, run ``bursts`` + 1 bursts (the first warms up), return the figures."""
    url, ports = urls
    namespace = f"bench-{os.urandom(4).hex()}"
    names = [f"w{i}" for i in range(processes)]
    with Monitor(ports) as monitor:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.bench_fleet_scale",
                    "--worker",
                    f"{url}?client_name={name}",
                    str(int(cluster)),
                    namespace,
                    str(bursts + 1),
                    str(failures),
                    str(work),
                    str(op_timeout),
                ],
                cwd=_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in names
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError("a worker did not start")
            reports: list[dict[str, Any]] = []
            for k in range(bursts + 1):
                for proc in procs:
                    assert proc.stdin is not None
                    proc.stdin.write(f"{k}\n")
                    proc.stdin.flush()
                burst = {}
                for name, proc in zip(names, procs, strict=True):
                    assert proc.stdout is not None
                    burst[name] = json.loads(proc.stdout.readline())
                reports.append(burst)
                # The burst's tail (the leader's last calls) ends before the next. After the
                # first, which connects, a process that fell back in-process then (a first
                # connection slower than op_timeout) leaves Redis alone for retry_after (5 s):
                # that is not what the measured bursts are about.
                time.sleep(0.3 if k else 5.5)
        finally:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.close()
            for proc in procs:
                proc.wait(60)
        commands = monitor.stop()
    return _figures(reports[1:], commands, names)


def _figures(reports: list[dict[str, Any]], commands: list[dict[str, Any]],
             names: list[str]) -> dict[str, Any]:  # fmt: skip
    runs, spread, added, added_last, degraded = [], [], [], [], 0
    leader_cmds: list[tuple[int, int, int]] = []
    waiter_cmds: list[tuple[int, int, int]] = []
    correct = True
    starts = [min(r["began"] for r in burst.values()) for burst in reports] + [float("inf")]
    for index, burst in enumerate(reports):
        correct = correct and all(r["correct"] for r in burst.values())
        runs.append(sum(r["runs"] for r in burst.values()))
        degraded += sum(1 for r in burst.values() for e, _ in r["events"]
                        if e == "coordination.degraded")  # fmt: skip
        leaders = [name for name, r in burst.items() if r["runs"]]
        if len(leaders) != 1:
            continue  # no single leader: counted in the runs row, not timed
        (leader,) = leaders
        window = [c for c in commands if starts[index] <= c["time"] < starts[index + 1]]
        lands = [c["time"] for c in window if c["name"] == leader and c["land"]]
        per_process = {name: _count(window, name) for name in names}
        leader_cmds.append(per_process[leader])
        waiter_cmds.extend(per_process[name] for name in names if name != leader)
        ended = [t for e, t in burst[leader]["events"] if e == "run.ended"]
        applied = [t for name, r in burst.items() if name != leader
                   for e, t in r["events"] if e == "fleet.fix_applied"]  # fmt: skip
        if lands and len(applied) == len(names) - 1:
            spread.append((max(applied) - lands[0]) * 1000)
        others = [r for name, r in burst.items() if name != leader]
        added.extend((r["first"] - ended[0]) * 1000 for r in others if ended)
        added_last.extend((r["last"] - ended[0]) * 1000 for r in others if ended)
    return {"runs": runs, "spread": spread, "added": added, "added_last": added_last,
            "leader": leader_cmds,
            "waiter": waiter_cmds, "degraded": degraded, "correct": correct}  # fmt: skip


def _count(window: list[dict[str, Any]], name: str) -> tuple[int, int, int]:
    """(fleet commands, connection set-up commands, script commands) of one process."""
    mine = [c for c in window if c["name"] == name]
    setup = sum(1 for c in mine if c["command"] in SETUP)
    return len(mine) - setup, setup, sum(c["lua"] for c in mine)


def _median(values: list[int]) -> float:
    return statistics.median(values) if values else float("nan")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _rows(label: str, found: dict[str, Any], shape: str) -> list[Row]:
    if not found["correct"]:
        raise RuntimeError(f"{label}: a unit got a wrong answer")
    spread, added, last = found["spread"], found["added"], found["added_last"]
    lead = [_median([c[i] for c in found["leader"]]) for i in range(3)]
    wait = [_median([c[i] for c in found["waiter"]]) for i in range(3)]
    bursts = len(found["runs"])
    return [
        row(f"fleet at scale ({shape}, {label}): agent runs per burst, fleet-wide",
            max(found["runs"]), "runs", target="1 run",
            note=f"most of {bursts} bursts (each: {sorted(set(found['runs']))}); "
                 f"{found['degraded']} degraded recoveries"),
        row(f"fleet at scale ({shape}, {label}): fix published -> applied in all processes, p95",
            _pct(spread, 0.95), "ms", target="< 100 ms",
            note=f"p50 {_pct(spread, 0.5):.1f} ms, max {max(spread, default=float('nan')):.1f}"
                 f" ms; {len(spread)} bursts; from MONITOR's LAND to each fleet.fix_applied"),
        row(f"fleet at scale ({shape}, {label}): Redis commands per burst, leader's process",
            lead[0], "cmds",
            note=f"+ {lead[1]:.0f} connection set-up; its scripts ran {lead[2]:.0f} more; "
                 "a process's other failures of the burst send none"),
        row(f"fleet at scale ({shape}, {label}): Redis commands per burst, a waiter's process",
            wait[0], "cmds",
            note=f"+ {wait[1]:.0f} connection set-up (a connection to subscribe: HELLO, and "
                 "the benchmark's CLIENT SETNAME); "
                 f"its scripts ran {wait[2]:.0f} more; median of the waiters"),
        row(f"fleet at scale ({shape}, {label}): waiters' added latency beyond the leader, p95",
            _pct(added, 0.95), "ms", target="< 5 ms",
            note=f"p50 {_pct(added, 0.5):.1f} ms; a waiter process's first answer minus the "
                 "end of the leader's run; its last answer (every failure of the burst "
                 f"replayed): p50 {_pct(last, 0.5):.1f} ms, p95 {_pct(last, 0.95):.1f} ms"),
    ]  # fmt: skip


def run(
    processes: int = 8, failures: int = 25, bursts: int = 20, work: float = 0.5,
    op_timeout: float = 0.1,
) -> list[Row]:  # fmt: skip
    shape = f"{processes} processes x {failures} identical failures"
    if op_timeout != 0.1:  # not the default users get
        shape += f", op_timeout {op_timeout:g} s"
    with redis_server() as single:
        alone = _fleet(single, False, processes, failures, bursts, work, op_timeout)
    with redis_cluster() as nodes:
        cluster = _fleet(nodes, True, processes, failures, bursts, work, op_timeout)
    return [*_rows("Redis", alone, shape), *_rows("Redis Cluster, 3 masters", cluster, shape)]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        from benchmarks.bench_fleet_scale import _worker as worker  # the functions' real module

        url, cluster, namespace, bursts, failures, work, op_timeout = sys.argv[2:9]
        worker(
            url,
            cluster == "1",
            namespace,
            int(bursts),
            int(failures),
            float(work),
            float(op_timeout),
        )
        raise SystemExit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--failures", type=int, default=25)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--work", type=float, default=0.5)
    parser.add_argument("--op-timeout", type=float, default=0.1)  # RedisCoordination's default
    options = parser.parse_args()
    shape = (options.processes, options.failures, options.bursts, options.work, options.op_timeout)
    print(format_table(run(*shape)))
