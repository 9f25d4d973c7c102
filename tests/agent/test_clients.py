"""OpenAI clients: built off the event loop, reused per loop and (base_url, key), always closed.

Every test talks to the loopback ``MockServer`` through the real ``openai`` client. Servers
run with ``keep_alive=True`` where closing matters: a client left open then holds a live
socket, which the suite's ``-W error`` turns into a failure when it is garbage-collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from crashoverride import CrashOverride
from crashoverride.testing import MockServer, Script, done, exec_python

FIX = "caller['value'] = 42"


class Built:
    """Every ``AsyncOpenAI`` constructed during a test, with the thread that built it."""

    def __init__(self) -> None:
        self.clients: list[Any] = []
        self.threads: list[int] = []

    def __len__(self) -> int:
        return len(self.clients)

    def all_closed(self) -> bool:
        return all(client.is_closed() for client in self.clients)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[Built]:
    from openai import AsyncOpenAI

    record = Built()
    original = AsyncOpenAI.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        record.threads.append(threading.get_ident())
        record.clients.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(AsyncOpenAI, "__init__", recording)
    yield record
    record.clients.clear()  # the clients are not kept alive past the test


def _runs(count: int) -> Script:
    script = Script(exec_python(FIX), done("value set"))
    for _ in range(count - 1):
        script.run(exec_python(FIX), done("value set"))
    return script


def _app(server: MockServer, **settings: Any) -> CrashOverride:
    return CrashOverride(model="m", base_url=server.base_url, api_key="sk-local", **settings)


async def _recover_async(co: CrashOverride) -> Any:
    value = None
    async with co.handler(prompt="Leave `value` set to 42."):
        raise LookupError("value")
    return value


def _recover_sync(co: CrashOverride) -> Any:
    value = None
    with co.handler(prompt="Leave `value` set to 42."):
        raise LookupError("value")
    return value


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_recoveries_on_one_loop_build_one_client_off_the_loop(built: Built) -> None:
    async with MockServer(_runs(3)) as server:
        co = _app(server)
        values = [await _recover_async(co) for _ in range(3)]
    assert values == [42, 42, 42]
    assert len(built) == 1
    assert threading.get_ident() not in built.threads  # built in a worker thread


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_concurrent_recoveries_share_one_construction(built: Built) -> None:
    async def attempt(co: CrashOverride) -> None:
        # Concurrent runs take the scripted turns in any order: only the client counts here,
        # not which run ends recovered.
        with contextlib.suppress(LookupError):
            await _recover_async(co)

    async with MockServer(Script(done("noted")).run(done("noted")).run(done("noted"))) as server:
        co = _app(server, single_flight=False)
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(attempt, co)
        assert len(server.requests) == 3
    assert len(built) == 1


@pytest.mark.anyio
async def test_no_client_is_built_on_the_application_loop(built: Built, anyio_backend: str) -> None:
    # On trio the agent runs on an asyncio loop in a worker thread: that placement builds its
    # client off the trio thread too, and the recovery still reaches the caller's frame.
    async with MockServer(_runs(2)) as server:
        co = _app(server)
        assert [await _recover_async(co) for _ in range(2)] == [42, 42]
    assert len(built) >= 1
    assert threading.get_ident() not in built.threads
    if anyio_backend == "trio":
        assert built.all_closed()  # each worker thread's loop closed its client as it ended


AGENT_LOOP_CLIENT = """
import atexit, asyncio, json, sys
from openai import AsyncOpenAI

built = []
original = AsyncOpenAI.__init__

def recording(self, *args, **kwargs):
    built.append(self)
    original(self, *args, **kwargs)

AsyncOpenAI.__init__ = recording
# Registered before crashoverride stops its agent loop at exit, so it runs after that.
atexit.register(lambda: print(json.dumps({"closed_at_exit": [c.is_closed() for c in built]})))

from crashoverride import CrashOverride
from crashoverride.testing import MockServer, done, exec_python

