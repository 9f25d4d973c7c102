"""Placements: where the pipeline and the agent run, and how agent code reaches the owner.

The Agents SDK is asyncio-only, but agent code (snippets, approvals, checks, replays) must run
on the thread that owns the failed frame, with its context variables. One contract, three
placements:

* ``running-loop`` (``async with`` on asyncio): the pipeline runs in the caller's task; the agent
  gets a task of its own on the same loop; agent code runs inline on the loop.
* ``worker-thread-hop`` (``async with`` on trio or another anyio backend): the pipeline runs in
  the caller's task; the agent runs on an asyncio loop in a worker thread; each piece of agent
  code hops back to the owner's loop (``anyio.from_thread``).
* ``owner-thread`` (``with`` and decorators of sync code, with or without a loop running in the
  thread): see ``_placement.owner_thread``.

Every placement bounds its waits by the recovery's one ``Deadline``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from inspect import isawaitable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from crashoverride._placement.deadline import Deadline
from crashoverride._placement.inside import INSIDE

T = TypeVar("T")
Job = Callable[[], object]  # agent code, a check, a replay: run as the owner of the frame
Dispatch = Callable[[Job], Awaitable[object]]
Session = Callable[[Dispatch], Coroutine[Any, Any, T]]

# How long an owner that stops waiting (deadline, interrupt) lets a cancelled agent thread wind
# down before leaving it behind (a daemon thread; it ends when its blocking call returns).
JOIN = 0.1
# Agent tasks left running past the deadline (stuck in a thread the SDK waits for): held here
# until they end, so none is destroyed pending and every result is retrieved.
_DETACHED: set[asyncio.Task[Any]] = set()


def loop_running_here() -> bool:
    """Whether an event loop (asyncio or trio) runs in the calling thread."""
    if asyncio.events._get_running_loop() is not None:
        return True
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            return False
        return True
    return False


def on_asyncio() -> bool:
    """Whether the calling thread runs an asyncio loop (trio and others: False)."""
    return asyncio.events._get_running_loop() is not None


def cancel_pending() -> bool:
    """Whether the calling task is being cancelled (a failure raised during cancellation)."""
    if anyio.current_effective_deadline() == -math.inf:
        return True
    if on_asyncio():
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0
    return False


async def run_job(job: Job) -> object:
    value = job()
    if isawaitable(value):
        value = await value
    return value


# ----------------------------------------------------------------------------------- waiting


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


# ------------------------------------------------------------------------------ agent thread


class AgentThread:
    """A daemon thread running one coroutine on a fresh asyncio loop, cancellable from outside."""

    def __init__(self, main: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._main = main
        # The owner's context variables (structlog's bound fields, say) travel with the run.
        self._context = contextvars.copy_context()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="crashoverride-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            value = self._context.run(self._in_context)
        # Not swallowed: handed to the owner thread, which re-raises it there. An interrupt
        # raised by an application tool running here must reach the application as one.
        except (Exception, KeyboardInterrupt, SystemExit, asyncio.CancelledError) as exc:
            self.done.set_exception(exc)
        else:
            self.done.set_result(value)
        finally:
            if not self.done.done():
                self.done.set_exception(RuntimeError("the agent thread ended without a result"))

    def _in_context(self) -> Any:
        # The copied context may say "trio" to sniffio (an ``async with`` on trio): this thread
        # runs asyncio, and libraries asking sniffio (httpx, anyio) must hear that.
        sniffio = sys.modules.get("sniffio")
        if sniffio is not None:
            sniffio.current_async_library_cvar.set(None)
        return asyncio.run(self._wrapped())

    async def _wrapped(self) -> Any:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            if self._cancelled:
                raise asyncio.CancelledError
        return await self._main()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                # Delivered one iteration late, for the reason given in ``_in_own_task``.
                loop.call_soon_threadsafe(_cancel_next_iteration, loop, task)
            except RuntimeError:  # loop already closed: the thread is finishing
                pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _cancel_next_iteration(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    loop.call_soon(task.cancel)


# -------------------------------------------------------------------------------- placements


class Placement:
    """Where agent code runs (``call``) and how the SDK session is driven (``run_session``)."""

    name = "running-loop"

    async def call(self, job: Job) -> object:
        """Run ``job`` as the owner of the failed frame; await what it returns."""
        return await run_job(job)

    async def run_session(self, session: Session[T], dispatch: Dispatch, deadline: Deadline) -> T:
        """Run the SDK session on an asyncio loop; ``dispatch`` sends agent code to ``call``."""
        return await _in_own_task(session, dispatch, deadline)


async def _in_own_task(session: Session[T], dispatch: Dispatch, deadline: Deadline) -> T:
    # The SDK handles cancellation of its tool tasks itself and may re-raise a fresh
    # CancelledError, which would confuse the caller's cancel scopes (anyio's, TaskGroup's).
    # So the agent gets its own task: when the caller is cancelled (the deadline's scope, the
    # server), the agent task is cancelled and settled, and the caller's own cancellation
    # propagates unchanged.
    task = asyncio.get_running_loop().create_task(session(dispatch))
    try:
        await asyncio.wait([task])
    finally:
        if not task.done():
            with anyio.CancelScope(shield=True):
                # One loop iteration first: a task the SDK has just created (its model turn)
                # takes its first step, so cancelling it never drops a coroutine unstarted
                # ("coroutine 'run_single_turn' was never awaited").
                await asyncio.sleep(0)
            task.cancel()
            with anyio.CancelScope(shield=True):
                # Bounded: a tool blocked in a worker thread keeps the SDK waiting for it.
                await asyncio.wait([task], timeout=max(0.05, deadline.hard - time.monotonic()))
            if not task.done():
                _DETACHED.add(task)
                task.add_done_callback(_forget)
    if task.cancelled():
        raise RuntimeError("the agent run was cancelled from inside")
    return task.result()


def _forget(task: asyncio.Task[Any]) -> None:
    _DETACHED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: never "exception was never retrieved"


class Hop(Placement):
    """The agent on a worker thread's asyncio loop; agent code hops back to the owner's loop."""

    name = "worker-thread-hop"

    async def run_session(self, session: Session[T], dispatch: Dispatch, deadline: Deadline) -> T:
        token = anyio.lowlevel.current_token()
        context = contextvars.copy_context()
        serial = threading.Lock()
        # Scopes of agent code running on the owner's loop, so ending the recovery stops it.
        active: set[anyio.CancelScope] = set()

        async def guarded(job: Job) -> object:
            with anyio.CancelScope() as scope:
                active.add(scope)
                try:
                    # The recovery that runs it (``inside``, set by ``dispatch``) into the
                    # captured context too: the change journal and the patch watch read it.
                    return await dispatch(lambda: context.run(_marked, INSIDE.get(), job))
                finally:
                    active.discard(scope)
            raise RuntimeError("the recovery was cancelled while this code ran")

        def in_owner(job: Job) -> object:
            # Serialised so the one captured context is never entered twice at once.
            with serial:
                return anyio.from_thread.run(guarded, job, token=token)

        async def hop(job: Job) -> object:
            return await asyncio.to_thread(in_owner, job)

        worker = AgentThread(lambda: session(hop))
        worker.start()
        try:
            await wait_future(worker.done)
        finally:
            if not worker.done.done():
                worker.cancel()
                for running in list(active):
                    running.cancel()
        return worker.done.result()  # type: ignore[no-any-return]


def _marked(recovery: str | None, job: Job) -> object:
    token = INSIDE.set(recovery)
    try:
        return job()
    finally:
        INSIDE.reset(token)


def placement() -> Placement:
    """The placement for an async entry point on the running backend."""
    return Placement() if on_asyncio() else Hop()
