"""The process's agent loop: one daemon thread running an asyncio loop for SDK sessions.

Under the ``running-loop`` placement (``async with`` on asyncio) the Agents SDK's orchestration
of a run (building the agent map, the turn loop, parsing each model answer: a few milliseconds
of CPU a run) used to run on the application's event loop, so a burst of recoveries froze every
other request for hundreds of milliseconds. The session now runs on this loop, in a thread of
its own; everything that is the application's — agent code, ``approve=``, the check, the
application's and MCP servers' tools — is sent back to the application's loop (``dispatch``)
and runs there, as the owner of the failed frame, in the failed task's context variables.

One thread per process, started by the first session; a fork child starts its own (the
parent's thread does not exist there). The loop lives as long as the process, so the model
clients cached per loop (``_agent.clients``) serve every recovery; at exit it is stopped and
its async generators (those clients' watchers) are closed.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio

from crashoverride._placement.deadline import Deadline
from crashoverride._placement.waiting import wait_future, wait_within

T = TypeVar("T")

THREAD_NAME = "crashoverride-loop"

_lock = threading.Lock()
_current: _AgentLoop | None = None
# Sessions left running past the deadline (stuck in a tool the SDK waits for): held here until
# they end, so none is destroyed pending and every result is retrieved.
_DETACHED: set[asyncio.Task[Any]] = set()


class _AgentLoop:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
        try:
            self.thread.start()
        except RuntimeError:  # interpreter shutdown: no new thread, so no agent loop
            self.loop.close()
            raise
        self._ready.wait()

    def _serve(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
            # Stopped (at exit): end what is left, then close the clients' watchers.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=0.5))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.thread.is_alive() and not self.loop.is_closed()

    def stop(self, wait: float) -> None:
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed already
            return
        self.thread.join(wait)


def _new_loop() -> asyncio.AbstractEventLoop:
    # asyncio logs "Using selector: ..." (DEBUG) for every new loop; an application that
    # counts its log records (Scrapy's stats) would see one of ours. Dropped here, for this
    # thread's record only, while the loop is made.
    from asyncio.log import logger

    made_here = threading.get_ident()

    def not_ours(record: logging.LogRecord) -> bool:
        return not (record.thread == made_here and str(record.msg).startswith("Using selector"))

    logger.addFilter(not_ours)
    try:
        return asyncio.new_event_loop()
    finally:
        logger.removeFilter(not_ours)


def agent_loop() -> asyncio.AbstractEventLoop:
    """The process's agent loop, started on first use (and again in a fork child)."""
    global _current
    current = _current
    if current is not None and current.alive():
        return current.loop
    with _lock:
        if _current is None or not _current.alive():
            _current = _AgentLoop()
        return _current.loop


def running() -> asyncio.AbstractEventLoop | None:
    """The agent loop if this process started it (tests look at what is left on it)."""
    current = _current
    return current.loop if current is not None and current.alive() else None


def _forget_in_child() -> None:
    # A fork child has no agent thread: it starts its own on first use. The lock is made anew,
    # as a thread of the parent may have held it at the fork.
    global _lock, _current
    _lock = threading.Lock()
    _current = None
    _DETACHED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _stop_at_exit() -> None:
    current = _current
    if current is not None and current.alive():
        current.stop(wait=1.0)


async def run_session(main: Callable[[], Coroutine[Any, Any, T]], deadline: Deadline) -> T:
    """Run ``main()`` as a task on the agent loop, in a copy of the caller's context variables.

    The SDK handles cancellation of its tool tasks itself and may re-raise a fresh
    CancelledError, which would confuse the caller's cancel scopes (anyio's, TaskGroup's): the
    session is a task of its own, and when the caller is cancelled (the deadline's scope, the
    server) it is cancelled and awaited, shielded and bounded by ``deadline.hard`` (a tool
    blocked in a thread keeps the SDK waiting); the caller's cancellation then propagates
    unchanged. A session still running then is left behind (held, its result retrieved).
    """
    try:
        loop = agent_loop()
    except RuntimeError:  # no new thread at interpreter shutdown: the session runs here
        return await in_own_task(main, deadline)
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    started: list[asyncio.Task[T]] = []
    context = contextvars.copy_context()

    def start() -> None:  # on the agent loop
        if done.cancelled():
            return
        task = loop.create_task(main(), context=context)
        started.append(task)
        task.add_done_callback(lambda ended: _settle(ended, done))

    loop.call_soon_threadsafe(start)
    try:
        await wait_future(done)
    finally:
        if not done.done():
            try:
                loop.call_soon_threadsafe(_cancel_session, loop, started, done)
            except RuntimeError:  # the loop is closed (interpreter exit): nothing runs there
                pass
            with anyio.CancelScope(shield=True):
                await wait_within(done, max(0.05, deadline.hard - time.monotonic()))
            if not done.done() and started:
                keep_until_done(started[0])
    return done.result()


def _settle(task: asyncio.Task[T], done: concurrent.futures.Future[T]) -> None:
    if done.done():
        return
    if task.cancelled():
        done.set_exception(RuntimeError("the agent run was cancelled from inside"))
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


def _cancel_session(
    loop: asyncio.AbstractEventLoop,
    started: list[asyncio.Task[Any]],
    done: concurrent.futures.Future[Any],
) -> None:
    if not started:
        done.cancel()  # not started yet: it never will be
        return
    cancel_soon(loop, started[0])


def cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Cancel ``task``, from a callback on its ``loop``, two iterations from now.

    So a task the SDK created in this iteration (its model turn, whose first step is queued
    behind this callback) takes that step first, and cancelling never drops a coroutine
    unstarted ("coroutine 'run_single_turn' was never awaited").
    """
    loop.call_soon(_cancel_next, loop, task)


def _cancel_next(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    loop.call_soon(task.cancel)


async def in_own_task(main: Callable[[], Coroutine[Any, Any, T]], deadline: Deadline) -> T:
    """Run ``main()`` as a task of its own on the running loop (not the agent loop).

    For the owner-thread placement's worker loop (it serves one recovery), and when the agent
    loop cannot be started (interpreter shutdown refuses new threads). A task of its own: the
    SDK handles cancellation of its tool tasks itself and may re-raise a fresh CancelledError,
    which must not reach the caller's cancel scopes.
    """
    task = asyncio.get_running_loop().create_task(main())
    try:
        await asyncio.wait([task])
    finally:
        if not task.done():
            with anyio.CancelScope(shield=True):  # the caller's scope cancelled us
                # One loop iteration first: a task the SDK has just created (its model turn)
                # takes its first step, so cancelling it never drops a coroutine unstarted.
                await asyncio.sleep(0)
                task.cancel()
                # Bounded: a tool blocked in a thread keeps the SDK waiting for it.
                await asyncio.wait([task], timeout=max(0.05, deadline.hard - time.monotonic()))
            if not task.done():
                keep_until_done(task)
    if task.cancelled():
        raise RuntimeError("the agent run was cancelled from inside")
    return task.result()


def keep_until_done(task: asyncio.Task[Any]) -> None:
    """Hold ``task``, left running past its deadline, until it ends; then retrieve its result."""
    _DETACHED.add(task)
    task.add_done_callback(_forget)


def _forget(task: asyncio.Task[Any]) -> None:
    _DETACHED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: never "exception was never retrieved"
