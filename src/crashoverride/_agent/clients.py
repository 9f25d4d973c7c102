"""OpenAI clients for recoveries: built off the event loop, reused per loop, closed with it.

Building an ``AsyncOpenAI`` costs 100-600 ms, most of it loading CA certificates into a new SSL
context. Done on the application's event loop, every other request waits for it. The two
parts of a client live differently:

* the SSL context does not belong to any loop and is safe to share between threads: one per
  process, built once, in a worker thread;
* the connection pool belongs to the loop it was used on: clients are kept per running loop
  and per (base_url, api key), built in a worker thread, and closed when that loop shuts down.

The end of a loop is observed through asyncio's async-generator hooks: each loop's cache keeps
one suspended async generator registered with the loop, and ``asyncio.run`` and
``asyncio.Runner`` (uvicorn, anyio, the bridge's worker-thread loops) close all such generators
before closing the loop (``loop.shutdown_asyncgens``); its ``finally`` closes the clients.
So a worker thread's loop (the sync ``with`` path, the trio placement) closes its client
when the recovery's loop ends, and the process's agent loop (``_placement.agent_loop``, where
async recoveries on asyncio run their SDK sessions) keeps one client for the process's lifetime.
A loop that cannot report its end this way gets a client per run, closed by that run.

Work moved to a thread still slows the loop while it runs: it competes for the GIL (CA
parsing and some imports hold it for tens of milliseconds). ``prepare`` therefore does the
process-wide first-use work in one go, at ``awarm_up()`` when the application asks for it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import ssl

    from openai import AsyncOpenAI

Key = tuple[str | None, str]  # (base_url, api key)
T = TypeVar("T")
A = TypeVar("A")

# Idle clients one loop keeps. Configurations are few; the bound matters when keys rotate, as
# each retired key would otherwise keep a connection pool open for the life of the loop.
MAX_CLIENTS_PER_LOOP = 4
# One retry for a transient error; the recovery's timeout bounds the rest.
MAX_RETRIES = 1

_lock = threading.Lock()
_loops: dict[asyncio.AbstractEventLoop, _LoopClients] = {}
_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None
_prepared: concurrent.futures.Future[None] | None = None


class Lease:
    """One run's use of a client. ``release`` it when the run ends, cancelled or not."""

    def __init__(self, client: AsyncOpenAI, slot: _Slot | None) -> None:
        self.client = client
        self._slot = slot
        self._owned = slot is None  # no cache on this loop: the run closes its client

    async def release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.users -= 1
            slot.used = time.monotonic()
        elif self._owned:
            self._owned = False
            await close_quietly(self.client)


async def lease(base_url: str | None, api_key: str) -> Lease:
    """A client for (``base_url``, ``api_key``) on the running loop; never built on the loop."""
    loop = asyncio.get_running_loop()
    key = (base_url, api_key)
    clients = await _clients_of(loop)
    if clients is None:
        return Lease(await _start_build(loop, key), None)
    return await clients.lease(key)


def prepare() -> None:
    """Do, once per process and blocking, the first-use work a first run would put on a loop.

    Called by ``import_sdk`` (the warm-up, or the first recovery's import thread). Work in a
    thread still slows the loop (it competes for the GIL), so the warm-up pays it at boot:

    * the SDK's trace exporter: the first ``Runner.run`` creates it, and its HTTP client
      loads CA certificates and imports httpcore2 (~200-400 ms), even with tracing disabled;
    * the shared SSL context of our clients;
    * the lazily imported API resources of ``openai`` (chat completions, Responses).
    """
    prepared, first = _claim_preparation()
    if first:
        _prepare(prepared)
    else:
        prepared.result()


async def prepare_async() -> None:
    """``prepare`` from a loop: in a thread, and concurrent runs wait for the one preparation."""
    prepared, first = _claim_preparation()
    if first:
        try:
            threading.Thread(
                target=_prepare, args=(prepared,), name="crashoverride-prepare", daemon=True
            ).start()
        except RuntimeError:  # interpreter shutdown refuses new threads; do it here
            _prepare(prepared)
    if not prepared.done():
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        prepared.add_done_callback(lambda _: _call_soon(loop, _settle, ready))
        await ready


