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
import json  # noqa: F401  (the sys.modules case checks that it stays imported)
import mmap
import os
import platform
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

import anyio
import httpx
import pytest

from crashoverride import CrashOverride
from crashoverride._agent.namespace import Workspace
from crashoverride._diagnose import snapshot
from crashoverride._diagnose.source import show_source
from crashoverride.testing import done, inspect_python, script, tool_outputs

# Nearly every test here forks snapshots next to a local HTTP server (the exfiltration target).
pytestmark = pytest.mark.slow

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
    # A short poll: shutdown() waits for the loop's next turn (0.5 s by default, per test).
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
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
        return Workspace(
            globals_=self.module_globals, caller=self.caller, bindings={"show_source": show_source}
        )


def attempt(ws: Workspace, expression: str) -> str:
    """The text the model would see: the result, or the error the attempt raised."""
    try:
        return str(ws.inspect(expression))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


# name: (write attempt, a read-only inspection of the same state, its expected result)
ATTEMPTS: dict[str, tuple[str, str, str]] = {
    # The 13 of issue 11.
    "key=exec": ("max([\"hits.append('exec')\"], key=exec)", "len(hits)", "0"),
    "key=caller.update": ("max([{'items': None}], key=caller.update)", "items", "[1, 2]"),
    "key=vars(obj).update": ("max([{'balance': 0}], key=vars(account).update)",
                             "account.balance", "100"),
    "key=getattr(os, 'system')": ("max(['touch ' + target], key=getattr(os, 'system'))",
                                  "target.endswith('.txt')", "True"),
    "key=type(obj).mutate": ("max([account], key=type(account).mutate)",
                             "account.balance", "100"),
    "queue.Queue.get": ("jobs.get()", "jobs.qsize()", "1"),
    "asyncio.Queue.get_nowait": ("ajobs.get_nowait()", "ajobs.qsize()", "1"),
    "httpx.get internal URL": ("httpx.get(url, timeout=2)", "url[:16]", "http://127.0.0.1"),
    "open().write": ("open(target, 'w').write('pwned')", "target[-11:]", "created.txt"),
    "os.remove": ("os.remove(victim)", "victim[-8:]", "keep.txt"),
    "setattr": ("setattr(account, 'balance', 0)", "account.balance", "100"),
    "list.append": ("items.append(99)", "len(items)", "2"),
    "dict.update": ("settings.update(debug=True)", "settings['debug']", "False"),
    "property with a side effect": ("account.audited", "account.reads", "0"),
    # More of our own.
    "os.environ mutation": ("os.environ.update(CO_READONLY_PWNED='1')",
                            "'CO_READONLY_PWNED' in os.environ", "False"),
    "sys.modules mutation": ("sys.modules.pop('json')", "'json' in sys.modules", "True"),
    "generator advanced": ("next(gen)", "type(gen).__name__", "generator"),
    "threading.Event set": ("flag.set()", "flag.is_set()", "False"),
    "module global rebound": ("globals().update(LIMIT=0)", "LIMIT", "10"),
    "subprocess": ("__import__('subprocess').run(['touch', target])", "LIMIT", "10"),
    "pathlib write": ("__import__('pathlib').Path(target).write_text('x')", "LIMIT", "10"),
    "os.rename": ("os.rename(victim, target)", "LIMIT", "10"),
    "sqlite3 file": ("__import__('sqlite3').connect(target).execute('create table t(x)')",
                     "LIMIT", "10"),
}  # fmt: skip


def unchanged(w: World) -> list[str]:
    """What differs from the state ``World`` was built with (empty: nothing changed)."""
    checks = {
        "hits": w.hits == [], "items": w.items == [1, 2] and w.caller["items"] is w.items,
        "account": (w.account.balance, w.account.reads) == (100, 0),
        "jobs": w.jobs.qsize() == 1 and w.ajobs.qsize() == 1,
        "server": w.server.connections == 0,
        "files": w.victim.read_text() == "precious" and not w.target.exists(),
        "settings": w.settings == {"debug": False},
        "environ": "CO_READONLY_PWNED" not in os.environ, "modules": "json" in sys.modules,
        "gen": inspect.getgeneratorstate(w.gen) == inspect.GEN_CREATED,
        "flag": not w.flag.is_set(), "globals": w.module_globals["LIMIT"] == 10,
    }  # fmt: skip
    return [name for name, ok in checks.items() if not ok]


