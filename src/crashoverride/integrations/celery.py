"""Celery: recover failed tasks inside the worker; run follow-ups as a durable Celery task.

    from celery import Celery
    from crashoverride.integrations.celery import CrashOverrideTask, install

    app = Celery("shop", broker=..., backend=..., task_cls=CrashOverrideTask)
    install(app, crash_override)  # the instance tasks use, and the crashoverride.followup task

    @app.task(recovery_prompt="Return the invoice total; never invent amounts.")
    def invoice_total(invoice_id): ...

``CrashOverrideTask`` wraps ``Task.__call__``, which workers and eager mode both honour. Each
run is a unit of work whose id is the task id: the calls of declared effects
(``CrashOverride.effect``) are journaled, and a ``rerun()``, a ``self.retry()`` or a redelivery
of the same task id (``acks_late``, a worker killed) returns what an earlier run's call returned
instead of calling it again (across workers with ``RedisCoordination``). A
recovered task returns the value the agent set, so the result backend stores it. Celery's own
control flow passes untouched: ``Retry``, ``Ignore``, ``Reject``, ``MaxRetriesExceededError``,
``SoftTimeLimitExceeded`` and the task's ``throws``. An unrecovered task re-raises its original
exception, so retries work as usual; with ``autoretry_for`` Celery retries first (it wraps
``run``) and the agent sees the exception only once the retries are exhausted.

Per task (``@app.task(...)`` keywords or subclass attributes): ``crash_override`` (instance; else
the app's ``install``), ``recovery_prompt``, ``recovery_options`` (``CrashOverride.handler``
options) and ``recover`` (False to opt out). ``async def`` task bodies run on a fresh event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import math
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

try:
    import celery
    from celery._state import _task_stack
except ImportError as missing:  # named here, with the extra that installs it
    raise ImportError(
        f"crashoverride.integrations.celery needs Celery ({missing}): "
        "pip install 'crashoverride[celery]'",
        name=missing.name,
    ) from missing

from crashoverride import followups, integration

if TYPE_CHECKING:
    from crashoverride import CrashOverride, Handler
    from crashoverride.followups import FollowupJob

__all__ = [
    "FOLLOWUP_QUEUE",
    "FOLLOWUP_TASK",
    "CeleryRunner",
    "CrashOverrideTask",
    "FollowupFailed",
    "followup_queue",
    "install",
    "queue_consumers",
]

FOLLOWUP_TASK = "crashoverride.followup"
FOLLOWUP_QUEUE = "crashoverride.followups"
CONF_INSTANCE = "crashoverride"
CONF_QUEUE = "crashoverride_followup_queue"

# The task's name, id and retry count are values (fenced): whoever sends a task chooses its id.
CELERY_BRIEF = """\
This is the Celery task shown above (its `task` name, `task_id` and `retries` so far), running
in a worker. `request` holds its request (id, name, args, kwargs, retries, delivery_info) and
`task` the task object. The task body has ended; its locals are readable through `caller`.
Finish in one of two ways: `set_result(value)` (the task returns it and the result backend
stores it), or, after repairing the code, `rerun()` to run the body once more with the same
arguments. A task can be delivered more than once: check for side effects of earlier attempts
before redoing anything. If neither is right, call give_up: the task then fails as usual and
Celery's retry rules apply."""


def _control_flow() -> tuple[type[BaseException], ...]:
    from celery.exceptions import (
        Ignore,
        MaxRetriesExceededError,
        Reject,
        Retry,
        SoftTimeLimitExceeded,
    )

    # A soft time limit means the task is out of time: an agent run would only hit the hard one.
    return (Retry, Ignore, Reject, MaxRetriesExceededError, SoftTimeLimitExceeded)


