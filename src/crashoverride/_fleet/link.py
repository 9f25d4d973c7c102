"""The fleet backend's one connection to Redis, usable from any thread, loop or backend.

A ``redis.asyncio`` client belongs to the event loop it was created on, but recoveries run on
the application's loops, on trio, and on the fresh loop of each synchronous recovery. So the
client lives on a loop of its own, in a daemon thread started at the first failure (never on
the happy path), and every operation is sent there and awaited as a future (``_placement.waiting``),
which works on asyncio and trio alike and stays cancellable by the recovery's deadline. After a
``fork`` (Celery prefork, gunicorn) the child starts its own thread and client.

Every operation is bounded by ``op_timeout``, connecting included (a connection attempt that
takes longer goes on in the background for later recoveries); a failure or time-out raises
``Unavailable``, upon which the caller falls back to in-process coordination.

The link is the one owner of its client's lifetime. A redis-py client reconnects whenever it is
used, even after it was closed, so closing it while an operation still holds it (a lease being
renewed, a waiter, a release fired on the way out) would leave a connection open that no one
owns. Every operation is therefore known to the link (``_track``), and ``close`` detaches the
client first (later operations open a new one), stops the operations that may run for long,
lets the others end, and only then closes it.

Stopping takes more than one ``cancel()``: redis-py loses a cancellation that arrives as one
of its commands completes (on Python 3.11, ``asyncio.wait_for``, which it uses to send each
command, returns the result then instead of raising), and the operation goes on as if never
stopped. So ``close`` cancels again until each has ended; and a background operation (the
listener) is retried by the link, never by itself: never after a close, never on the closed
client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from crashoverride._config.coordination import RedisCoordination
from crashoverride._placement import waiting

T = TypeVar("T")
Future = concurrent.futures.Future
# A process's connection attempt may take this many op_timeouts, in the background: the
# recovery that started it waits one op_timeout at most, then goes on in-process.
CONNECT_FACTOR = 5
# How often ``close`` cancels again an operation that is still running (a cancellation lost).
_RECANCEL = 0.05
Operation = Callable[[Any], Awaitable[T]]


class Unavailable(Exception):
    """Redis did not answer (in time): coordinate in this process alone."""


_lock = threading.Lock()
_helper: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, loop): one per process


def _after_fork() -> None:
    # The helper thread does not survive a fork, and its lock may have been held when it
    # happened: the child starts afresh at its first failure.
    global _helper, _lock
    _helper, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _helper_loop() -> asyncio.AbstractEventLoop:
    global _helper
    with _lock:
        if _helper is None or _helper[0] != os.getpid():  # none yet, or inherited by a fork
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="crashoverride-fleet",
                                      daemon=True)  # fmt: skip
            thread.start()
            _helper = (os.getpid(), loop)
        return _helper[1]


class Link:
    """One ``RedisCoordination``'s client in this process, on the shared helper loop."""

    def __init__(self, option: RedisCoordination) -> None:
        self.option = option
        # [pid, client]: a list so the finalizer can close the client without holding the Link.
        self._client: list[Any] = [0, None]
        self._connecting: tuple[int, asyncio.Task[Any]] | None = None  # (pid, attempt)
        # The operations running on the helper loop (this pid's): whether each may run for
        # long (a subscriber, a lease renewal, a wait bounded only by its caller).
        self._ops: tuple[int, dict[asyncio.Task[Any], bool]] = (0, {})
        self._closes = 0  # how many times it was closed: a background operation ends with one
        weakref.finalize(self, _close_later, self._client)

    def _track(self, *, unbounded: bool) -> None:
        """On the helper loop, first in every operation: known until it ends (``close``)."""
        task = asyncio.current_task()
        assert task is not None
        pid, ops = self._ops
        if pid != os.getpid():  # inherited by a fork: those tasks ran in the parent
            self._ops = pid, ops = os.getpid(), {}
        ops[task] = unbounded
        task.add_done_callback(lambda done: ops.pop(done, None))

    def _attempt(self) -> asyncio.Task[Any] | None:
        """On the helper loop: the connection attempt in flight (started if none), or None
        when connected. It is a task of its own, which callers await through a shield: one
        that stops waiting (its ``op_timeout`` is up) leaves it going, bounded by its own
        deadline, and a later caller finds its client. Building the client (importing
        redis-py, the factory) is local work, done here before any caller's bound starts."""
        pid, client = self._client
        if client is not None and pid == os.getpid():
            return None
        pending = self._connecting
        if pending is None or pending[0] != os.getpid() or pending[1].done():
            factory = self.option.client_factory
            client = factory() if factory is not None else _from_url(self.option)
            pending = (os.getpid(), asyncio.ensure_future(self._connect(client)))
            pending[1].add_done_callback(_retrieved)
            self._connecting = pending
        return pending[1]

    async def _connected(self, attempt: asyncio.Task[Any] | None) -> Any:
        return self._client[1] if attempt is None else await asyncio.shield(attempt)

    async def _connect(self, client: Any) -> Any:
        try:
            # A first connection (TCP, TLS, AUTH) may take longer than one command: in the
            # background, while the recovery that started it goes on without Redis. The PING
            # also loads a Cluster client's slot map, which its pub/sub needs (redis-py's
            # ClusterPubSub fails on a client that has not sent a command yet).
            async with asyncio.timeout(CONNECT_FACTOR * self.option.op_timeout):
                await client.ping()
            if self._connecting is None or self._connecting[1] is not asyncio.current_task():
                # Detached by ``close`` meanwhile, its cancellation lost: not the link's client.
                raise Unavailable("the link was closed while connecting")
        except BaseException:  # cleanup and re-raise: never leave a socket behind
            await asyncio.shield(_aclose(client))
            raise
        self._client[:] = [os.getpid(), client]
        return client

    def close(self) -> None:
        """Stop background work and close the client (tests, shutdown); a later failure opens
        a new one. Waits a moment for it; the closing goes on on the helper loop."""
        helper = _helper
        if helper is None or helper[0] != os.getpid():
            return  # no helper loop in this process: nothing of ours runs or is open here
        try:
            asyncio.run_coroutine_threadsafe(self._shut(), helper[1]).result(1.0)
        except Exception:  # best effort: a busy loop, or one gone at interpreter exit
            pass

    async def _shut(self) -> None:
        """On the helper loop: detach the client and the connection attempt, stop what may
        run for long, let the rest end (each within its bound), then close the client, which
        nothing holds any more."""
        mine = os.getpid()
        self._closes += 1  # background operations started before now end, and are not retried
        pid, client = self._client
        self._client[:] = [0, None]  # from here on, an operation opens a client of its own
        pending, self._connecting = self._connecting, None
        ops_pid, ops = self._ops
        running = list(ops.items()) if ops_pid == mine else []
        stop = [task for task, unbounded in running if unbounded]
        waits = {task for task, _ in running}
        if pending is not None and pending[0] == mine:
            stop.append(pending[1])  # the attempt closes its own client as it ends
            waits.add(pending[1])
        while waits:
            for task in stop:
                task.cancel()  # again while it runs: redis-py may have lost the last one
            _, waits = await asyncio.wait(waits, timeout=_RECANCEL)
            stop = [task for task in stop if task in waits]
        if client is not None and pid == mine:
            await _aclose(client)

    def background(self, operation: Operation[Any]) -> None:
        """Run ``operation`` on the helper loop until ``close`` (a subscriber). When it
        raises (Redis went away) or Redis cannot be reached, try again every
        ``retry_after``, with the link's client of the moment; after a ``close``, never."""

        async def main() -> None:
            self._track(unbounded=True)
            closes = self._closes
            while self._closes == closes:
                try:
                    await operation(await self._connected(self._attempt()))
                    return
                except Exception:  # not reachable now: the subscriber waits, as recoveries do
                    if self._closes != closes:
                        return  # closed meanwhile (a cancellation redis-py made an error)
                await asyncio.sleep(self.option.retry_after)

        # In a context of its own: it outlives the caller, and must not carry the caller's
        # context variables (under trio, sniffio's says "trio", and an async approver the
        # subscriber awaits on this asyncio loop would take trio's primitives).
        start = asyncio.run_coroutine_threadsafe
        future = contextvars.Context().run(start, main(), _helper_loop())
        future.add_done_callback(_retrieved)

    def submit(self, operation: Operation[T], bound: float | None) -> Future[T]:
        """Start ``operation(client)`` on the helper loop. ``bound`` (seconds) limits the
        whole of it, connecting included; None: only connecting, to ``op_timeout``."""

        async def main() -> T:
            self._track(unbounded=bound is None)
            attempt = self._attempt()
            if bound is None:
                async with asyncio.timeout(self.option.op_timeout):
                    client = await self._connected(attempt)
                return await operation(client)
            async with asyncio.timeout(bound):
                return await operation(await self._connected(attempt))

        return asyncio.run_coroutine_threadsafe(main(), _helper_loop())

    async def run(self, operation: Operation[T], *, bound: float | None = -1.0) -> T:
        """``operation(client)`` on the helper loop, awaited from any backend; ``Unavailable``
        on a Redis error or time-out. Default bound: ``op_timeout``; None: the caller's scope
        (connecting still within ``op_timeout``)."""
        if bound is not None and bound < 0:
            bound = self.option.op_timeout
        future = self.submit(operation, bound)
        try:
            await waiting.wait_future(future)
        finally:
            if not future.done():  # cancelled (the recovery's deadline): stop it over there too
                future.cancel()
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Unavailable("the operation was cancelled on the coordination thread") from None
        except Exception as exc:  # redis errors, OSError, TimeoutError: all mean "not now"
            raise Unavailable(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def fire(self, operation: Operation[Any]) -> None:
        """Start ``operation`` and do not wait (from sync cleanup paths). Errors are dropped."""
        try:
            self.submit(operation, self.option.op_timeout).add_done_callback(_retrieved)
        except Exception:  # the helper loop is gone (interpreter shutdown): nothing to release
            pass


def _retrieved(future: concurrent.futures.Future[Any] | asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _close_later(state: list[Any], wait: float = 0.0) -> None:
    pid, client = state
    state[:] = [0, None]
    if client is None or pid != os.getpid() or _helper is None:
        return
    try:
        future = asyncio.run_coroutine_threadsafe(_aclose(client), _helper[1])
        if wait:
            future.result(wait)
    except Exception:  # closing is best effort (the loop may be gone at interpreter exit)
        pass


async def _aclose(client: Any) -> None:
    await client.aclose()
    # A Sentinel-managed client (``Sentinel(...).master_for(...)``) leaves its Sentinel's own
    # connections open: redis-py says the caller owns them. Here the caller is the factory we
    # called, so they are closed with the client (a Sentinel reconnects if used again).
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    if manager is not None and hasattr(manager, "aclose"):
        await manager.aclose()


def _from_url(option: RedisCoordination) -> Any:
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    assert option.url is not None
    # No retries: a Redis that does not answer at once is treated as down (fall back in-process),
    # never retried while a recovery waits. Opening a socket (a TLS handshake included) may take
    # as long as the background attempt: no recovery waits for it beyond its op_timeout.
    bounds: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_FACTOR * option.op_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if option.cluster:
        # A Cluster client still follows MOVED and ASK redirects (a slot that moved is not a
        # failure); a node that does not answer is one, as for a single server, and the
        # client asks the cluster for its slots again at the next command.
        return redis.asyncio.RedisCluster.from_url(option.url, **bounds)
    return redis.asyncio.from_url(option.url, **bounds)