@pytest.fixture
def world(tmp_path: Path, server: _Server) -> World:
    return World(tmp=tmp_path, server=server)


@pytest.mark.skipif(not LINUX, reason="the forked snapshot is the Linux mechanism")
@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_a_write_attempt_in_a_snapshot_changes_nothing(world: World, name: str) -> None:
    write, read, expected = ATTEMPTS[name]
    text = attempt(world.workspace(), write)
    assert unchanged(world) == [], text
    assert attempt(world.workspace(), read) == expected
    # The server counts connections: a real request from this process is the only one seen.
    assert httpx.get(world.caller["url"].replace("pwned", "check"), timeout=5).text == "ok"
    assert (world.server.connections, world.server.paths) == (1, ["/check"])


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_the_fallback_evaluator_refuses_every_write_attempt(
    world: World, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "FORK_ENABLED", False)
    text = attempt(world.workspace(), ATTEMPTS[name][0])
    assert text.startswith("PermissionError: diagnose mode"), text
    assert unchanged(world) == []


def test_diagnose_mode_through_the_handler_leaves_the_block_untouched() -> None:
    model = script(
        inspect_python("max([{'items': None, 'total': 0}], key=caller.update)"),
        inspect_python("items.append(99)"),
        inspect_python("jobs.get()"),
        inspect_python("(len(items), total, jobs.qsize())"),
        done("Root cause: the total was never computed."),
    )
    co = CrashOverride(model=model, mode="diagnose")
    items, total, jobs = [1, 2], 3, queue.Queue[str]()
    jobs.put("job-1")
    with pytest.raises(ZeroDivisionError):
        with co.handler():
            total = total // 0
    assert (items, total, jobs.qsize()) == ([1, 2], 3, 1)
    assert tool_outputs(model)[-1] == "(2, 3, 1)"


def test_the_13_write_attempts_through_a_diagnose_recovery_change_nothing(
    tmp_path: Path, server: _Server
) -> None:
    refunds: list[int] = []

    def refund(amount: int) -> str:
        """Refund an amount (an application tool: diagnose mode must not offer it)."""
        refunds.append(amount)
        return "refunded"

    attempts = [ATTEMPTS[name][0] for name in list(ATTEMPTS)[:14]]
    model = script(*[inspect_python(a) for a in attempts], done("Root cause: none."))
    co = CrashOverride(model=model, mode="diagnose", tools=[refund])
    w = World(tmp=tmp_path, server=server)
    hits, items, settings, account, jobs, ajobs, flag, gen = (
        w.hits,
        w.items,
        w.settings,
        w.account,
        w.jobs,
        w.ajobs,
        w.flag,
        w.gen,
    )
    victim, target, url = w.caller["victim"], w.caller["target"], w.caller["url"]
    with pytest.raises(LookupError):
        with co.handler():
            raise LookupError("diagnose me")
    assert (hits, items, settings, account, jobs, ajobs, flag, gen) == (
        w.hits,
        w.items,
        w.settings,
        w.account,
        w.jobs,
        w.ajobs,
        w.flag,
        w.gen,
    )  # still bound to the same objects: caller.update reached only the snapshot
    w.caller["items"] = items
    assert unchanged(w) == []
    assert len(tool_outputs(model)) == len(attempts)
    assert {tool.name for tool in model.calls[0].tools} == {"inspect_python", "give_up"}
    assert refunds == []
    assert (victim, target, url) == (w.caller["victim"], w.caller["target"], w.caller["url"])


@pytest.mark.anyio
async def test_diagnose_mode_in_an_async_block_forks_from_the_event_loop_thread() -> None:
    model = script(
        inspect_python("(jobs.get_nowait(), items.clear())"),
        inspect_python("(jobs.qsize(), len(items))"),
        done("Root cause: the key is missing."),
    )
    co = CrashOverride(model=model, mode="diagnose")
    items, jobs = [1, 2], queue.Queue[str]()
    jobs.put("job-1")
    with pytest.raises(KeyError):
        async with co.handler():
            raise KeyError("sku")
    assert (items, jobs.qsize()) == ([1, 2], 1)
    assert tool_outputs(model)[-1] == "(1, 2)"


# -- what a fork shares with the process: descriptors, shared memory, other processes -------

fork_only = pytest.mark.skipif(not LINUX, reason="the forked snapshot is the Linux mechanism")


