"""Diagnose mode is read-only by mechanism: no inspection changes the process, its files or peers.

Each write attempt below runs through ``inspect_python``'s evaluator (``Workspace.inspect``), then
the test checks that the live object, file, queue, server or process it aimed at is unchanged,
and that reading the same object still gives the right value. The forked snapshot is the
mechanism on Linux; the fallback evaluator (no fork) is checked against the same attempts.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import mmap
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashoverride import CrashOverride
from crashoverride._namespace import Workspace
from tests.helpers import done_step, scripted, tool_outputs

LINUX = sys.platform.startswith("linux")


class Account:
    def __init__(self) -> None:
        self.balance = 100
        self.reads = 0

    def mutate(self) -> int:
        self.balance = 0
        return 0

    @property
    def audited(self) -> int:
        # A property with a side effect: reading it counts the read.
        self.reads += 1
        return self.balance


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.paths: list[str] = []
        self.connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


@dataclass
class World:
    """Live state a diagnose snippet can reach, and the checks that it is unchanged."""

    tmp: Path
    server: _Server
    items: list[int] = field(default_factory=lambda: [1, 2])
    settings: dict[str, Any] = field(default_factory=lambda: {"debug": False})
    account: Account = field(default_factory=Account)
    jobs: queue.Queue[str] = field(default_factory=queue.Queue)
    ajobs: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    hits: list[str] = field(default_factory=list)
    flag: threading.Event = field(default_factory=threading.Event)
    module_globals: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.jobs.put("job-1")
        self.ajobs.put_nowait("job-1")
        self.victim = self.tmp / "keep.txt"
        self.victim.write_text("precious")
        self.target = self.tmp / "created.txt"
        self.gen = (i for i in range(3))
        self.caller: dict[str, Any] = {
            "items": self.items, "settings": self.settings, "account": self.account,
            "jobs": self.jobs, "ajobs": self.ajobs, "hits": self.hits, "flag": self.flag,
            "gen": self.gen, "victim": str(self.victim), "target": str(self.target),
            "url": f"http://127.0.0.1:{self.server.server_port}/pwned",
        }  # fmt: skip
        self.module_globals.update(
            {"__builtins__": builtins, "os": os, "sys": sys, "httpx": httpx, "LIMIT": 10}
        )

    def workspace(self) -> Workspace:
        return Workspace(globals_=self.module_globals, caller=self.caller, bindings={})


def attempt(ws: Workspace, expression: str) -> str:
    """The text the model would see: the result, or the error the attempt raised."""
    try:
        return str(ws.inspect(expression))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


# (write attempt, read-only inspection of the same state, its expected result, unchanged?)
Check = Callable[[World], bool]
ATTEMPTS: dict[str, tuple[str, str, str, Check]] = {
    "key=exec": (
        "max([\"hits.append('exec')\"], key=exec)", "len(hits)", "0", lambda w: w.hits == []),
    "key=caller.update": (
        "max([{'items': None}], key=caller.update)", "items", "[1, 2]",
        lambda w: w.caller["items"] == [1, 2]),
    "key=vars(obj).update": (
        "max([{'balance': 0}], key=vars(account).update)", "account.balance", "100",
        lambda w: w.account.balance == 100),
    "key=getattr(os, 'system')": (
        "max(['touch ' + target], key=getattr(os, 'system'))", "target.endswith('.txt')", "True",
        lambda w: not w.target.exists()),
    "key=type(obj).mutate": (
        "max([account], key=type(account).mutate)", "account.balance", "100",
        lambda w: w.account.balance == 100),
    "queue.Queue.get": (
        "jobs.get()", "jobs.qsize()", "1", lambda w: w.jobs.qsize() == 1),
    "asyncio.Queue.get_nowait": (
        "ajobs.get_nowait()", "ajobs.qsize()", "1", lambda w: w.ajobs.qsize() == 1),
    "httpx.get internal URL": (
        "httpx.get(url, timeout=2)", "url.startswith('http://127.0.0.1')", "True",
        lambda w: w.server.connections == 0),
    "open().write": (
        "open(target, 'w').write('pwned')", "target.endswith('created.txt')", "True",
        lambda w: not w.target.exists()),
    "os.remove": (
        "os.remove(victim)", "len(victim) > 0", "True",
        lambda w: w.victim.read_text() == "precious"),
    "setattr": (
        "setattr(account, 'balance', 0)", "account.balance", "100",
        lambda w: w.account.balance == 100),
    "list.append": ("items.append(99)", "len(items)", "2", lambda w: w.items == [1, 2]),
    "dict.update": (
        "settings.update(debug=True)", "settings['debug']", "False",
        lambda w: w.settings == {"debug": False}),
    "property with a side effect": (
        "account.audited", "account.reads", "0", lambda w: w.account.reads == 0),
    # More of our own.
    "os.environ mutation": (
        "os.environ.update(CO_READONLY_PWNED='1')", "'PATH' in os.environ", "True",
        lambda w: "CO_READONLY_PWNED" not in os.environ),
    "sys.modules mutation": (
        "sys.modules.pop('json')", "'json' in sys.modules", "True",
        lambda w: "json" in sys.modules),
    "generator advanced": ("next(gen)", "type(gen).__name__", "generator",
                           lambda w: inspect.getgeneratorstate(w.gen) == inspect.GEN_CREATED),
    "threading.Event set": (
        "flag.set()", "flag.is_set()", "False", lambda w: not w.flag.is_set()),
    "module global rebound": (
        "globals().update(LIMIT=0)", "LIMIT", "10", lambda w: w.module_globals["LIMIT"] == 10),
    "subprocess": (
        "__import__('subprocess').run(['touch', target])", "LIMIT", "10",
        lambda w: not w.target.exists()),
    "pathlib write": (
        "__import__('pathlib').Path(target).write_text('x')", "LIMIT", "10",
        lambda w: not w.target.exists()),
    "os.rename": (
        "os.rename(victim, target)", "LIMIT", "10",
        lambda w: w.victim.exists() and not w.target.exists()),
}  # fmt: skip

import json  # noqa: E402,F401  (the sys.modules case checks that it stays imported)


@pytest.fixture
def world(tmp_path: Path, server: _Server) -> World:
    return World(tmp=tmp_path, server=server)


def _assert_untouched(world: World, name: str, text: str) -> None:
    write, read, expected, unchanged = ATTEMPTS[name]
    assert unchanged(world), f"{name}: the attempt changed the process: {text}"
    assert attempt(world.workspace(), read) == expected, name


@pytest.mark.skipif(not LINUX, reason="the forked snapshot is the Linux mechanism")
@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_a_write_attempt_in_a_snapshot_changes_nothing(world: World, name: str) -> None:
    text = attempt(world.workspace(), ATTEMPTS[name][0])
    _assert_untouched(world, name, text)
    # The server still counts connections: a real request from this process is seen.
    assert httpx.get(world.caller["url"].replace("pwned", "check"), timeout=5).text == "ok"
    assert world.server.paths == ["/check"]


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_the_fallback_evaluator_refuses_every_write_attempt(
    world: World, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashoverride import _snapshot

    monkeypatch.setattr(_snapshot, "FORK_ENABLED", False)
    text = attempt(world.workspace(), ATTEMPTS[name][0])
    write, read, expected, unchanged = ATTEMPTS[name]
    assert unchanged(world), f"{name}: {text}"
    assert text.startswith("PermissionError: diagnose mode"), (name, text)
    monkeypatch.setattr(_snapshot, "FORK_ENABLED", True)
    if LINUX:
        _assert_untouched(world, name, text)


def test_diagnose_mode_through_the_handler_leaves_the_block_untouched() -> None:
    model = scripted(
        [_inspect("max([{'items': None, 'total': 0}], key=caller.update)")],
        [_inspect("items.append(99)")],
        [_inspect("jobs.get()")],
        [_inspect("(len(items), total, jobs.qsize())")],
        done_step("Root cause: the total was never computed."),
    )
    co = CrashOverride(model=model, mode="diagnose")
    items, total, jobs = [1, 2], 3, queue.Queue[str]()
    jobs.put("job-1")
    with pytest.raises(ZeroDivisionError):
        with co.handler():
            total = total // 0
    assert (items, total, jobs.qsize()) == ([1, 2], 3, 1)
    assert tool_outputs(model)[-1] == "(2, 3, 1)"


def _inspect(expression: str) -> Any:
    from agents.testing import function_call

    return function_call("inspect_python", {"expression": expression}, call_id=expression[:40])
