"""``TaskGroupRunner``: background work in an anyio task group the application owns.

One runner for follow-up jobs and for the background work an ASGI recovery spawns: it either
opens its own group (``async with TaskGroupRunner():`` around ``main`` or a lifespan) or runs in
a group the caller already has (``TaskGroupRunner(group=...)``, as the ASGI middleware does with
the lifespan's). Work never becomes a task nobody holds: ``join`` waits for it (bounded) and
``drain`` stops intake, waits ``grace`` seconds and cancels what is left.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections import OrderedDict
from typing import Any

from crashoverride._followups.runners import _current
from crashoverride._observe import events
from crashoverride._security.redact import fixed, scanned, scanned_data

# Finished jobs are remembered for ``status`` queries, but a long-running server must not grow.
_HISTORY = 1_000
# Seconds cancelled jobs get to unwind after a drain.
_UNWIND = 1.0


class _Job:
    __slots__ = ("fields", "id", "name", "scope", "state", "work")

    def __init__(self, job_id: str, name: str, work: Any, fields: dict[str, Any]) -> None:
        self.id = job_id
        self.name = name
        self.work = work
        # Every event's fields: the job's names and the caller's fields, redacted once.
        self.fields = scanned_data({"job_id": job_id, "job": name, **fields})
        self.state = "pending"
        self.scope: Any = None


class TaskGroupRunner:
    """Runs jobs in an anyio task group; any anyio backend, ``submit`` from any thread.

    Jobs are async callables, awaitables, or plain callables (run in a worker thread so they
    cannot block the loop). Each job emits ``background.submitted`` and one of
    ``background.succeeded`` / ``.failed`` / ``.cancelled``; a follow-up job adds its own
    ``followup.*`` events.

    Args:
        grace: Seconds running jobs get when the runner shuts down before they are cancelled.
        group: An anyio task group that is already open (e.g. a lifespan's); by default the
            runner opens its own with ``async with``.
    """

    def __init__(self, *, grace: float = 30.0, group: Any = None) -> None:
        self.grace = grace
        self._group = group
        self._own = group is None
        self._token: Any = None
        self._thread = 0
        self._running: dict[str, _Job] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()
        self._idle: Any = None
        self._closed = False
        self._reset: Any = None
        if group is not None:
            self._attach()

    def _attach(self) -> None:
        import anyio
        import anyio.lowlevel

        self._token = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        self._idle = anyio.Event()
        self._idle.set()

    async def __aenter__(self) -> TaskGroupRunner:
        import anyio

        if self._own:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
        self._attach()
        self._reset = _current.set(self)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        _current.reset(self._reset)
        try:
            await self.drain()
        finally:
            result: bool | None = None
            if self._own:
                result = await self._group.__aexit__(*exc_info)
        return result

    # -- submitting --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> list[str]:
        """Names of the jobs not finished yet."""
        return sorted(job.name for job in self._running.values())

    def submit(self, fn: Any, *, name: str, **fields: Any) -> str:
        """Start ``fn`` in the group; returns its job id. ``fields`` go to its events."""
        if not (callable(fn) or inspect.isawaitable(fn)):
            raise TypeError(f"expected an async function, a callable or an awaitable, got {fn!r}")
        if self._group is None or self._closed:
            if inspect.iscoroutine(fn):
                fn.close()  # never awaited: close it so Python does not warn about it
            raise RuntimeError(
                "TaskGroupRunner is not running (use `async with`) or is shutting down: "
                "no new background work"
            )
        job = _Job("job_" + os.urandom(6).hex(), str(name), fn, fields)
        if threading.get_ident() == self._thread:
            self._start(job)
        else:
            import anyio.from_thread

            anyio.from_thread.run_sync(self._start, job, token=self._token)
        return job.id

    def spawn(self, fn: Any, name: str | None = None) -> str:
        """``submit`` with a default name (the agent's ``spawn_background(async_fn)``)."""
        label = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        return self.submit(fn, name=label)

    def status(self, job_id: str) -> str:
        """``pending``, ``running``, ``succeeded``, ``failed``, ``cancelled`` or ``unknown``."""
        job = self._running.get(job_id)
        if job is not None:
            return job.state
        return self._finished.get(job_id, "unknown")

    def _start(self, job: _Job) -> None:
        import anyio

        self._running[job.id] = job
        self._idle = anyio.Event()
        events.emit("info", events.BACKGROUND_SUBMITTED, **job.fields)
        self._group.start_soon(self._run, job, name=f"crashoverride {job.name}")

    async def _run(self, job: _Job) -> None:
        import anyio

        if job.state == "cancelled":  # cancelled by a shutdown before it got to run
            if inspect.iscoroutine(job.work):
                job.work.close()
            events.emit("warning", events.BACKGROUND_CANCELLED,
                      reason=fixed("shut down before it started"), **job.fields)  # fmt: skip
            self._forget(job)
            return
        job.state = "running"
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                try:
                    await _call(job.work)
                except Exception as exc:
                    # A failed job must not take the group (a lifespan, a server) down.
                    job.state = "failed"
                    events.emit("warning", events.BACKGROUND_FAILED, error=scanned(repr(exc)),
                              **job.fields)  # fmt: skip
                else:
                    job.state = "succeeded"
                    events.emit("info", events.BACKGROUND_SUCCEEDED, **job.fields)
            if scope.cancelled_caught:
                job.state = "cancelled"
                events.emit("warning", events.BACKGROUND_CANCELLED,
                          reason=fixed("shutdown grace period over"), **job.fields)  # fmt: skip
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

    # -- waiting and shutting down -----------------------------------------------------------

    async def join(self, timeout: float | None = None) -> list[str]:  # noqa: ASYNC109
        """Wait for the running jobs, at most ``timeout`` seconds; returns the unfinished ids.

        Same name and meaning as ``ThreadRunner.join`` and ``SubprocessRunner.join``.
        """
        import anyio

        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await self._idle.wait()
        return list(self._running)

    async def drain(self) -> None:
        """Stop accepting work; give running jobs ``grace`` seconds, then cancel the rest."""
        self._closed = True
        if await self.join(self.grace):
            self.cancel_all()
            # Let cancelled jobs unwind (their cleanup may need the app's resources); one that
            # shields itself from cancellation is not waited for beyond this.
            await self.join(_UNWIND)

    def cancel_all(self) -> None:
        self._closed = True
        for job in list(self._running.values()):
            if job.scope is not None:
                job.scope.cancel()
            else:  # not started yet: it sees the cancellation as soon as it starts
                job.state = "cancelled"


async def _call(work: Any) -> None:
    import anyio.to_thread

    if inspect.isawaitable(work):
        await work
        return
    call = getattr(work, "__call__", None)  # noqa: B004 - an object with an async __call__
    is_async = call is not None and inspect.iscoroutinefunction(call)
    if inspect.iscoroutinefunction(work) or is_async:
        result = work()
        if inspect.isawaitable(result):
            await result
        return
    # A plain function may block: keep it off the loop. At shutdown it is abandoned, not
    # waited for, once the grace period is over (threads cannot be cancelled).
    await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