@fork_only
def test_an_inherited_connection_cannot_be_used_from_the_snapshot(world: World) -> None:
    port = world.server.server_port
    with socket.create_connection(("127.0.0.1", port)) as conn:
        world.caller["conn"] = conn
        text = attempt(world.workspace(), "conn.sendall(b'GET /pwned HTTP/1.0\\r\\n\\r\\n')")
        assert "Operation not permitted" in text or "Bad file descriptor" in text
        conn.sendall(b"GET /check HTTP/1.0\r\n\r\n")
        assert conn.recv(1024).startswith(b"HTTP/1.0 200")
    assert world.server.paths == ["/check"]


@fork_only
def test_an_open_file_of_the_process_cannot_be_written_from_the_snapshot(world: World) -> None:
    with open(world.tmp / "app.log", "w") as log:
        world.caller["log"] = log
        text = attempt(world.workspace(), "(log.write('pwned'), log.flush())")
        assert "Bad file descriptor" in text
        assert attempt(world.workspace(), "log.name[-7:]") == "app.log"
    assert (world.tmp / "app.log").read_text() == ""


@fork_only
def test_memory_shared_with_the_process_is_read_only_in_the_snapshot(world: World) -> None:
    shared = mmap.mmap(-1, 16)  # anonymous mmaps are MAP_SHARED: a fork writes through
    shared.write(b"live")
    world.caller["shared"] = shared
    text = attempt(world.workspace(), "(shared.seek(0), shared.write(b'pwnd'))")
    assert "wrote to memory shared with other processes" in text, text
    assert shared[:4] == b"live"
    assert attempt(world.workspace(), "shared[:4]") == "b'live'"


@fork_only
def test_the_snapshot_cannot_signal_or_start_processes(world: World) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        world.caller["pid"] = sleeper.pid
        assert "os.kill refused" in attempt(world.workspace(), "os.kill(pid, 9)")
        assert "os.system refused" in attempt(world.workspace(), "os.system('true')")
        assert "os.fork refused" in attempt(world.workspace(), "os.fork()")
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=0.2)  # still running
    finally:
        sleeper.kill()
        sleeper.wait()


@fork_only
@pytest.mark.parametrize(
    "tamper",
    [
        "vars(sys.modules['crashoverride._diagnose.confine']).update(_REFUSED=frozenset())",
        "setattr(__import__('builtins'), 'len', lambda *args: 0)",
        "setattr(sys.modules['crashoverride._diagnose.confine']._refuse, '__kwdefaults__', {})",
        "__import__('ctypes').CDLL(None)",
        "(lambda: 0).__code__.replace(co_code=b'')",
    ],
)
def test_the_audit_hook_cannot_be_switched_off(world: World, tamper: str) -> None:
    text = attempt(world.workspace(), f"({tamper}, os.remove(victim))")
    assert "refused" in text
    assert unchanged(world) == []


@fork_only
def test_a_dns_lookup_cannot_carry_data_out(world: World) -> None:
    text = attempt(world.workspace(), "__import__('socket').gethostbyname('x.example.invalid')")
    assert "socket.gethostbyname refused" in text


@fork_only
def test_an_expression_still_running_at_the_deadline_is_stopped(world: World) -> None:
    ws = world.workspace()
    ws.deadline = time.monotonic() + 0.3
    text = attempt(ws, "any(iter(int, 1))")  # zeros forever
    assert text.startswith("InspectionFailed: the expression was still running")
    ws.deadline = time.monotonic()
    assert "time is up" in attempt(ws, "len(items)")


@fork_only
def test_a_lock_held_by_another_thread_hangs_only_the_snapshot(world: World) -> None:
    # Forking with a second thread alive is what 3.12+ warns about; the snapshot hangs on the
    # lock that thread holds until the deadline, and the process is not affected.
    lock, taken, release = threading.Lock(), threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    taken.wait(10)
    try:
        world.caller["lock"] = lock
        ws = world.workspace()
        ws.deadline = time.monotonic() + 0.3
        assert "still running" in attempt(ws, "lock.acquire()")
        ws.deadline = None
        assert attempt(ws, "lock.locked()") == "True"
    finally:
        release.set()
        thread.join()
    assert lock.acquire(blocking=False)
    lock.release()


@fork_only
def test_results_errors_and_printed_output_come_back_from_the_snapshot(world: World) -> None:
    ws = world.workspace()
    assert attempt(ws, "print('seen', len(items))") == "seen 2\n"
    assert attempt(ws, "settings") == "{'debug': False}"
    failed = attempt(ws, "settings['missing']")
    assert failed.startswith("InspectionFailed: Traceback") and "KeyError: 'missing'" in failed
    assert "SyntaxError" in attempt(ws, "items.append(")
    assert "NameError" in attempt(ws, "undefined_name")


