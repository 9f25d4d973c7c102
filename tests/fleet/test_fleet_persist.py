"""Persisted fixes travel in fix records: ``persist_function`` as code other processes run live,
``persist_file_edit`` as information only (never written to another process's files).

Each ``CrashOverride`` with its own ``RedisCoordination`` stands for a process (as in
tests/fleet/test_fleet.py); the fixed module is a real file in ``tmp_path``, imported, and persisted
to by the leader's recovery (``allow_source_changes=True``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from crashoverride._fleet import records
from crashoverride._repair import journal
from crashoverride.testing import done, exec_python, give_up, script
from tests.fleet.support import FLEET_KEY, clean, close_fleet, fleet_redis, new_namespace

MODULE = '''\
"""Prices (a module of the test's own, in tmp_path)."""

GREETING = "hello"
REGISTERED = []


def register(function):
    REGISTERED.append(function.__name__)
    return function


@register
def price(qty):
    raise NotImplementedError("price: 3 per item")
'''
FIXED = "def price(qty):\n    return qty * 3\n"
# A secret the agent writes into a file: persisted, but never into Redis (the diff is redacted).
TOKEN = "ghp_" + "Ab3" * 12


class Deployment:
    """The test's module, as every process of one deployment has it; the fleet's Redis."""

    def __init__(self, module: types.ModuleType, path: Path, url: str, namespace: str) -> None:
        self.module, self.path, self.url, self.namespace = module, path, url, namespace
        self.original = module.price.__code__

    def as_deployed(self) -> None:
        """This process's code as deployed: the fix a recovery made here is undone."""
        self.module.price.__code__ = self.original

    def app(self, model: Any, **options: Any) -> CrashOverride:
        fleet = RedisCoordination(self.url, namespace=self.namespace, key=FLEET_KEY,
                                  op_timeout=2.0)  # fmt: skip
        return CrashOverride(model=model, timeout=20, coordination=fleet, **options)

    def job(self, co: CrashOverride) -> Any:
        # The application's check: a fix answered by set_result() travels only when it holds.
        @co.handler(postcondition=lambda view: view["result"] == view["args"][0] * 3)
        def job(qty: int) -> int:
            return int(self.module.price(qty))

        return job

    def envelope(self) -> dict[str, Any]:
        client = redis.Redis.from_url(self.url)
        try:
            (name,) = client.keys(f"co:{self.namespace}:*:fix")
            stored: dict[str, Any] = json.loads(client.get(name) or b"")
            return stored
        finally:
            client.close()

    def store(self, envelope: dict[str, Any]) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            (name,) = client.keys(f"co:{self.namespace}:*:fix")
            client.set(name, json.dumps(envelope))
        finally:
            client.close()

    def everything_stored(self) -> bytes:
        return stored_values(self.url, self.namespace)


def stored_values(url: str, namespace: str) -> bytes:
    """The names and values of every key of ``namespace``, whatever their type."""
    client = redis.Redis.from_url(url)
    found: list[bytes] = []
    try:
        for name in client.scan_iter(match=f"*{namespace}*", count=500):
            found.append(name)
            kind = client.type(name)
            if kind == b"string":
                found.append(client.get(name) or b"")
            elif kind == b"zset":
                found.extend(client.zrange(name, 0, -1))
            elif kind == b"hash":
                found.extend(b"%s=%s" % pair for pair in client.hgetall(name).items())
            elif kind == b"list":
                found.extend(client.lrange(name, 0, -1))
            elif kind == b"set":
                found.extend(client.smembers(name))
            else:
                raise AssertionError(f"a {kind!r} key the fleet does not make: {name!r}")
    finally:
        client.close()
    return b"\n".join(found)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    name = "prices_" + os.urandom(4).hex()
    path = tmp_path / f"{name}.py"
    path.write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
        with fleet_redis() as url:
            namespace = new_namespace()
            try:
                yield Deployment(module, path, url, namespace)
            finally:
                clean(url, namespace)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def agent_code(deployment: Deployment, body: str) -> str:
    return f"import {deployment.module.__name__} as m\nSRC = {FIXED!r}\n" + body


REPLACE_THEN_PERSIST = (
    "replace_function(m.price, SRC)\nprint(persist_function(m.price, SRC))\nrerun()"
)
# With its decorator: it registers once, at import; applied live elsewhere it must not again.
PERSIST_ONLY = (
    "print(persist_function(m.price, '@register\\n' + SRC))\nset_result(caller['qty'] * 3)"
)


def fixed_by_leader(deployment: Deployment, body: str) -> CrashOverride:
    """A leader recovered once and persisted its fix; then this process's code is put back as
    another process of the deployment has it. Close the returned app at the end."""
    model = script(exec_python(agent_code(deployment, body)), done("fixed and persisted"))
    leader = deployment.app(model, allow_source_changes=True)
    assert deployment.job(leader)(4) == 12
    deployment.as_deployed()
    return leader


@pytest.mark.parametrize(
    ("body", "kind"),
    [(REPLACE_THEN_PERSIST, "replace"), (PERSIST_ONLY, "persist")],
    ids=["replaced-then-persisted", "persisted-only"],
)
def test_a_persisted_fix_is_published_once_and_applied_live_elsewhere(
    deployment: Deployment, body: str, kind: str
) -> None:
    with capture_logs() as leader_logs:
        leader = fixed_by_leader(deployment, body)
    assert "return qty * 3" in deployment.path.read_text()  # the leader persisted it
    record = deployment.envelope()["record"]
    # One target, whatever the agent did to it: the live change and its persistence are one fix.
    (target,) = record["targets"]
    assert (target["module"], target["qualname"]) == (deployment.module.__name__, "price")
    assert (target["kind"], target["source"]) == (kind, FIXED)
    assert target["code_hash"] == journal.digest(deployment.original)
    assert record["files"] == []
    (published,) = [e for e in leader_logs if e["event"] == "fleet.fix_published"]
    assert published["targets"] == [f"{deployment.module.__name__}.price"]

    shown: list[Any] = []
    later_model = script()
    reports: list[Any] = []
    later = deployment.app(later_model, approve=lambda request: shown.append(request) or True,
                           on_recovery=reports.append)  # fmt: skip
    written = deployment.path.read_text()
    with capture_logs() as logs:
        assert deployment.job(later)(5) == 15
    close_fleet(leader, later)
    assert len(later_model.calls) == 0
    (report,) = reports
    assert (report.via, report.fleet_role) == ("replay", "replayed-fix")
    (request,) = shown  # approve= saw the persisted code before it ran here
    assert FIXED.strip() in request and request.tool == "apply_fix"
    (applied,) = [e for e in logs if e["event"] == "fleet.fix_applied"]
    assert applied["targets"] == [f"{deployment.module.__name__}.price"]
    assert deployment.path.read_text() == written  # applied live; the file was left alone
    assert deployment.module.REGISTERED == ["price"]  # its decorator did not run again


def test_a_persisted_file_edit_travels_as_information_and_is_never_written_elsewhere(
    deployment: Deployment,
) -> None:
    edit = (
        "replace_function(m.price, SRC)\n"
        f"persist_file_edit(m.__file__, 'GREETING = \"hello\"', 'TOKEN = \"{TOKEN}\"')\n"
        "rerun()"
    )
    leader = fixed_by_leader(deployment, edit)
    assert TOKEN in deployment.path.read_text()  # the leader's file has the edit
    record = deployment.envelope()["record"]
    (target,) = record["targets"]
    assert target["kind"] == "replace"
    (change,) = record["files"]
    # Named as every process of the deployment names that file: from its import root.
    assert change["path"] == deployment.path.name
    assert "+TOKEN = " in change["diff"] and "[REDACTED]" in change["diff"]
    assert TOKEN.encode() not in deployment.everything_stored()

    deployment.path.write_text(MODULE)  # another host: its own copy of the deployed file
    files = sorted(deployment.path.parent.iterdir())
    shown: list[Any] = []
    later_model = script()
    later = deployment.app(later_model, approve=lambda request: shown.append(request) or True)
    with capture_logs() as logs:
        assert deployment.job(later)(2) == 6
    close_fleet(leader, later)
    assert len(later_model.calls) == 0
    (applied,) = [e for e in logs if e["event"] == "fleet.fix_applied"]
    assert applied["not_applied"] == [f"{deployment.path.name} (persisted file edit: not applied)"]
    assert deployment.path.read_text() == MODULE  # never written by another process
    assert sorted(deployment.path.parent.iterdir()) == files  # no backup, no patch: no write
    (request,) = shown
    assert f"file {deployment.path.name}" in request and "not applied" in request
    assert "+TOKEN = " in request and TOKEN not in request


def test_a_record_of_file_edits_only_is_refused_with_the_reason(deployment: Deployment) -> None:
    edit = (
        "persist_file_edit(m.__file__, 'GREETING = \"hello\"', 'GREETING = \"hi\"')\n"
        "set_result(caller['qty'] * 3)"
    )
    leader = fixed_by_leader(deployment, edit)
    assert deployment.envelope()["record"]["targets"] == []
    later_model = script(exec_python(agent_code(deployment, "replace_function(m.price, SRC)\n"
                                                            "rerun()")), done())  # fmt: skip
    later = deployment.app(later_model)
    with capture_logs() as logs:
        assert deployment.job(later)(3) == 9  # by its own agent run
    close_fleet(leader, later)
    assert len(later_model.calls) == 2
    (refused,) = [e for e in logs if e["event"] == "fleet.fix_refused"]
    assert "not applied" in refused["reason"] and deployment.path.name in refused["reason"]


@pytest.mark.parametrize("tamper", ["source", "code_hash"])
def test_a_tampered_or_foreign_persisted_fix_is_refused(
    deployment: Deployment, tamper: str
) -> None:
    leader = fixed_by_leader(deployment, PERSIST_ONLY)
    envelope = deployment.envelope()
    (target,) = envelope["record"]["targets"]
    if tamper == "source":  # planted code: the signature no longer verifies
        target["source"] = "def price(qty):\n    return 666\n"
    else:  # a record made against another deployment's code, signed with the fleet key
        target["code_hash"] = "0" * 32
        envelope = json.loads(records.sign(envelope["record"], FLEET_KEY.encode()))
    deployment.store(envelope)
    later_model = script(give_up("not this one"))
    later = deployment.app(later_model)
    with capture_logs() as logs, pytest.raises(NotImplementedError):
        deployment.job(later)(1)
    close_fleet(leader, later)
    assert len(later_model.calls) == 1  # its own agent ran
    (refused,) = [e for e in logs if e["event"] == "fleet.fix_refused"]
    expected = "bad signature" if tamper == "source" else "other code"
    assert expected in refused["reason"]
    assert deployment.module.price.__code__ is deployment.original
