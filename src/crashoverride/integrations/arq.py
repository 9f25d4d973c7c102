"""arq: recover failed jobs inside the worker; run follow-ups as arq jobs.

    from arq.connections import RedisSettings
    from crashoverride.integrations.arq import install, recovered

    @recovered("Return the invoice total in cents; never invent amounts.")
    async def invoice_total(ctx, invoice_id): ...

    class WorkerSettings:
        functions = [invoice_total, send_receipt]
        redis_settings = RedisSettings()

    install(WorkerSettings, crash_override)  # every job protected, follow-ups as arq jobs

``install`` protects every function of the worker's settings (a ``WorkerSettings`` class or the
keyword dict given to ``arq.worker.Worker``) that ``recovered`` did not already wrap, registers
the ``crashoverride.followup`` function, and puts the instance in the worker's ``ctx``.

Each job run is a unit of work whose id is the job id: the calls of declared effects
(``CrashOverride.effect``) are journaled, and arq's next try of the same job (a ``Retry``, a
worker killed mid-job or mid-recovery, the job then run again once its in-progress key expires)
returns what an earlier try's call returned instead of calling it again (across workers with
``RedisCoordination``). A recovered job returns the value the agent set, so arq stores it as
the job's result. arq's own control flow passes untouched: ``Retry``, ``RetryJob`` and every
cancellation (a job timeout, an abort, a shutdown). An unrecovered job re-raises its original
exception (untouched but for a note), so the result, the retries and the job's state are what
they would have been without crashoverride. The recovery runs inside the job, so it counts
against the job's ``timeout``: keep the handler's ``timeout`` below it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from arq.connections import RedisSettings, create_pool
    from arq.constants import default_queue_name, health_check_key_suffix
    from arq.worker import Function, Retry, RetryJob
except ImportError as missing:  # tests/integrations/test_arq.py hides arq to see this
    raise ImportError(
        "crashoverride.integrations.arq needs arq: pip install 'crashoverride[arq]'"
    ) from missing

from crashoverride import ConfigurationError, followups, integration

if TYPE_CHECKING:
    from crashoverride import CrashOverride, Handler
    from crashoverride.followups import FollowupJob

__all__ = [
    "CTX_INSTANCE",
    "CTX_RUNNER",
    "FOLLOWUP_FUNCTION",
    "ArqRunner",
    "install",
    "recovered",
]

FOLLOWUP_FUNCTION = "crashoverride.followup"
CTX_INSTANCE = "crashoverride"  # the worker's ctx key holding the CrashOverride
CTX_RUNNER = "crashoverride_followup_runner"  # ... and the runner follow-ups go to

# A job's function name, id and try are values (fenced): whoever enqueues a job chooses its id.
ARQ_BRIEF = """\
This is the arq job shown above (its `function`, `job_id` and `job_try`: 1 on the first try),
running in an arq worker. `job` holds what arq knows of it (id, function, try, enqueue_time,
args, kwargs) and `ctx` is the context arq passed to the job function (`ctx['redis']` is the
worker's connection). The job function has ended; its locals are readable through `caller`.
Finish in one of two ways: `set_result(value)` (the job returns it and arq stores it as the
job's result), or, after repairing the code, `rerun()` to call the job function once more with
the same arguments. A job can be tried more than once: declared effects already done
(`effects()`) return their recorded result, but check for other side effects of earlier tries
before redoing anything. If neither is right, call give_up: the job then fails as usual and
arq's retry rules apply."""

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# Marks a function ``recovered`` made (or one that must never be wrapped: the follow-up job).
_WRAPPED = "__crashoverride_arq__"


def _control_flow() -> tuple[type[BaseException], ...]:
    # Cancellation (a timeout, an abort, a shutdown) is a BaseException and never caught.
    return (Retry, RetryJob)


class _Protection:
    """One job function's recovery options, and the handler made from them per instance."""

    __slots__ = ("_cached", "crash_override", "name", "options", "prompt", "recover")

    def __init__(
        self,
        prompt: str,
        crash_override: CrashOverride | None,
        recover: bool,
        options: dict[str, Any],
    ) -> None:
        self.prompt = prompt
        self.crash_override = crash_override
        self.recover = recover
        self.options = options
        self.name = ""
        self._cached: tuple[Any, Handler] | None = None

    def handler(self, ctx: MutableMapping[str, Any]) -> Handler | None:
        if not self.recover:
            return None
        instance = self.crash_override or ctx.get(CTX_INSTANCE)
        if instance is None:
            return None
        cached = self._cached
        if cached is not None and cached[0] is instance:
            return cached[1]
        handler = instance.handler(self.prompt, **{"name": self.name, **self.options})
        # Jobs of one worker share the function: a racing duplicate is harmless.
        self._cached = (instance, handler)
        return handler


def recovered(
    prompt: str = "",
    *,
    crash_override: CrashOverride | None = None,
    recover: bool = True,
    **options: Any,
) -> Callable[[F], F]:
    """Protect an arq job function (``async def job(ctx, ...)``).

    Args:
        prompt: The job's objective, written as a postcondition on its return value.
        crash_override: The instance to use; default: the one ``install`` put in ``ctx``.
        recover: False to leave this function alone (``install`` then does not wrap it).
        **options: Any ``CrashOverride.handler`` option (``catch``, ``timeout``, ``tools``,
            ``postcondition``, ``followups``...).
    """

    def decorate(func: F) -> F:
        return _wrap(func, _Protection(prompt, crash_override, recover, options))

    return decorate


def _wrap(func: F, protection: _Protection) -> F:
    if getattr(func, _WRAPPED, None) is not None:
        return func
    if not inspect.iscoroutinefunction(func):
        raise ConfigurationError(
            "func", f"an arq job function is a coroutine function, got {type(func).__name__}"
        )
    protection.name = getattr(func, "__qualname__", repr(func))

    @functools.wraps(func)  # keeps ``__qualname__``: arq names the job function by it
    async def job(ctx: MutableMapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        handler = protection.handler(ctx)
        if handler is None:
            return await func(ctx, *args, **kwargs)
        runner = ctx.get(CTX_RUNNER)
        scope = followups.using(runner) if runner is not None else contextlib.nullcontext()
        # The run is a unit of work named by the job id: arq's next try of the same job (a
        # ``Retry``, a worker killed) finds what the declared effects of earlier tries did (in
        # Redis with ``RedisCoordination``, so on any worker) and does not do it again.
        with scope, integration.unit_of_work(handler, _job_id(ctx)):
            return await _protected(handler, protection.name, func, ctx, args, kwargs)

    setattr(job, _WRAPPED, protection)
    return job  # type: ignore[return-value]


def _job_id(ctx: MutableMapping[str, Any]) -> str | None:
    job_id = ctx.get("job_id")
    return None if job_id is None else str(job_id)


async def _protected(
    handler: Handler,
    name: str,
    func: Callable[..., Awaitable[Any]],
    ctx: MutableMapping[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    try:
        return await func(ctx, *args, **kwargs)
    except Exception as exc:
        if isinstance(exc, _control_flow()) or not integration.catches(handler, exc):
            raise
        # Passed, never kept in a local: it holds ``exc``, whose traceback holds this frame.
        outcome = await integration.arecover(
            handler, exc, functools.partial(_block, handler, name, func, ctx, args, kwargs, exc)
        )
        if not integration.settle(handler, outcome, exc):
            raise
        assert outcome is not None
        return outcome.value


def _block(
    handler: Handler,
    name: str,
    func: Callable[..., Any],
    ctx: MutableMapping[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException,
) -> integration.Block:
    job_id, job_try = _job_id(ctx), ctx.get("job_try")
    enqueued = ctx.get("enqueue_time")
    job = {
        "id": job_id,
        "function": name,
        "try": job_try,
        "enqueue_time": enqueued.isoformat() if isinstance(enqueued, datetime) else None,
        "args": args,
        "kwargs": dict(kwargs),
    }
    return integration.call_block(
        func, (ctx, *args), kwargs, exc,
        postcondition=handler.settings.postcondition,
        kind="arq_job",
        brief=integration.Brief(ARQ_BRIEF, function=name, job_id=job_id, job_try=job_try),
        fields={"function": name, "job_id": job_id},
        bindings={"ctx": ctx, "job": job},
    )  # fmt: skip


# ------------------------------------------------------------------------------ follow-ups


class ArqRunner:
    """Enqueues follow-ups as ``crashoverride.followup`` jobs on ``queue_name`` (a ``JobRunner``).

    The job is durable once Redis has it: ``submit_job`` returns after the enqueue. Any worker
    consuming ``queue_name`` with ``install`` called on its settings runs it. When no worker's
    health-check key shows the queue consumed, each job sent there is reported with a
    ``followup.unconsumed`` warning.

    Args:
        redis_settings: Where the queue lives; default: arq's ``RedisSettings()``.
        queue_name: The queue; default: arq's default queue.
        **enqueue_options: Passed to ``ArqRedis.enqueue_job`` (``_expires``, ``_defer_by``...).
    """

    def __init__(
        self,
        redis_settings: RedisSettings | None = None,
        *,
        queue_name: str = default_queue_name,
        **enqueue_options: Any,
    ) -> None:
        self.redis_settings = redis_settings or RedisSettings()
        self.queue_name = queue_name
        self.enqueue_options = enqueue_options

    def submit_job(self, job: FollowupJob) -> str:
        consumed = _blocking(self._enqueue(job.to_payload(), job.id))
        if not consumed:
            integration.emit(
                "warning", integration.FOLLOWUP_UNCONSUMED, followup_id=job.id,
                queue=self.queue_name, runner="ArqRunner",
                fix=f"start an arq worker on queue {self.queue_name!r} with install() called",
            )  # fmt: skip
        return job.id

    async def _enqueue(self, payload: dict[str, Any], job_id: str) -> bool:
        """Enqueue the job; returns whether a worker's health-check key shows the queue used."""
        pool = await create_pool(self.redis_settings, default_queue_name=self.queue_name)
        try:
            queued = await pool.enqueue_job(
                FOLLOWUP_FUNCTION, payload, _job_id=job_id, _queue_name=self.queue_name,
                **self.enqueue_options,
            )  # fmt: skip
            if queued is None:
                raise RuntimeError(f"arq already holds a job with id {job_id!r}")
            # A running worker refreshes this key at its first poll and every health-check
            # interval: its absence means no worker (with the default key) consumes the queue.
            return bool(await pool.exists(self.queue_name + health_check_key_suffix))
        finally:
            await pool.aclose()


def _blocking(coro: Coroutine[Any, Any, bool]) -> bool:
    # ``submit_job`` is synchronous and may be called on the worker's own loop: arq's client is
    # async, so the enqueue runs on a loop of its own, in a thread when this one has a loop.
    if not integration.loop_running_here():
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, "crashoverride-arq") as pool:
        return pool.submit(asyncio.run, coro).result()


async def _followup(ctx: MutableMapping[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    instance = ctx.get(CTX_INSTANCE)
    if instance is None:
        raise RuntimeError(
            "no CrashOverride for follow-ups: call install(settings, crash_override)"
        )
    job = followups.FollowupJob.from_payload(payload)
    # The application's settings: a handler without options of its own carries them.
    result = await followups.run_job(job, instance.handler().settings, "ArqRunner")
    return {"id": result.id, "outcome": result.outcome, "summary": result.summary,
            "duration_ms": result.duration_ms}  # fmt: skip


# A failing follow-up must never start a recovery of its own: marked as not to be wrapped.
setattr(_followup, _WRAPPED, _Protection("", None, False, {}))


def _get(settings: Any, key: str, default: Any = None) -> Any:
    if isinstance(settings, MutableMapping):
        return settings.get(key, default)
    # ``arq``'s ``get_kwargs`` reads a settings class's own ``__dict__``, not inherited names.
    return vars(settings).get(key, default)


def _set(settings: Any, key: str, value: Any) -> None:
    if isinstance(settings, MutableMapping):
        settings[key] = value
    else:
        setattr(settings, key, value)


def _protect(function: Any) -> Any:
    if isinstance(function, Function):
        if getattr(function.coroutine, _WRAPPED, None) is not None:
            return function
        protection = _Protection("", None, True, {})
        wrapped = _wrap(function.coroutine, protection)
        protection.name = function.name
        return dataclasses.replace(function, coroutine=wrapped)
    if isinstance(function, str):  # arq imports it by name: so do we, to wrap it
        from arq.worker import func

        return _protect(func(function))
    if getattr(function, _WRAPPED, None) is not None:
        return function
    return _wrap(function, _Protection("", None, True, {}))


def install(
    settings: Any,
    crash_override: CrashOverride | None = None,
    *,
    followup_queue: str | None = None,
    followup_redis_settings: RedisSettings | None = None,
    followup_job_timeout: float | None = None,
) -> ArqRunner:
    """Configure an arq worker's settings: protected jobs and durable follow-ups.

    ``settings`` is a ``WorkerSettings`` class (``arq module.WorkerSettings``) or the keyword
    dict given to ``arq.worker.Worker``. Wraps each of its ``functions`` that ``recovered`` did
    not (``recovered(recover=False)`` opts one out), adds the ``crashoverride.followup``
    function, and puts ``crash_override`` and the follow-up runner in the worker's ``ctx``.
    Follow-ups go to ``followup_queue`` (default: this worker's queue, so it runs them itself;
    another queue needs a worker of its own, with ``install`` called, consuming it). Returns the
    runner, usable as ``followup_runner=`` elsewhere in the application.

    A follow-up job runs under arq's job timeout: ``followup_job_timeout`` seconds, default the
    worker's ``job_timeout`` (300 s unless set), below ``followup_timeout``'s default of 600 s.
    Not raised for you: arq waits for the longest function timeout (plus 10 s) before it runs a
    job whose worker died again, and that wait is every job's.
    """
    functions = [_protect(f) for f in _get(settings, "functions", None) or ()]
    names = {f.name if isinstance(f, Function) else f.__qualname__ for f in functions}
    if FOLLOWUP_FUNCTION not in names:
        from arq.worker import func

        functions.append(func(_followup, name=FOLLOWUP_FUNCTION, timeout=followup_job_timeout))
    _set(settings, "functions", functions)

    queue = followup_queue or _get(settings, "queue_name") or default_queue_name
    redis_settings = followup_redis_settings or _get(settings, "redis_settings") or RedisSettings()
    runner = ArqRunner(redis_settings, queue_name=queue)
    ctx = _get(settings, "ctx")
    if ctx is None:
        ctx = {}
        _set(settings, "ctx", ctx)
    if crash_override is not None:
        ctx[CTX_INSTANCE] = crash_override
    ctx[CTX_RUNNER] = runner
    return runner