def _claim_preparation() -> tuple[concurrent.futures.Future[None], bool]:
    global _prepared
    with _lock:
        if _prepared is not None:
            return _prepared, False
        _prepared = concurrent.futures.Future()
        return _prepared, True


def _prepare(prepared: concurrent.futures.Future[None]) -> None:
    # Each step is an optimisation only: what fails here is done later, where it was before.
    try:
        from agents.tracing import get_trace_provider

        get_trace_provider()  # thread-safe; a provider the application installed is kept
        ssl_context()
        import openai.resources.chat
        import openai.resources.responses  # noqa: F401
    except Exception:
        pass
    finally:  # never leave a waiter waiting
        prepared.set_result(None)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():  # a waiter cancelled meanwhile left it cancelled
        future.set_result(None)


def build(base_url: str | None, api_key: str) -> AsyncOpenAI:
    """Build a client (blocking: call it off the loop). Its SSL context is the shared one."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http_client = DefaultAsyncHttpxClient(verify=ssl_context())
    client = AsyncOpenAI(
        api_key=api_key, base_url=base_url, max_retries=MAX_RETRIES, http_client=http_client
    )
    # The API resource is imported on first access (30-100 ms the first time in a process):
    # touch the one the run will use here rather than on the loop. The run speaks chat
    # completions to a ``base_url`` and the Responses API to OpenAI (see ``_agent.run``).
    _ = client.chat.completions if base_url is not None else client.responses
    return client


def ssl_context() -> ssl.SSLContext:
    """The process's SSL context, as httpx2 builds it by default (``SSL_CERT_*`` read once)."""
    global _ssl_context
    # Held while building: a second thread would only load the same certificates again.
    with _ssl_lock:
        if _ssl_context is None:
            import httpx2

            _ssl_context = httpx2.create_ssl_context()
        return _ssl_context


async def close_quietly(client: AsyncOpenAI) -> None:
    try:
        await client.close()
    except Exception:  # closing is best effort; the recovery's outcome is already decided
        pass


def _start_build(loop: asyncio.AbstractEventLoop, key: Key) -> asyncio.Future[AsyncOpenAI]:
    return _off_loop(loop, lambda: build(*key))


def _off_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run blocking ``fn`` in a daemon thread; the future resolves on ``loop``."""
    future: asyncio.Future[T] = loop.create_future()

    # A future cancelled meanwhile (its loop is shutting down) is left alone: a client built
    # for nobody was never used, so it holds no connection and needs no closing.
    def succeed(value: T) -> None:
        if not future.done():
            future.set_result(value)

    def fail(error: Exception) -> None:
        if not future.done():
            future.set_exception(error)

    def work() -> None:
        try:
            value = fn()
        except Exception as exc:  # handed to the waiting run, which reports it
            _call_soon(loop, fail, exc)
        else:
            _call_soon(loop, succeed, value)

    try:
        # A daemon thread rather than the loop's executor: pooled workers are not daemons
        # and a stuck build must never hold up interpreter exit.
        threading.Thread(target=work, name="crashoverride-client", daemon=True).start()
    except RuntimeError:  # interpreter shutdown refuses new threads; do it here, once
        work()
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[A], None], arg: A) -> None:
    try:
        loop.call_soon_threadsafe(fn, arg)
    except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
        pass


async def _clients_of(loop: asyncio.AbstractEventLoop) -> _LoopClients | None:
    """This loop's cache, or None when the loop cannot tell us that it ends."""
    _forget_closed_loops()
    with _lock:
        clients = _loops.get(loop)
    if clients is not None:
        return clients
    firstiter = sys.get_asyncgen_hooks().firstiter
    if getattr(firstiter, "__self__", None) is not loop:
        return None  # not an asyncio-style loop tracking async generators
    if getattr(loop, "_asyncgens_shutdown_called", False):
        return None  # already shutting down: a generator registered now is never closed
    clients = _LoopClients(loop)
    with _lock:
        _loops[loop] = clients
    await clients.watch()
    return clients


