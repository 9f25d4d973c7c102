"""A fleet of real processes on a real Redis: uvicorn workers, plain workers, a Celery pool.

The model is ``MockServer`` in a process of its own (see ``fleet_procs``); agent runs are
counted there, across the whole fleet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.fleet.support import clean, fleet_redis, free_port, new_namespace
from tests.helpers import wait_for
from tests.integrations.fleet_procs import agent_runs

ROOT = Path(__file__).resolve().parents[2]
HERE = [sys.executable, "-m", "tests.integrations.fleet_procs"]
CHECKOUT = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout's package and tests


class Mock:
    """The model process: its base URL now, the requests it served once it is closed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.url = proc.stdout.readline().strip()
        self.lines: list[str] = []
        self.pump = lines_of(proc.stdout, self.lines)
        self.requests: list[Any] = []

    def wait_served(self, count: int) -> None:
        served = f'{{"served": {count}}}\n'
        wait_for(lambda: served in self.lines, 30, f"the model being asked {count} time(s)")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)
            self.pump.join(10)
            self.requests = json.loads(self.lines[-1])["requests"]
        stop(self.proc, self.pump)


@contextmanager
def mock_model(scenario: str) -> Iterator[Mock]:
    proc = subprocess.Popen([*HERE, "mock", scenario], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    mock = Mock(proc)
    try:
        yield mock
    finally:
        mock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@contextmanager
def fleet_db() -> Iterator[str]:
    """The fleet database; on the way out, every key of the namespaces this test used."""
    used: list[str] = []
    with fleet_redis() as url:
        USED[url] = used
        try:
            yield url
        finally:
            for namespace in used:
                clean(url, namespace)


USED: dict[str, list[str]] = {}


def fleet_env(mock: Mock, url: str, **extra: str) -> dict[str, str]:
    namespace = new_namespace()
    USED[url].append(namespace)
    return {**os.environ, "FLEET_MODEL_URL": mock.url, "FLEET_REDIS_URL": url,
            "FLEET_NS": namespace, "PYTHONPATH": CHECKOUT, **extra}  # fmt: skip


def stop(proc: subprocess.Popen[Any], *pumps: threading.Thread) -> None:
    """Stop ``proc``, let its output pumps reach the end, close its pipes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pump in pumps:
        pump.join(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def lines_of(stream: Any, sink: list[str]) -> threading.Thread:
    """Collect a process's output lines in the background (pipes must never fill up)."""

    def pump() -> None:
        for line in stream:
            sink.append(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


# ----------------------------------------------------------------------- uvicorn --workers 4


async def _burst(port: int, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                 timeout=60) as client:  # fmt: skip
        responses: list[httpx.Response] = []

        async def one() -> None:
            responses.append(await client.get("/price", params={"item": "apple"}))

        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
    return responses


def test_uvicorn_workers_run_one_agent_for_200_identical_failures() -> None:
    with fleet_db() as url, mock_model("asgi") as mock:
        env = fleet_env(mock, url)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory",
             "tests.integrations.fleet_procs:create_app", "--workers", "4", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "info", "--no-access-log"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        log: list[str] = []
        pump = lines_of(server.stderr, log)
        try:
            deadline = time.monotonic() + 30
            while sum("Application startup complete" in line for line in log) < 4:
                assert server.poll() is None and time.monotonic() < deadline, "".join(log)
                time.sleep(0.05)
            responses = anyio.run(_burst, port, 200)
        finally:
            stop(server, pump)
        assert [r.status_code for r in responses] == [200] * 200
        assert all(r.json() == {"item": "apple", "price": 3} for r in responses)
        # A process started after the fix: the stored record repairs it, no model call.
        assert _later_process(env) == "200 {'item': 'pear', 'price': 5}"
        mock.wait_served(3)
        # The same with the stored record tampered with: refused and logged, the agent runs
        # (and, the model's script being spent, the request fails as it would have).
        _tamper(url, env["FLEET_NS"])
        logged = _later_process({**env, "FLEET_LOG": "1"}, lines=True)
        mock.close()
    assert agent_runs(mock.requests[:3]) == 1  # fleet-wide, for 200 failures and a later process
    assert agent_runs(mock.requests) == 2  # the tampered record's process had to ask the model
    (refused,) = [json.loads(line) for line in logged if '"fleet.fix_refused"' in line]
    assert "bad signature" in refused["reason"]
    assert logged[-1].split()[0] == "500"


def _later_process(env: dict[str, str], *, lines: bool = False) -> Any:
    done = subprocess.run(
        [sys.executable, "-c",
         "from starlette.testclient import TestClient\n"
         "from tests.integrations.fleet_procs import create_app\n"
         "with TestClient(create_app(), raise_server_exceptions=False) as client:\n"
         "    answer = client.get('/price', params={'item': 'pear'})\n"
         "    print(answer.status_code, answer.json() if answer.status_code == 200 else '')\n"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = done.stdout.strip().splitlines()
    return output if lines else output[-1]


def _tamper(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        (name,) = client.keys(f"co:{namespace}:*:fix")
        envelope = json.loads(client.get(name) or b"")
        envelope["record"]["targets"][0]["source"] = "def read_price(item):\n    return 0\n"
        client.set(name, json.dumps(envelope))
    finally:
        client.close()


# --------------------------------------------------------------- the leader dies mid-recovery


def test_a_killed_leader_is_taken_over_within_the_lease_plus_one_second() -> None:
    lease = 2.0
    with fleet_db() as url, mock_model("kill") as mock:
        env = fleet_env(mock, url, FLEET_LEASE=str(lease))
        workers = [
            subprocess.Popen(
                [*HERE, "worker", str(i)],
                cwd=ROOT,
                env=env,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for i in range(1, 4)
        ]
        outputs: dict[int, list[str]] = {}
        pumps: dict[int, threading.Thread] = {}
        try:
            for worker in workers:
                assert worker.stdout is not None and worker.stdin is not None
                json.loads(worker.stdout.readline())  # ready
                outputs[worker.pid] = []
                pumps[worker.pid] = lines_of(worker.stdout, outputs[worker.pid])
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            leader = _wait_for_event(outputs, "recovery.started")
            mock.wait_served(1)  # the leader is asking the model (which never answers it)
            killed_at = time.time()
            os.kill(leader, signal.SIGKILL)
            results = {}
            for worker in workers:
                if worker.pid != leader:
                    worker.wait(40)
                    results[worker.pid] = _last(outputs[worker.pid], "result")
        finally:
            for worker in workers:
                stop(worker, *[pumps[worker.pid]] if worker.pid in pumps else [])
        mock.close()
    events = [json.loads(line) for lines in outputs.values() for line in lines
              if '"event"' in line]  # fmt: skip
    (takeover,) = [e for e in events if e["event"] == "fleet.lease_taken" and e["takeover"]]
    assert takeover["pid"] != leader
    assert takeover["t"] - killed_at <= lease + 1.0
    values = sorted(results.values())
    assert len(values) == 2 and all(isinstance(v, int) and v % 10 == 0 for v in values), results
    assert agent_runs(mock.requests) == 2  # the dead leader's and the one that took over


def _wait_for_event(outputs: dict[int, list[str]], name: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid, lines in outputs.items():
            if any(f'"event": "{name}"' in line for line in list(lines)):
                return pid
        time.sleep(0.02)
    raise AssertionError(f"no process emitted {name}: {outputs}")


def _last(lines: list[str], key: str) -> Any:
    for line in reversed(lines):
        if line.startswith("{") and f'"{key}"' in line:
            return json.loads(line)[key]
    raise AssertionError(f"no {key} in {lines}")


# ----------------------------------------------------------------------- Celery prefork pool


def test_a_celery_prefork_pool_runs_one_agent_for_40_identical_failures() -> None:
    with fleet_db() as url, mock_model("celery") as mock:
        env = fleet_env(mock, url, FLEET_CELERY="1", FLEET_BROKER_URL=url)
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.integrations.fleet_procs", "worker",
             "--pool", "prefork", "--concurrency", "4", "-Q", env["FLEET_NS"], "--loglevel",
             "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        log: list[str] = []
        pump = lines_of(worker.stderr, log)
        try:
            results = _celery_results(url, env["FLEET_NS"], 40)
        finally:
            stop(worker, pump)
        mock.close()
    assert results == [i * 10 for i in range(40)], "".join(log)[-3000:]
    assert agent_runs(mock.requests) == 1 and len(mock.requests) == 2


def _celery_results(url: str, queue: str, count: int) -> list[Any]:
    from celery import Celery

    client = Celery("fleet-client", broker=url, backend=url)
    client.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    try:
        sent = [client.send_task("fleet.transform", args=(i,)) for i in range(count)]
        results = [result.get(timeout=60, propagate=False) for result in sent]
        for result in sent:
            result.forget()
        return results
    finally:
        consumer = getattr(client.backend, "result_consumer", None)
        if consumer is not None:
            consumer.stop()
        client.backend.client.connection_pool.disconnect()
        client.close()


# --------------------------------------------------------------------------------- fork


FORKED = """
import json, os, sys
import structlog
structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
from crashoverride import CrashOverride, RedisCoordination
from crashoverride.testing import done, exec_python, script

def first(value):
    raise LookupError("first")

def second(value):
    raise LookupError("second")

fix = "replace_function({name}, 'def {name}(value):\\\\n    return value + 1\\\\n')\\nrerun()"
model = script(exec_python(fix.format(name="first")), done(),
                 exec_python(fix.format(name="second")), done())
fleet = RedisCoordination(sys.argv[1], namespace=sys.argv[2], key="k" * 16, op_timeout=1.0)
co = CrashOverride(model=model, coordination=fleet)
call_first, call_second = co.handler()(first), co.handler()(second)
assert call_first(1) == 2  # the parent's helper thread and client exist now
pid = os.fork()
if pid == 0:  # the child (gunicorn --preload, a prefork pool): a thread and client of its own
    value = call_second(10)
    print(json.dumps({"child": value}), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": status}), flush=True)
"""


def test_a_forked_child_coordinates_through_a_client_of_its_own() -> None:
    with fleet_db() as url:
        namespace = new_namespace()
        USED[url].append(namespace)
        done = subprocess.run(
            [sys.executable, "-c", FORKED, url, namespace], cwd=ROOT, capture_output=True,
            text=True, timeout=60, env={**os.environ, "PYTHONPATH": CHECKOUT},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines == [{"child": 11}, {"status": 0}]
