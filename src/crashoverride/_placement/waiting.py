"""Waiting, on any anyio backend, for work another thread completes.

The primitives every placement and the coordination use to wait for a
``concurrent.futures.Future`` without blocking the event loop, and to run one-off blocking work
in a daemon thread. Nothing here knows about recoveries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")


def _wake_soon(token: anyio.lowlevel.EventLoopToken, fn: Callable[[], None]) -> None:
    native = token.native_token
    try:
        if isinstance(native, asyncio.AbstractEventLoop):
            native.call_soon_threadsafe(fn)
        else:  # trio's TrioToken
            native.run_sync_soon(fn)  # type: ignore[attr-defined]
    except Exception:  # the loop is gone; nobody is waiting any more
        pass


async def wait_future(future: concurrent.futures.Future[Any]) -> None:
    """Wait, on any anyio backend, for a future completed by any thread. Cancellable."""
    if future.done():
        return
    token = anyio.lowlevel.current_token()
    event = anyio.Event()
    owner = threading.get_ident()

    def wake(_: concurrent.futures.Future[Any]) -> None:
        if threading.get_ident() == owner:
            event.set()
        else:
            _wake_soon(token, event.set)

    future.add_done_callback(wake)
    await event.wait()


async def wait_within(future: concurrent.futures.Future[Any], seconds: float) -> bool:
    """``wait_future`` for at most ``seconds``; whether the future is done."""
    with anyio.move_on_after(seconds):
        await wait_future(future)
    return future.done()


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """Run blocking ``fn`` in a fresh daemon thread and wait for it, on any anyio backend.

    Used instead of ``anyio.to_thread`` for one-off work such as importing the SDK: anyio's
    pooled worker threads are not daemons and are tied to a root task, and a loop that closes
    without finishing that task (test runners, servers in threads) leaves them blocking exit.
    Cancelling the wait abandons ``fn``, which finishes on its own.
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(fn())
        except Exception as exc:  # forwarded to the waiting task, which re-raises it
            future.set_exception(exc)
        finally:
            if not future.done():  # an exit or interrupt in this thread: never leave it waiting
                future.set_exception(RuntimeError(f"{fn!r} ended without returning"))

    threading.Thread(target=work, name="crashoverride-worker", daemon=True).start()
    await wait_future(future)
    return future.result()