@atexit.register
def _forget_closed_loops() -> None:
    # A loop closed without ``shutdown_asyncgens`` (a hand-managed loop) never told us. Its
    # clients cannot be closed any more (that needs the loop), so they are dropped; and its
    # watcher is finished here, before garbage collection would finalize it on the closed
    # loop (an "Event loop is closed" error). Also at exit, before module globals go.
    with _lock:
        closed = [_loops.pop(loop) for loop in list(_loops) if loop.is_closed()]
    for clients in closed:
        clients.abandon()


class _Slot:
    """One cached client (or its build in progress) and how many runs use it."""

    __slots__ = ("future", "used", "users")

    def __init__(self, future: asyncio.Future[AsyncOpenAI]) -> None:
        self.future = future
        self.users = 0
        self.used = time.monotonic()

    def idle(self) -> bool:
        return self.users == 0 and self.future.done()

    def failed(self) -> bool:
        return self.future.done() and (
            self.future.cancelled() or self.future.exception() is not None
        )

    async def close(self) -> None:
        if not self.future.done():
            self.future.cancel()  # never handed out: see ``_off_loop``
        elif not self.failed():
            await close_quietly(self.future.result())


class _LoopClients:
    """The clients of one event loop; used only from that loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots: dict[Key, _Slot] = {}
        self._retired: list[_Slot] = []  # evicted, not yet closed
        self._watcher: AsyncGenerator[None, None] | None = None
        self._abandoned = False

    async def watch(self) -> None:
        self._watcher = self._watch()
        await self._watcher.__anext__()  # the first step registers it with the running loop

    async def _watch(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:  # the loop is shutting down (or was closed and we are abandoning it)
            with _lock:
                if _loops.get(self._loop) is self:
                    del _loops[self._loop]
            if not self._abandoned:
                await self._close_all()

    def abandon(self) -> None:
        """Finish the watcher without the (closed) loop, so it is never finalized on it."""
        self._abandoned = True
        self._slots.clear()
        self._retired.clear()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            closing = watcher.aclose()
            try:
                closing.send(None)  # runs the ``finally`` above, which awaits nothing now
            except StopIteration:
                pass

    async def lease(self, key: Key) -> Lease:
        slot = self._slots.get(key)
        if slot is None:
            await self._evict_idle()
            slot = self._slots.get(key)  # another run may have added it while we closed
            if slot is None:
                slot = self._slots[key] = _Slot(_start_build(self._loop, key))
        slot.users += 1
        try:
            # Shielded: a run cancelled while waiting must not cancel the build others share.
            client = await asyncio.shield(slot.future)
        except BaseException:  # cancellation included: give the slot back, then re-raise
            slot.users -= 1
            if slot.failed() and self._slots.get(key) is slot:
                del self._slots[key]  # the next run builds again
            raise
        return Lease(client, slot)

    async def _evict_idle(self) -> None:
        excess = len(self._slots) - MAX_CLIENTS_PER_LOOP + 1
        if excess <= 0:
            return
        idle = sorted(
            (item for item in self._slots.items() if item[1].idle()), key=lambda i: i[1].used
        )
        evicted = [slot for _, slot in idle[:excess]]
        for key, slot in idle[:excess]:
            del self._slots[key]
            self._retired.append(slot)
        for slot in evicted:
            # Cancelled half-way, the slot stays retired and the loop's shutdown closes it.
            await slot.close()
            if slot in self._retired:
                self._retired.remove(slot)

    async def _close_all(self) -> None:
        slots = [*self._slots.values(), *self._retired]
        self._slots.clear()
        self._retired.clear()
        for slot in slots:
            await slot.close()