# -- the fallback: reads that still work without a snapshot ----------------------------------

FALLBACK_READS = {
    "len(items)": "2", "items[-1]": "2", "settings['debug']": "False",
    "sorted(settings)": "['debug']", "account.balance": "100",
    "vars(account)": "{'balance': 100, 'reads': 0}", "type(gen).__name__": "generator",
    "'debug' in settings": "True", "len(items) > 1 and items[0] == 1": "True",
    "isinstance(account, Account)": "True", "hasattr(account, 'audited')": "True",
    "account.mutate": "<function Account.mutate>", "max(items, key=abs) + 1": "3",
    "caller['items'][:1]": "[1]", "target.endswith('.txt')": "True",
    "repr(account)": "<tests.diagnose.test_readonly.Account object {'balance': 100, 'reads': 0}>",
    "[account.balance, None]": "[100, None]",
    "type(account)": "<class 'tests.diagnose.test_readonly.Account'>",
    "LIMIT if flag is not None else 0": "10", "os.sep": "/",
    "show_source(Account.mutate).split()[1]": "mutate(self)",
    "show_source(account.mutate).split()[1]": "mutate(self)",
}  # fmt: skip


@pytest.mark.parametrize("expression", list(FALLBACK_READS))
def test_the_fallback_evaluator_reads_plain_data_and_fields(
    world: World, expression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "FORK_ENABLED", False)
    world.module_globals["Account"] = Account
    assert attempt(world.workspace(), expression) == FALLBACK_READS[expression]
    assert unchanged(world) == []


def test_the_fallback_evaluator_runs_no_code_of_the_application(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    class Meta(type):
        def __instancecheck__(cls, instance: object) -> bool:
            ran.append("instancecheck")
            return True

    class Sneaky(metaclass=Meta):
        def __getattr__(self, name: str) -> Any:
            ran.append("getattr")
            return 1

        def __eq__(self, other: object) -> bool:
            ran.append("eq")
            return True

        def __hash__(self) -> int:
            ran.append("hash")
            return 1

        def __bool__(self) -> bool:
            ran.append("bool")
            return True

        def __len__(self) -> int:
            ran.append("len")
            return 1

        def __repr__(self) -> str:
            ran.append("repr")
            return "sneaky"

    monkeypatch.setattr(snapshot, "FORK_ENABLED", False)
    obj = Sneaky()
    ws = Workspace(globals_={"obj": obj, "Sneaky": Sneaky}, caller={},
                   bindings={"show_source": show_source})  # fmt: skip
    for expression in (
        "obj.missing", "obj == 1", "{obj}", "obj in [1]", "not obj", "len(obj)",
        "isinstance(1, Sneaky)", "sorted([obj, obj])", "obj and 1", "str(obj)",
        "show_source(obj)", "show_source(Sneaky)",
    ):  # fmt: skip
        assert attempt(ws, expression).startswith("PermissionError: diagnose mode"), expression
    assert attempt(ws, "obj") == f"<tests.diagnose.test_readonly.{Sneaky.__qualname__} object>"
    assert attempt(ws, "obj is obj") == "True"
    assert ran == []


@fork_only
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is x86-64's")
def test_the_kernel_refuses_what_no_audit_event_reports(world: World) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        world.caller["pid"] = sleeper.pid
        # Neither call raises an audit event: the seccomp filter is what stops them.
        signal_it = "__import__('signal').pidfd_send_signal(os.pidfd_open(pid), 9)"
        assert "Operation not permitted" in attempt(world.workspace(), signal_it)
        assert "Operation not permitted" in attempt(world.workspace(), "os.mkfifo(target)")
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=0.2)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert unchanged(world) == []


@fork_only
def test_a_snapshot_that_cannot_be_isolated_evaluates_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(keep: int) -> None:
        raise OSError("the kernel refused the seccomp filter")

    monkeypatch.setattr(snapshot, "confine", broken)
    # The child reports it and evaluates nothing; the static evaluator answers instead.
    text = attempt(world.workspace(), "os.remove(victim)")
    assert text.startswith("PermissionError: diagnose mode: calling remove() on module os")
    assert attempt(world.workspace(), "items") == "[1, 2]"
    assert unchanged(world) == []