server = MockServer([exec_python("caller['value'] = 42"), done()] * 2, keep_alive=True)
server.start()
co = CrashOverride(model="m", base_url=server.base_url, api_key="sk-local")

async def main():
    value = None
    async with co.handler(prompt="Leave `value` set to 42."):
        raise LookupError("value")
    return value

# Two application loops, one after the other (a test runner, a CLI): one client for both.
values = [asyncio.run(main()), asyncio.run(main())]
print(json.dumps({"values": values, "built": len(built),
                  "open_between": [not c.is_closed() for c in built]}))
"""


@pytest.mark.slow
def test_the_agent_loop_keeps_one_client_for_the_process_and_closes_it_at_exit() -> None:
    # The running-loop placement's sessions run on the process's agent loop: its client serves
    # every application loop's recoveries, and is closed, with its live connection, at exit.
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", AGENT_LOOP_CLIENT],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines == [
        {"values": [42, 42], "built": 1, "open_between": [True]},
        {"closed_at_exit": [True]},
    ], out.stderr


def test_sync_recoveries_on_temporary_loops_close_their_clients_and_share_certificates(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[int] = []
    original = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MockServer(_runs(3), keep_alive=True) as server:
            co = _app(server)
            for attempt in range(3):
                if attempt == 1:
                    loads.clear()  # the first recovery of the process may set things up
                assert _recover_sync(co) == 42
                assert built.all_closed()  # each temporary loop closed its client
        built.clients.clear()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert loads == []  # CA certificates are loaded once per process, not per recovery


def test_sync_code_inside_a_running_loop_closes_the_worker_loops_clients(built: Built) -> None:
    with MockServer(_runs(2), keep_alive=True) as server:
        co = _app(server)

        async def main() -> list[Any]:
            # Sync code called from async code: the agent runs on a worker thread's loop.
            return [_recover_sync(co), _recover_sync(co)]

        assert asyncio.run(main()) == [42, 42]
    assert len(built) == 2 and built.all_closed()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_user_factory_is_called_per_recovery_and_its_client_left_open(
    built: Built,
) -> None:
    from openai import AsyncOpenAI

    async with MockServer(_runs(2)) as server:
        mine = AsyncOpenAI(base_url=server.base_url, api_key="sk-mine", max_retries=0)
        calls: list[int] = []

        def factory() -> AsyncOpenAI:
            calls.append(1)
            return mine

        co = CrashOverride(model="m", base_url=server.base_url, openai_client_factory=factory)
        try:
            assert [await _recover_async(co) for _ in range(2)] == [42, 42]
            assert calls == [1, 1] and not mine.is_closed()
            assert built.clients == [mine]  # nothing of ours was built
        finally:
            await mine.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_idle_clients_beyond_the_bound_are_closed(built: Built) -> None:
    from crashoverride._agent.clients import MAX_CLIENTS_PER_LOOP

    keys = MAX_CLIENTS_PER_LOOP + 2
    async with MockServer(_runs(keys), keep_alive=True) as server:
        for i in range(keys):
            co = CrashOverride(model="m", base_url=server.base_url, api_key=f"sk-{i}")
            assert await _recover_async(co) == 42
        open_clients = [client for client in built.clients if not client.is_closed()]
    assert len(built) == keys
    assert len(open_clients) == MAX_CLIENTS_PER_LOOP
    assert open_clients == built.clients[-MAX_CLIENTS_PER_LOOP:]  # least recently used go first


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_failed_build_fails_that_recovery_and_the_next_one_builds_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashoverride._agent import clients

    real_build = clients.build
    attempts: list[int] = []

    def flaky(base_url: str | None, api_key: str) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("no CA bundle")
        return real_build(base_url, api_key)

    monkeypatch.setattr(clients, "build", flaky)
    async with MockServer(_runs(1)) as server:
        co = _app(server)
        handler = co.handler(prompt="Leave `value` set to 42.")
        with pytest.raises(LookupError):
            async with handler:
                raise LookupError("value")
        assert handler.report is not None
        assert "could not set up the agent: OSError: no CA bundle" in handler.report.reason
        assert await _recover_async(co) == 42
    assert len(attempts) == 2


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_waiter_cancelled_during_the_build_leaves_it_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashoverride._agent import clients

    release = threading.Event()
    real_build = clients.build
    attempts: list[int] = []

    def slow(base_url: str | None, api_key: str) -> Any:
        attempts.append(1)
        release.wait(5)
        return real_build(base_url, api_key)

    monkeypatch.setattr(clients, "build", slow)
    leases: list[clients.Lease] = []

    async def take() -> None:
        leases.append(await clients.lease("http://127.0.0.1:9/v1", "sk-shared"))

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as impatient:
            tg.start_soon(take)
            await anyio.sleep(0.05)
            impatient.cancel()  # cancels only what started in this scope: nothing
        async with anyio.create_task_group() as inner:
            inner.start_soon(take)
            await anyio.sleep(0.05)
            inner.cancel_scope.cancel()  # this waiter gives up while the build runs
        release.set()
    assert len(leases) == 1 and len(attempts) == 1
    again = await clients.lease("http://127.0.0.1:9/v1", "sk-shared")
    assert again.client is leases[0].client and len(attempts) == 1
    for lease in (*leases, again):
        await lease.release()


def test_a_loop_closed_by_hand_is_forgotten_without_errors() -> None:
    from crashoverride._agent import clients

    loop = asyncio.new_event_loop()
    try:
        lease = loop.run_until_complete(clients.lease("http://127.0.0.1:9/v1", "sk-hand"))
        loop.run_until_complete(lease.release())
        assert loop in clients._loops
    finally:
        loop.close()  # no shutdown_asyncgens: the cache is never told
    del lease
    # The next lease anywhere forgets it, without finalizing its watcher on the closed loop
    # (which would be an "Exception ignored" error, turned into a failure by -W error).
    with asyncio.Runner() as runner:
        later = runner.run(clients.lease("http://127.0.0.1:9/v1", "sk-hand"))
        runner.run(later.release())
        assert loop not in clients._loops
    gc.collect()


FIRST_RECOVERY = """
import asyncio, json, ssl, sys, threading
from crashoverride import CrashOverride
from crashoverride.testing import MockServer, done, exec_python

