"""The ``owner-thread`` placement: how synchronous entry points drive the async pipeline.

``with`` and decorators of sync code, with or without a loop running in the thread: the pipeline
and the agent run on an asyncio loop in a worker thread while the owner thread, blocked in the
failed block, runs every piece of agent code it is sent. An awaitable that agent code produces
is driven in the owner thread on a private loop kept for the whole recovery (the owner's own
loop, if any, is blocked by the caller).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from collections.abc import Awaitable, Callable, Coroutine
from inspect import isawaitable
from typing import Any, TypeVar

from crashoverride._placement.agent_loop import in_own_task
from crashoverride._placement.bridge import JOIN, AgentThread, Dispatch, Job, Placement, Session
from crashoverride._placement.deadline import Deadline

T = TypeVar("T")


class OwnerThread(Placement):
    """Sync entry points: the pipeline runs on a worker thread; the owner serves agent code."""

    name = "owner-thread"

    def __init__(self, jobs: queue.SimpleQueue[Any]) -> None:
        self._jobs = jobs

    async def call(self, job: Job) -> object:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((job, future))
        return await asyncio.wrap_future(future)

    async def run_session(self, session: Session[T], dispatch: Dispatch, deadline: Deadline) -> T:
        """The session on this worker thread's own loop: it serves this one recovery."""
        return await in_own_task(lambda: session(dispatch, None), deadline)


def drive(main: Callable[[Placement], Coroutine[Any, Any, T]], deadline: Deadline) -> T:
    """Run the pipeline ``main`` from synchronous code; the calling thread serves agent code.

    Raises ``TimeoutError`` when nothing finished by ``deadline.hard`` (a stuck agent is left
    behind), and whatever ``main`` raised.
    """
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
    worker = AgentThread(lambda: main(OwnerThread(jobs)))
    worker.done.add_done_callback(lambda _: jobs.put(None))
    private = _PrivateLoop()
    worker.start()
    try:
        while True:
            try:
                item = jobs.get(timeout=max(0.01, deadline.hard - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(deadline.message()) from None
            if item is None:
                break
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                value = job()
                if isawaitable(value):
                    value = private.run(value, deadline)
                future.set_result(value)
            except Exception as exc:
                future.set_exception(exc)
    finally:
        private.close()
        if not worker.done.done():
            worker.cancel()
            worker.join(JOIN)
    return worker.done.result()  # type: ignore[no-any-return]


class _PrivateLoop:
    """An asyncio loop in the owner thread for awaitables agent code produces there.

    Kept for the whole recovery, so objects one snippet creates (a client session) still work
    in the next. The owner's own loop, if one runs in this thread, is blocked by the caller;
    it is hidden while the private loop runs and restored afterwards.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[T], deadline: Deadline) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            return self._loop.run_until_complete(_awaited(awaitable, deadline.at))
        finally:
            asyncio.events._set_running_loop(outer)

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=0.5))
            loop.close()
        finally:
            asyncio.events._set_running_loop(outer)


async def _awaited(awaitable: Awaitable[T], at: float) -> T:
    # The private loop's clock is time.monotonic(), like the deadline's.
    async with asyncio.timeout_at(at):
        return await awaitable