def test_a_failed_fork_falls_back_to_the_static_evaluator(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(snapshot, "fork_usable", lambda: True)
    monkeypatch.setattr(os, "fork", no_fork)
    assert attempt(world.workspace(), "len(items)") == "2"
    assert attempt(world.workspace(), "items.append(3)").startswith("PermissionError: diagnose")
    assert unchanged(world) == []


@fork_only
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is x86-64's")
def test_the_snapshot_cannot_change_how_the_process_is_scheduled(world: World) -> None:
    world.caller["parent"] = os.getpid()
    before = os.getpriority(os.PRIO_PROCESS, 0)
    renice = "os.setpriority(os.PRIO_PROCESS, parent, 19)"
    assert "Operation not permitted" in attempt(world.workspace(), renice)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    # Its own priority is its own business.
    assert attempt(world.workspace(), "os.setpriority(os.PRIO_PROCESS, 0, 19)") == (
        "OK (no output, no value)"
    )


@fork_only
def test_a_snapshot_that_closes_its_reply_pipe_and_runs_on_is_stopped(world: World) -> None:
    ws = world.workspace()
    ws.deadline = None  # the parent must not wait for the budget: the pipe closing ends it
    text = attempt(ws, "(os.closerange(3, 65536), any(iter(int, 1)))")
    assert text == "InspectionFailed: the snapshot evaluating the expression ended without a result"


@fork_only
def test_the_audit_hook_defaults_cannot_be_mutated_in_place(world: World) -> None:
    hook = "sys.modules['crashoverride._diagnose.confine']._refuse"
    for mutate in (
        f"{hook}.__kwdefaults__.update(_refused=frozenset(), _prefixes=())",
        f"{hook}.__defaults__.__init__((frozenset(), ()))",
    ):
        attempt(world.workspace(), f"({mutate}, os.remove(victim))")
        assert unchanged(world) == [], mutate


@fork_only
@pytest.mark.anyio
async def test_on_an_event_loop_the_snapshot_is_awaited_without_holding_the_loop(
    world: World,
) -> None:
    order: list[str] = []

    async def other_request() -> None:
        order.append("other request served")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_request)
        pending = world.workspace().inspect("(__import__('time').sleep(0.2), 'inspected')[1]")
        assert inspect.isawaitable(pending)  # the bridge awaits it on the owner's loop
        order.append(await pending)
    assert order == ["other request served", "inspected"]


_AFTER_FORK: list[Callable[[], None]] = []  # run in every forked child while a test sets it
os.register_at_fork(after_in_child=lambda: [hook() for hook in _AFTER_FORK])


@fork_only
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is x86-64's")
def test_a_thread_an_after_fork_handler_started_is_filtered_too(world: World) -> None:
    ready, done = threading.Event(), threading.Event()
    outcome: list[str] = []

    def library_thread() -> None:  # e.g. a client library restarting its sender after fork
        ready.wait(5)
        try:
            os.mkfifo(world.target)  # no audit event: only the kernel filter can refuse it
            outcome.append("created")
        except OSError as exc:
            outcome.append(exc.strerror or "")
        done.set()

    _AFTER_FORK.append(lambda: threading.Thread(target=library_thread, daemon=True).start())
    try:
        world.caller.update(ready=ready, done=done, outcome=outcome)
        text = attempt(world.workspace(), "(ready.set(), done.wait(5), outcome)[2]")
    finally:
        _AFTER_FORK.clear()
    assert text == "['Operation not permitted']"
    assert not world.target.exists()


@fork_only
def test_a_pipe_of_the_process_cannot_be_drained_through_proc(world: World) -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"job-1")
        os.set_blocking(read_end, False)
        world.caller["path"] = f"/proc/{os.getpid()}/fd/{read_end}"
        text = attempt(world.workspace(), "open(path, 'rb').read(5)")
        assert "refused" in text, text
        assert os.read(read_end, 5) == b"job-1"
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize(
    "expression",
    ["'x'.replace('', 'yyy')", "format(1, '>1000000000')", "sum([[1], [2]], [])",
     "'ab' * 10", "list(range(1000000000))", "2 ** 100000"],
)  # fmt: skip
def test_the_fallback_evaluator_refuses_what_multiplies_sizes(
    world: World, expression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "FORK_ENABLED", False)
    assert attempt(world.workspace(), expression).startswith("PermissionError: diagnose mode")
