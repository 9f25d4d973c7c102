"""The fleet on a Redis Cluster, across real processes: ``RedisCoordination(url, cluster=True)``.

A 3-master Cluster of the module's own (``topology_servers``), three worker processes of
``fleet_procs`` meeting the same failure at once, and the model in a process of its own that
counts agent runs. What a Cluster changes (the client, every key of a failure in one slot, the
outcome channel published on one node and heard on another) is exercised end to end here; the
other behaviours, against the same kinds of Cluster client, are in
tests/integrations/test_fleet_topologies.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fleet.support import new_namespace
from tests.integrations.fleet_procs import agent_runs
from tests.integrations.test_fleet_processes import (
    CHECKOUT,
    HERE,
    ROOT,
    lines_of,
    mock_model,
    stop,
)
from tests.integrations.topology_servers import redis_cluster


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    with redis_cluster() as url:
        yield url


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{") and '"event"' in line]


def _result(lines: list[str]) -> Any:
    (found,) = [json.loads(line)["result"] for line in lines if line.startswith('{"result"')]
    return found


def test_processes_on_a_cluster_run_one_agent_and_the_others_apply_its_fix(
    cluster_url: str,
) -> None:
    with mock_model("celery") as mock:
        env = {**os.environ, "FLEET_MODEL_URL": mock.url, "FLEET_REDIS_URL": cluster_url,
               "FLEET_NS": new_namespace(), "FLEET_CLUSTER": "1",
               "PYTHONPATH": CHECKOUT}  # fmt: skip
        workers = [
            subprocess.Popen(
                [*HERE, "worker", str(value)],
                cwd=ROOT,
                env=env,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for value in (1, 2, 3)
        ]
        outputs: dict[int, list[str]] = {worker.pid: [] for worker in workers}
        pumps: list[threading.Thread] = []
        try:
            for worker in workers:
                assert worker.stdout is not None
                json.loads(worker.stdout.readline())  # ready
                pumps.append(lines_of(worker.stdout, outputs[worker.pid]))
            for worker in workers:  # every process fails at once
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            for worker in workers:
                worker.wait(60)
        finally:
            for worker, pump in zip(workers, pumps, strict=False):
                stop(worker, pump)
            for worker in workers[len(pumps) :]:
                stop(worker)
        mock.close()
    assert agent_runs(mock.requests) == 1  # one agent run for the whole fleet
    results = {value: _result(outputs[w.pid]) for value, w in zip((1, 2, 3), workers, strict=True)}
    assert results == {1: 10, 2: 20, 3: 30}
    events = {pid: _events(lines) for pid, lines in outputs.items()}
    degraded = [e for found in events.values() for e in found
                if e["event"] == "coordination.degraded"]  # fmt: skip
    assert not degraded, degraded
    (leader,) = [pid for pid, found in events.items()
                 if any(e["event"] == "fleet.fix_published" for e in found)]  # fmt: skip
    for pid, found in events.items():
        if pid == leader:
            continue
        # Each other process applied the leader's fix from the Cluster and replayed its unit
        # through it: no model call of its own.
        (applied,) = [e for e in found if e["event"] == "fleet.fix_applied"]
        assert applied["targets"] == ["__main__.transform"]  # a worker runs as ``python -m``
        (succeeded,) = [e for e in found if e["event"] == "recovery.succeeded"]
        assert succeeded["fleet_role"] in ("waiter", "replayed-fix")
    roles = [e["fleet_role"] for found in events.values() for e in found
             if e["event"] == "recovery.succeeded"]  # fmt: skip
    assert "waiter" in roles  # at least one process waited on the leader's lease, then replayed
