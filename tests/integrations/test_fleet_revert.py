"""A fleet fix that makes things worse in one process is reverted in every process, its record
revoked, and the next failure recovered afresh: two real processes sharing a Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from tests.fleet.support import clean, fleet_redis, new_namespace
from tests.helpers import wait_for
from tests.integrations.test_fleet_processes import lines_of, stop

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """One fleet process: send it calls, read its results and events."""

    def __init__(self, role: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.revert_procs", role], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        self.pump: threading.Thread = lines_of(self.proc.stdout, self.lines)
        wait_for(lambda: any('"ready"' in line for line in self.lines), 60, f"{role} to start")

    def parsed(self) -> list[dict[str, Any]]:
        found = []
        for line in list(self.lines):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.parsed() if e.get("event") == name]

    def call(self, value: int) -> Any:
        done = len([e for e in self.parsed() if "result" in e])
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"call {value}\n")
        self.proc.stdin.flush()
        wait_for(lambda: len([e for e in self.parsed() if "result" in e]) > done, 60,
                 f"the result of call {value}")  # fmt: skip
        return [e for e in self.parsed() if "result" in e][done]["result"]


@contextmanager
def fleet_env() -> Iterator[tuple[str, str, dict[str, str]]]:
    with fleet_redis() as url:
        namespace = new_namespace()
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "FLEET_REDIS_URL": url, "FLEET_NS": namespace, "PYTHONPATH": path}
        try:
            yield url, namespace, env
        finally:
            clean(url, namespace)


def stored_fix(url: str, namespace: str) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    try:
        (name,) = client.keys(f"co:{namespace}:*:fix")
        envelope: dict[str, Any] = json.loads(client.get(name) or b"{}")
        return envelope
    finally:
        client.close()


def test_a_fix_that_raises_a_new_type_in_one_process_is_reverted_in_both() -> None:
    with fleet_env() as (url, namespace, env):
        publisher = Proc("publisher", env)
        applier = Proc("applier", env)
        try:
            assert publisher.call(5) == 20  # recovered, verified by rerun(), published
            assert publisher.events("fleet.fix_published")
            assert applier.call(4) == 25  # the fleet's fix, applied and replayed: no agent
            assert applier.events("fleet.fix_applied")

            # The fix divides by zero here, which the old code never raised: reverted, and
            # this failure is recovered by the applier's own agent, against the old code.
            assert applier.call(0) == -2
            (local,) = applier.events("recovery.patch_reverted")
            assert "ZeroDivisionError" in local["reason"] and local["reverted_by"] == "watch"
            assert local["targets"] == ["tests.integrations.revert_procs.convert"]

            # Revoked in Redis: a signed revocation replaced the record...
            wait_for(lambda: "revokes" in stored_fix(url, namespace)["record"], 30,
                     "the record to be revoked")  # fmt: skip
            revoked = stored_fix(url, namespace)["record"]
            assert revoked["revokes"] == local["fix_record"]
            # ...and the publisher, which ran the fix too, heard of it and reverted.
            wait_for(lambda: publisher.events("recovery.patch_reverted"), 30,
                     "the publisher to revert")  # fmt: skip
            (remote,) = publisher.events("recovery.patch_reverted")
            assert remote["reverted_by"] == "fleet"

            # The old bug again in the publisher: recovered afresh by its agent (-1), not by
            # the revoked fix.
            assert publisher.call(7) == -1
            assert len(publisher.events("recovery.started")) == 2
        finally:
            for proc in (publisher, applier):
                stop(proc.proc, proc.pump)
