"""Where the agent runs, and how tool calls get back to the thread that owns the failed frame.

The Agents SDK is asyncio-only, but tool code must run in the owner's thread (its frame, its
contextvars, its event loop for top-level ``await``). Four placements:

* ``async with`` on asyncio: the agent runs on the application's loop; tool calls run inline.
* ``async with`` on trio (or another anyio backend): the agent runs on an asyncio loop in a
  worker thread; each tool call hops back to the owner's loop with ``anyio.from_thread``.
* ``with`` and no loop running in this thread: a temporary asyncio loop in this thread.
* ``with`` while a loop runs in this thread (sync code called from async code): the agent runs
  on a worker thread's loop and the blocked owner thread executes the tool calls it is sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from inspect import isawaitable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

T = TypeVar("T")
Job = Callable[[], Any]
Dispatch = Callable[[Job], Awaitable[Any]]
Session = Callable[[Dispatch], Coroutine[Any, Any, T]]

# How long past the recovery deadline an owner waits for a stuck agent before leaving it. Keeps
# the promise "the original exception is back within ``timeout`` + 1 s" with room to spare.
GRACE = 0.5
# How long an owner that stops waiting (deadline, interrupt) lets a cancelled agent thread wind
# down before leaving it behind (it is a daemon thread and ends when its blocking call returns).
_JOIN = 0.1


def loop_running_here() -> bool:
    """Whether an event loop (asyncio or trio) is running in the calling thread."""
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
    return asyncio.events._get_running_loop() is not None


async def _run_job(job: Job) -> Any:
    value = job()
    if isawaitable(value):
        value = await value
    return value


def placement_sync() -> str:
    return "worker-thread-blocking" if loop_running_here() else "temporary-loop"


def placement_async() -> str:
    return "running-loop" if on_asyncio() else "worker-thread-hop"


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
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="crashoverride-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            value = asyncio.run(self._wrapped())
        # Not swallowed: handed to the owner thread, which re-raises it there. An interrupt
        # raised by an application tool running here must reach the application as one.
        except (Exception, KeyboardInterrupt, SystemExit, asyncio.CancelledError) as exc:
            self.done.set_exception(exc)
        else:
            self.done.set_result(value)
        finally:
            if not self.done.done():
                self.done.set_exception(RuntimeError("the agent thread ended without a result"))

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
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # loop already closed: the thread is finishing
                pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# -------------------------------------------------------------------------------- placements


def run_sync(session: Session[T], deadline: float) -> T:
    """Run ``session`` from synchronous code; returns its result or raises what it raised."""
    if not loop_running_here():
        with asyncio.Runner() as runner:
            # The SDK runs sync tools in the loop's default executor; closing the loop must
            # not wait for one that blocks past the deadline (asyncio.Runner would, forever).
            runner.get_loop().set_default_executor(_DetachedExecutor())
            return runner.run(session(_run_job))
    return _run_blocking_owner(session, deadline)


class _DetachedExecutor(concurrent.futures.ThreadPoolExecutor):
    """A temporary loop's executor: shutting it down never waits for a running call."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="crashoverride-tool")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


def _run_blocking_owner(session: Session[T], deadline: float) -> T:
    jobs: queue.SimpleQueue[tuple[Job, concurrent.futures.Future[Any]] | None] = queue.SimpleQueue()

    async def dispatch(job: Job) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        jobs.put((job, future))
        value = await asyncio.wrap_future(future)
        # The owner's own loop is blocked by the caller, so awaitables finish on the agent loop.
        if isawaitable(value):
            value = await value
        return value

    worker = AgentThread(lambda: session(dispatch))
    worker.done.add_done_callback(lambda _: jobs.put(None))
    worker.start()
    try:
        while True:
            try:
                item = jobs.get(timeout=max(0.01, deadline + GRACE - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("the recovery did not finish within its timeout") from None
            if item is None:
                break
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except Exception as exc:
                future.set_exception(exc)
    finally:
        if not worker.done.done():
            worker.cancel()
            worker.join(_JOIN)
    return worker.done.result()  # type: ignore[no-any-return]


async def run_async(session: Session[T], deadline: float) -> T:
    """Run ``session`` from async code on any anyio backend."""
    if on_asyncio():
        return await _run_shielded(session, deadline)
    return await _run_hopping(session, deadline)


async def _run_shielded(session: Session[T], deadline: float) -> T:
    # The SDK handles cancellation of its tool tasks itself and may re-raise a fresh
    # CancelledError, which would confuse the caller's cancel scopes (anyio's, TaskGroup's).
    # So the agent gets its own task: when the caller is cancelled, the agent task is
    # cancelled too and the caller's own CancelledError propagates unchanged.
    task = asyncio.get_running_loop().create_task(session(_run_job))
    try:
        # Bounded: after cancelling a tool that runs in a worker thread (a blocking sync
        # tool), the SDK waits for that thread; the owner does not wait with it.
        await asyncio.wait([task], timeout=max(0.0, deadline + GRACE - time.monotonic()))
        if not task.done():
            raise TimeoutError("the recovery did not finish within its timeout")
        return task.result()
    finally:
        if not task.done():
            task.cancel()


async def _run_hopping(session: Session[T], deadline: float) -> T:
    token = anyio.lowlevel.current_token()
    context = contextvars.copy_context()
    serial = threading.Lock()
    # Scopes of agent code running on the owner's loop, so cancelling the recovery stops it.
    active: set[anyio.CancelScope] = set()

    async def guarded(job: Job) -> Any:
        with anyio.CancelScope() as scope:
            active.add(scope)
            try:
                return await _run_job(lambda: context.run(job))
            finally:
                active.discard(scope)
        raise RuntimeError("the recovery was cancelled while this code ran")

    def in_owner(job: Job) -> Any:
        # Serialised so the one captured context is never entered twice at once.
        with serial:
            return anyio.from_thread.run(guarded, job, token=token)

    async def dispatch(job: Job) -> Any:
        return await asyncio.to_thread(in_owner, job)

    worker = AgentThread(lambda: session(dispatch))
    worker.start()
    try:
        with anyio.move_on_after(max(0.0, deadline + GRACE - time.monotonic())) as scope:
            await wait_future(worker.done)
        if scope.cancelled_caught:
            raise TimeoutError("the recovery did not finish within its timeout")
    finally:
        if not worker.done.done():
            worker.cancel()
            for running in list(active):
                running.cancel()
    return worker.done.result()  # type: ignore[no-any-return]
