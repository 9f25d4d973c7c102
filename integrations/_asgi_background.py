"""Follow-up work that must outlive a request: a task group owned by the app's lifespan.

A recovery may start work the client should not wait for (warming a cache again, filing a
ticket, re-checking a repair). It runs here, never as an orphan task: the group is opened when
the lifespan starts, drained with a bounded grace period when it shuts down, and whatever is
still running after that is cancelled.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from crashoverride import _log

SUBMITTED = "background.submitted"
SUCCEEDED = "background.succeeded"
FAILED = "background.failed"
CANCELLED = "background.cancelled"

# Finished jobs are remembered for ``status`` queries, but a long-running server must not grow.
_HISTORY = 1_000
# Seconds cancelled jobs get to unwind at shutdown.
_UNWIND = 1.0


class _Job:
    __slots__ = ("fields", "id", "name", "scope", "state", "work")

    def __init__(self, job_id: str, name: str, work: Any, fields: dict[str, Any]) -> None:
        self.id = job_id
        self.name = name
        self.work = work
        self.fields = fields
        self.state = "pending"
        self.scope: anyio.CancelScope | None = None


class BackgroundRunner:
    """Runs background jobs in the lifespan's task group.

    ``submit`` may be called from the event loop's thread or from any other thread (the job is
    then started on the loop). Jobs are async callables, awaitables, or plain callables (which
    run in a worker thread so they cannot block the loop).
    """

    def __init__(self, group: anyio.abc.TaskGroup, grace: float) -> None:
        self._group = group
        self._grace = grace
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        self._running: dict[str, _Job] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()
        self._idle = anyio.Event()
        self._idle.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> int:
        return len(self._running)

    def submit(self, fn: Any, *, name: str, **fields: Any) -> str:
        """Start ``fn`` in the background; returns its job id. ``fields`` go to its events."""
        if not (callable(fn) or inspect.isawaitable(fn)):
            raise TypeError(f"expected an async function, a callable or an awaitable, got {fn!r}")
        if self._closed:
            if inspect.iscoroutine(fn):
                fn.close()  # never awaited: close it so Python does not warn about it
            raise RuntimeError("the application is shutting down: no new background work")
        job = _Job("job_" + os.urandom(6).hex(), str(name), fn, fields)
        if threading.get_ident() == self._thread:
            self._start(job)
        else:
            anyio.from_thread.run_sync(self._start, job, token=self._token)
        return job.id

    def spawn(self, fn: Any, name: str | None = None) -> str:
        """The agent's ``spawn_background(async_fn)``: ``submit`` with a default name."""
        label = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        return self.submit(fn, name=label)

    def status(self, job_id: str) -> str:
        """``running``, ``succeeded``, ``failed``, ``cancelled`` or ``unknown``."""
        job = self._running.get(job_id)
        if job is not None:
            return job.state
        return self._finished.get(job_id, "unknown")

    def _start(self, job: _Job) -> None:
        self._running[job.id] = job
        self._idle = anyio.Event()
        _log.emit("info", SUBMITTED, job_id=job.id, job=job.name, **job.fields)
        self._group.start_soon(self._run, job, name=f"crashoverride background {job.name}")

    async def _run(self, job: _Job) -> None:
        if job.state == "cancelled":  # cancelled by a shutdown before it got to run
            if inspect.iscoroutine(job.work):
                job.work.close()
            _log.emit("warning", CANCELLED, job_id=job.id, job=job.name,
                      reason="shut down before it started", **job.fields)  # fmt: skip
            self._forget(job)
            return
        job.state = "running"
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                try:
                    await _call(job.work)
                except Exception as exc:
                    # A failed follow-up must not take the lifespan (and the server) down.
                    job.state = "failed"
                    _log.emit("warning", FAILED, job_id=job.id, job=job.name, error=repr(exc),
                              **job.fields)  # fmt: skip
                else:
                    job.state = "succeeded"
                    _log.emit("info", SUCCEEDED, job_id=job.id, job=job.name, **job.fields)
            if scope.cancelled_caught:
                job.state = "cancelled"
                _log.emit("warning", CANCELLED, job_id=job.id, job=job.name,
                          reason="shutdown grace period over", **job.fields)  # fmt: skip
        finally:
            self._forget(job)

    def _forget(self, job: _Job) -> None:
        job.work = None
        job.scope = None
        self._running.pop(job.id, None)
        self._finished[job.id] = job.state
        while len(self._finished) > _HISTORY:
            self._finished.popitem(last=False)
        if not self._running:
            self._idle.set()

    async def drain(self) -> None:
        """Stop accepting work; give running jobs ``grace`` seconds, then cancel the rest."""
        self._closed = True
        with anyio.move_on_after(self._grace):
            await self._idle.wait()
        if self._running:
            self.cancel_all()
            # Let cancelled jobs unwind (their cleanup may need the app's resources); one that
            # shields itself from cancellation is not waited for beyond this.
            with anyio.move_on_after(_UNWIND):
                await self._idle.wait()

    def cancel_all(self) -> None:
        self._closed = True
        for job in list(self._running.values()):
            if job.scope is not None:
                job.scope.cancel()
            else:  # not started yet: it will see the cancellation as soon as it starts
                job.state = "cancelled"


async def _call(work: Any) -> None:
    if inspect.isawaitable(work):
        await work
        return
    if inspect.iscoroutinefunction(work) or _returns_awaitable(work):
        result = work()
        if inspect.isawaitable(result):
            await result
        return
    # A plain function may block: keep it off the loop. At shutdown it is abandoned, not
    # waited for, once the grace period is over (threads cannot be cancelled).
    await anyio.to_thread.run_sync(work, abandon_on_cancel=True)


def _returns_awaitable(work: Callable[..., Any]) -> bool:
    call = getattr(work, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)
