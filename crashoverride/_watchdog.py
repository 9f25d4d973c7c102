"""Interrupt agent code that is still running synchronously on the owner's thread at the deadline.

Agent snippets run on the thread that owns the failed frame. A snippet that spins in pure Python
(``while True: pass``) holds that thread, so no timeout that needs the thread back (an asyncio
timeout, a cancel scope) can fire. At the recovery's deadline this watchdog asks the interpreter
to raise ``Preempted`` in that thread (``PyThreadState_SetAsyncExc``), only while the snippet is
running:

* arming and firing happen under one lock, and disarming clears a fired-but-not-yet-raised
  exception under that lock, so nothing is ever raised outside the guarded snippet;
* ``Preempted`` derives from ``BaseException``, so agent code's ``except Exception`` cannot
  swallow it.

What it cannot interrupt: blocking C calls (``time.sleep``, ``lock.acquire``, socket reads)
until they return, and code after an ``await`` in a snippet (that runs as a task on the event
loop, where the recovery's own timeout applies). Interrupted code may leave state half-updated;
that is why it fires only once the recovery has already failed by running out of time.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Preempted(BaseException):
    """Raised inside agent code that was still running when the recovery's time ran out."""


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, int] = {}  # token -> thread id
        self._fired: dict[int, int] = {}  # token -> thread id, fired and not yet disarmed
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, thread_id: int) -> int:
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = thread_id
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="crashoverride-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            thread_id = self._fired.pop(token, None)
            if thread_id is not None:
                # Fired but maybe not raised yet: withdraw it so it never lands outside the
                # snippet (a NULL exception clears a pending one; a no-op if it was raised).
                _set_async_exc(thread_id, None)

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, token = heapq.heappop(self._heap)
                    thread_id = self._armed.pop(token, None)
                    if thread_id is not None:  # still running the snippet: interrupt it
                        self._fired[token] = thread_id
                        _set_async_exc(thread_id, Preempted)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cond.wait(timeout)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


_WATCHDOG = _Watchdog()


@contextmanager
def guard(deadline: float | None) -> Iterator[None]:
    """Run the body with the watchdog armed for ``deadline`` (``time.monotonic`` seconds)."""
    if deadline is None:
        yield
        return
    token = _WATCHDOG.arm(deadline, threading.get_ident())
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)
