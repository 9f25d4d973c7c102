"""The fleet backend's one connection to Redis, usable from any thread, loop or backend.

A ``redis.asyncio`` client belongs to the event loop it was created on, but recoveries run on
the application's loops, on trio, and on the fresh loop of each synchronous recovery. So the
client lives on a loop of its own, in a daemon thread started at the first failure (never on
the happy path), and every operation is sent there and awaited as a future (``_bridge``),
which works on asyncio and trio alike and stays cancellable by the recovery's deadline. After a
``fork`` (Celery prefork, gunicorn) the child starts its own thread and client.

Every operation is bounded by ``op_timeout``; a failure or time-out raises ``Unavailable``,
upon which the caller falls back to in-process coordination.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _bridge
from ._redis_coordination import RedisCoordination

T = TypeVar("T")
Future = concurrent.futures.Future
# A new connection (the first of a process, a subscriber's) may take this many op_timeouts.
CONNECT_FACTOR = 5
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
        self._connecting: tuple[int, asyncio.Lock] | None = None
        self._background: list[Future[Any]] = []
        weakref.finalize(self, _close_later, self._client)

    async def _connected(self) -> Any:
        # Runs on the helper loop only, so the lock is made and taken on that loop.
        if self._connecting is None or self._connecting[0] != os.getpid():
            self._connecting = (os.getpid(), asyncio.Lock())  # one per helper loop
        async with self._connecting[1]:
            pid, client = self._client
            if client is None or pid != os.getpid():
                factory = self.option.client_factory
                client = factory() if factory is not None else _from_url(self.option)
                try:
                    # The first connection (TCP, TLS, AUTH) may take longer than one command.
                    async with asyncio.timeout(CONNECT_FACTOR * self.option.op_timeout):
                        await client.ping()
                except BaseException:  # cleanup and re-raise: never leave a socket behind
                    await asyncio.shield(client.aclose())
                    raise
                self._client[:] = [os.getpid(), client]
        return client

    def close(self) -> None:
        """Stop background work and close the client (tests, shutdown); a later failure opens
        a new one."""
        for future in self._background:
            future.cancel()
        self._background.clear()
        _close_later(self._client, wait=1.0)

    def background(self, operation: Operation[Any]) -> None:
        """Run ``operation`` on the helper loop until ``close`` (a subscriber)."""
        future = self.submit(operation, None)
        future.add_done_callback(_retrieved)
        self._background.append(future)

    def submit(self, operation: Operation[T], bound: float | None) -> Future[T]:
        """Start ``operation(client)`` on the helper loop; ``bound`` (seconds) limits it, but not
        a first connection (see ``_connected``)."""

        async def main() -> T:
            client = await self._connected()
            if bound is None:
                return await operation(client)
            async with asyncio.timeout(bound):
                return await operation(client)

        return asyncio.run_coroutine_threadsafe(main(), _helper_loop())

    async def run(self, operation: Operation[T], *, bound: float | None = -1.0) -> T:
        """``operation(client)`` on the helper loop, awaited from any backend; ``Unavailable``
        on a Redis error or time-out. Default bound: ``op_timeout``; None: the caller's scope."""
        if bound is not None and bound < 0:
            bound = self.option.op_timeout
        future = self.submit(operation, bound)
        try:
            await _bridge.wait_future(future)
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


def _retrieved(future: concurrent.futures.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _close_later(state: list[Any], wait: float = 0.0) -> None:
    pid, client = state
    state[:] = [0, None]
    if client is None or pid != os.getpid() or _helper is None:
        return
    try:
        future = asyncio.run_coroutine_threadsafe(client.aclose(), _helper[1])
        if wait:
            future.result(wait)
    except Exception:  # closing is best effort (the loop may be gone at interpreter exit)
        pass


def _from_url(option: RedisCoordination) -> Any:
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    assert option.url is not None
    # No retries: a Redis that does not answer at once is treated as down (fall back in-process),
    # never retried while a recovery waits.
    return redis.asyncio.from_url(
        option.url, socket_connect_timeout=option.op_timeout, retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )  # fmt: skip