loop_thread = threading.get_ident()
loads, imported = [], []
original = ssl.SSLContext.load_verify_locations

def recording(self, *args, **kwargs):
    loads.append(threading.get_ident())
    return original(self, *args, **kwargs)

class ImportedOnTheLoop:
    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == loop_thread and name.split(".")[0] in CLIENT:
            imported.append(name)
        return None

CLIENT = {"openai", "httpx2", "httpcore2"}
ssl.SSLContext.load_verify_locations = recording
sys.meta_path.insert(0, ImportedOnTheLoop())

async def main():
    async with MockServer([exec_python("caller['value'] = 42"), done()]) as server:
        co = CrashOverride(model="m", base_url=server.base_url, api_key="sk-local")
        value = None
        async with co.handler(prompt="Leave `value` set to 42."):
            raise LookupError("value")
        return value

value = asyncio.run(main())
print(json.dumps({"value": value, "loads": len(loads), "on_loop": loads.count(loop_thread),
                  "imported_on_loop": imported}))
"""


@pytest.mark.slow
def test_the_first_recovery_of_a_process_builds_no_client_part_on_the_loop() -> None:
    # A fresh interpreter: the client, its SSL context, its lazily imported API resource and
    # the SDK's trace exporter (whose HTTP client loads certificates on the first run, tracing
    # or not) are all built now.
    out = subprocess.run(
        [sys.executable, "-c", FIRST_RECOVERY], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["value"] == 42
    assert result["loads"] >= 1  # certificates were loaded, in worker threads
    assert result["on_loop"] == 0
    assert result["imported_on_loop"] == []
