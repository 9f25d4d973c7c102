"""Placements: where the pipeline and the agent run, and how agent code reaches the owner.

The Agents SDK is asyncio-only, but agent code (snippets, approvals, checks, replays) must run
on the thread that owns the failed frame, with its context variables. One contract, three
placements:

* ``running-loop`` (``async with`` on asyncio): the pipeline runs in the caller's task; the SDK
  session runs on the process's agent loop, in a thread of its own (``_placement.agent_loop``),
  so its orchestration never stalls the application's loop; each piece of agent code comes
  back to the application's loop and runs there, in the caller's context variables.
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

from crashoverride._placement import agent_loop
from crashoverride._placement.deadline import Deadline
from crashoverride._placement.inside import INSIDE
from crashoverride._placement.waiting import wait_future

T = TypeVar("T")
Job = Callable[[], object]  # agent code, a check, a replay: run as the owner of the frame
Dispatch = Callable[[Job], Awaitable[object]]
# A session gets two ways to reach the application: ``dispatch`` for agent code, and where the
# application's tools (SDK function tools: asyncio code) run, None meaning the session's loop.
Session = Callable[[Dispatch, Dispatch | None], Coroutine[Any, Any, T]]

# How long an owner that stops waiting (deadline, interrupt) lets a cancelled agent thread wind
# down before leaving it behind (a daemon thread; it ends when its blocking call returns).
JOIN = 0.1


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
                # Delivered late, for the reason ``cancel_soon`` gives.
                loop.call_soon_threadsafe(agent_loop.cancel_soon, loop, task)
            except RuntimeError:  # loop already closed: the thread is finishing
                pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# -------------------------------------------------------------------------------- placements


class Placement:
    """Where agent code runs (``call``) and how the SDK session is driven (``run_session``)."""

    name = "running-loop"

    async def call(self, job: Job) -> object:
        """Run ``job`` as the owner of the failed frame; await what it returns."""
        return await run_job(job)

    async def run_session(self, session: Session[T], dispatch: Dispatch, deadline: Deadline) -> T:
        """Run the SDK session on the process's agent loop (``_placement.agent_loop``), off the
        application's loop; ``dispatch`` brings agent code back here, where the frame lives."""
        home = asyncio.get_running_loop()
        # Agent code running here for the session, so ending the recovery ends it too.
        jobs: set[asyncio.Task[Any]] = set()

        async def back(job: Job) -> object:  # on the agent loop
            future = asyncio.run_coroutine_threadsafe(_at_home(dispatch, job, jobs), home)
            return await asyncio.wrap_future(future)

        try:
            # The application's tools and MCP servers belong to its loop: they come back too.
            return await agent_loop.run_session(lambda: session(back, back), deadline)
        finally:
            if jobs:
                for task in jobs:
                    task.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(jobs, timeout=max(0.05, deadline.hard - time.monotonic()))


async def _at_home(dispatch: Dispatch, job: Job, jobs: set[asyncio.Task[Any]]) -> object:
    task = asyncio.current_task()
    assert task is not None  # run_coroutine_threadsafe runs it as a task
    jobs.add(task)
    try:
        return await dispatch(job)
    finally:
        jobs.discard(task)


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

        # Tools stay on the agent's asyncio loop: the SDK's tool wrappers are asyncio code.
        worker = AgentThread(lambda: session(hop, None))
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