class CrashOverrideTask(celery.Task):  # type: ignore[misc]
    """A Celery ``Task`` whose failures are recovered in the worker (see the module docs)."""

    crash_override: CrashOverride | None = None
    recovery_prompt: str = ""
    recovery_options: Mapping[str, Any] | None = None
    recover: bool = True
    _co_cached: tuple[Any, Handler] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handler = self._recovery_handler()
        if handler is None:
            return super().__call__(*args, **kwargs)
        # What ``Task.__call__`` does, so the request stays in place while the agent works
        # (``self.request`` in a re-run, the request in the agent's namespace).
        _task_stack.push(self)
        self.push_request(args=args, kwargs=kwargs)
        try:
            runner = _runner_for(self.app)
            scope = followups.using(runner) if runner is not None else contextlib.nullcontext()
            # The run is a unit of work named by its task id: a retry (``self.retry()``) or a
            # redelivery of the same id (``acks_late``, a worker killed) finds what the declared
            # effects of earlier runs did (in Redis with ``RedisCoordination``, so on any
            # worker) and does not do it again.
            with scope, integration.unit_of_work(handler, self.request.id):
                return self._protected(handler, args, kwargs)
        finally:
            self.pop_request()
            _task_stack.pop()

    def _recovery_handler(self) -> Handler | None:
        if not self.recover or self.name is None or self.name.startswith("celery."):
            return None
        instance = self.crash_override or self.app.conf.get(CONF_INSTANCE)
        if instance is None:
            return None
        cached = self._co_cached
        if cached is not None and cached[0] is instance:
            return cached[1]
        options = {"name": self.name, **(self.recovery_options or {})}
        handler = instance.handler(self.recovery_prompt, **options)
        # Task objects are shared by the worker's threads: a racing duplicate is harmless.
        self._co_cached = (instance, handler)
        return handler

    def _recoverable(self, exc: BaseException, handler: Handler) -> bool:
        if isinstance(exc, _control_flow()):
            return False
        expected = self.throws
        if expected and isinstance(exc, tuple(expected)):
            return False
        return integration.catches(handler, exc)

    def _protected(self, handler: Handler, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = _request_view(self)
        try:
            value = self.run(*args, **kwargs)
        except Exception as exc:
            if not self._recoverable(exc, handler):
                raise
            # Passed, never kept in a local: it holds ``exc``, whose traceback holds this frame.
            outcome = integration.recover(
                handler, exc, functools.partial(self._block, handler, args, kwargs, exc, request)
            )
            if not integration.settle(handler, outcome, exc):
                raise
            assert outcome is not None
            return outcome.value
        if inspect.iscoroutine(value):
            return _run_coroutine(self._protected_async(handler, value, args, kwargs, request))
        return value

    async def _protected_async(
        self,
        handler: Handler,
        body: Coroutine[Any, Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: dict[str, Any],
    ) -> Any:
        try:
            return await body
        except Exception as exc:
            if not self._recoverable(exc, handler):
                raise
            outcome = await integration.arecover(
                handler, exc, functools.partial(self._block, handler, args, kwargs, exc, request)
            )
            if not integration.settle(handler, outcome, exc):
                raise
            assert outcome is not None
            return outcome.value

    def _block(
        self,
        handler: Handler,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        exc: BaseException,
        request: dict[str, Any],
    ) -> integration.Block:
        # ``autoretry_for`` replaces ``run`` with a wrapper; the body is the original one.
        body: Callable[..., Any] = self.__dict__.get("_orig_run") or self.run
        return integration.call_block(
            body, args, kwargs, exc,
            postcondition=handler.settings.postcondition,
            kind="celery_task",
            brief=integration.Brief(
                CELERY_BRIEF, task=self.name, task_id=request["id"], retries=request["retries"]
            ),
            fields={"task": self.name, "task_id": request["id"]},
            bindings={"request": request, "task": self},
        )  # fmt: skip


def _request_view(task: Any) -> dict[str, Any]:
    # A task called directly has a bare request: every field may be missing.
    request = task.request

    def field(name: str) -> Any:
        return getattr(request, name, None)

    return {
        "id": field("id"),
        "name": field("task") or task.name,
        "args": tuple(field("args") or ()),
        "kwargs": dict(field("kwargs") or {}),
        "retries": field("retries") or 0,
        "delivery_info": dict(field("delivery_info") or {}),
        "hostname": field("hostname"),
        "eta": field("eta"),
        "is_eager": bool(field("is_eager")),
        "called_directly": bool(field("called_directly")),
    }


def _run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    if not integration.loop_running_here():
        return asyncio.run(coro)
    # Called from code already running a loop (eager mode inside async code): a loop of its own.
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, "crashoverride-celery") as pool:
        return pool.submit(context.run, asyncio.run, coro).result()


# ------------------------------------------------------------------------------ follow-ups


# A broadcast waits its whole timeout for replies; its answer is trusted this long, so a
# burst of follow-ups costs one round trip, not one each.
CONSUMER_CHECK_TIMEOUT = 1.0
CONSUMER_CHECK_TTL = 60.0


def followup_queue(app: celery.Celery) -> str:
    """The queue ``install`` made this app's follow-ups go to."""
    return str(app.conf.get(CONF_QUEUE) or FOLLOWUP_QUEUE)


def queue_consumers(
    app: celery.Celery, queue: str, *, timeout: float = CONSUMER_CHECK_TIMEOUT
) -> set[str] | None:
    """Names of the running workers consuming ``queue``; None when the broker cannot be asked.

    One ``inspect().active_queues()`` broadcast: it waits ``timeout`` seconds for replies. A
    worker busy in a task with the solo pool cannot answer until the task ends.
    """
    try:
        replies = app.control.inspect(timeout=timeout).active_queues() or {}
    except Exception:  # broker down or refusing: unknown, not "nobody"
        return None
    return {
        worker
        for worker, queues in replies.items()
        if any(isinstance(q, dict) and q.get("name") == queue for q in queues or ())
    }


def _consumed_here(app: celery.Celery, queue: str) -> bool:
    # Submitted by a task in a worker that consumes the queue itself: no round trip needed, and
    # a solo-pool worker could not answer a broadcast while it runs this task anyway.
    if app.current_worker_task is None:
        return False
    return queue in app.amqp.queues.consume_from


class _ConsumerWatch:
    """Whether a running worker consumes one queue: asked in a daemon thread (a broadcast
    blocks for its timeout, and a submit may happen on an event loop), at most once per
    ``CONSUMER_CHECK_TTL``; jobs submitted while nobody consumes it are warned about."""

    def __init__(self, app: celery.Celery, queue: str) -> None:
        self.app, self.queue = app, queue
        self._lock = threading.Lock()
        self._checked = -math.inf
        self._consumed: bool | None = None
        self._waiting: list[str] = []  # jobs submitted while a check is under way
        self._checking = False

    def submitted(self, job_id: str) -> None:
        start = unconsumed = False
        with self._lock:
            if time.monotonic() - self._checked < CONSUMER_CHECK_TTL:
                unconsumed = self._consumed is False
            else:
                self._waiting.append(job_id)
                start, self._checking = not self._checking, True
        if unconsumed:
            _warn_unconsumed(self.queue, [job_id])
        if start:
            threading.Thread(
                target=self._check, name="crashoverride-celery-queues", daemon=True
            ).start()

    def _check(self) -> None:
        consumers: set[str] | None = None
        try:
            consumers = queue_consumers(self.app, self.queue)
        finally:
            with self._lock:
                self._checked = time.monotonic()
                self._consumed = None if consumers is None else bool(consumers)
                waiting, self._waiting, self._checking = self._waiting, [], False
        if consumers is not None and not consumers:
            _warn_unconsumed(self.queue, waiting)


def _warn_unconsumed(queue: str, job_ids: list[str]) -> None:
    for job_id in job_ids:
        integration.emit(
            "warning", integration.FOLLOWUP_UNCONSUMED, followup_id=job_id, queue=queue,
            runner="CeleryRunner", fix=f"start a worker that consumes it: -Q celery,{queue}",
        )  # fmt: skip


_watches: weakref.WeakKeyDictionary[Any, dict[str, _ConsumerWatch]] = weakref.WeakKeyDictionary()
_watches_lock = threading.Lock()


def _watch(app: celery.Celery, queue: str) -> _ConsumerWatch:
    with _watches_lock:
        per_queue = _watches.setdefault(app, {})
        watch = per_queue.get(queue)
        if watch is None:
            watch = per_queue[queue] = _ConsumerWatch(app, queue)
        return watch


class CeleryRunner:
    """Sends follow-ups to the ``crashoverride.followup`` task on ``queue`` (a ``JobRunner``).

    The job is durable once the broker has it; any worker consuming ``queue`` with ``install``
    called on its app runs it. In eager mode (``task_always_eager``) it runs in place. When no
    running worker consumes ``queue``, each job sent there is reported with a
    ``followup.unconsumed`` warning (the broadcast asking the workers runs in the background,
    at most once a minute).
    """

    def __init__(self, app: celery.Celery, *, queue: str = FOLLOWUP_QUEUE, **options: Any) -> None:
        self.app = app
        self.queue = queue
        self.options = options

    def submit_job(self, job: FollowupJob) -> str:
        payload = job.to_payload()
        if self.app.conf.task_always_eager:
            # ``throw=False``: a failed follow-up fails its own task, not the recovery that
            # submitted it (``task_eager_propagates`` would raise it here).
            self.app.tasks[FOLLOWUP_TASK].apply(args=(payload,), task_id=job.id, throw=False)
        else:
            self.app.send_task(
                FOLLOWUP_TASK, args=(payload,), queue=self.queue, task_id=job.id, **self.options
            )
            if not _consumed_here(self.app, self.queue):
                _watch(self.app, self.queue).submitted(job.id)
        return job.id


def _runner_for(app: Any) -> CeleryRunner | None:
    queue = app.conf.get(CONF_QUEUE)
    return CeleryRunner(app, queue=queue) if queue else None


class FollowupFailed(Exception):
    """A follow-up ran and did not succeed: the ``crashoverride.followup`` task fails with it.

    So a failed follow-up is a ``FAILURE`` in the result backend and in Flower, never a
    ``SUCCESS`` whose value says it failed. ``result`` is what a succeeded follow-up's task
    returns, with ``outcome`` ``"failed"`` and ``summary`` the reason. The arguments are plain
    values, so the exception survives the result backend's serialization (JSON included).
    """

    def __init__(self, followup_id: str, reason: str, duration_ms: float = 0.0) -> None:
        super().__init__(followup_id, reason, duration_ms)
        self.followup_id, self.reason, self.duration_ms = followup_id, reason, duration_ms

    @property
    def result(self) -> dict[str, Any]:
        return {"id": self.followup_id, "outcome": "failed", "summary": self.reason,
                "duration_ms": self.duration_ms}  # fmt: skip

    def __str__(self) -> str:
        return f"follow-up {self.followup_id} failed: {self.reason}"


def _followup(task: Any, payload: dict[str, Any]) -> dict[str, Any]:
    # One module-level callable for every app and every ``install``: Celery registers the same
    # callable under the same name once, so a second ``install`` is no duplicate task.
    instance = task.app.conf.get(CONF_INSTANCE)
    if instance is None:
        raise RuntimeError("no CrashOverride for follow-ups: call install(app, crash_override)")
    result = followups.run_payload(payload, instance, runner="CeleryRunner")
    if not result.succeeded:
        raise FollowupFailed(str(result.id), str(result.summary), result.duration_ms)
    return {"id": result.id, "outcome": result.outcome, "summary": result.summary,
            "duration_ms": result.duration_ms}  # fmt: skip


def install(
    app: celery.Celery,
    crash_override: CrashOverride | None = None,
    *,
    followup_queue: str = FOLLOWUP_QUEUE,
) -> CeleryRunner:
    """Configure ``app``: the ``CrashOverride`` its tasks use, and durable follow-ups.

    Registers the ``crashoverride.followup`` task and makes recoveries in this app's tasks send
    their follow-ups to ``followup_queue`` (start a worker with ``-Q celery,<queue>``). A
    follow-up that fails fails its task with ``FollowupFailed``. Calling it again replaces the
    instance and the queue; the task stays registered once.
    Returns the runner, usable as ``followup_runner=`` elsewhere in the application.
    """
    if crash_override is not None:
        app.conf[CONF_INSTANCE] = crash_override
    app.conf[CONF_QUEUE] = followup_queue
    # ``recover=False``: a failing follow-up must never start a recovery of its own. The queue
    # is chosen per message by ``CeleryRunner`` (the ``queue`` task attribute is deprecated).
    app.task(name=FOLLOWUP_TASK, shared=False, bind=True, recover=False)(_followup)
    return CeleryRunner(app, queue=followup_queue)
