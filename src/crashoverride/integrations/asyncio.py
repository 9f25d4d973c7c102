"""Recover failed coroutines and tasks: asyncio tasks, ``asyncio.TaskGroup``, anyio task groups.

A protected coroutine that raises is handed to a recovery in its own task; the agent either sets
the value the coroutine returns (``set_result(value)``) or repairs the code and has the
coroutine function called once more (``rerun()``). A recovered task returns normally, so its
siblings in a task group are never cancelled; an unrecovered one re-raises its original
exception and the group behaves exactly as it would have without crashoverride.

    from crashoverride.integrations.asyncio import task

    guard = task(crash_override, prompt="Return the parsed page; never invent content.")

    @guard
    async def scrape(url): ...

    async with asyncio.TaskGroup() as tg:          # or anyio.create_task_group()
        tg.create_task(scrape(url))                # a protected coroutine function
        tg.create_task(guard.wrap(fetch(other)))   # any coroutine object (set_result only)

Background follow-ups can live in the application's task group: see
``crashoverride.followups.TaskGroupRunner`` (re-exported here).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import Context
from types import FrameType, MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from crashoverride import ConfigurationError, integration
from crashoverride.followups import TaskGroupRunner

if TYPE_CHECKING:
    from crashoverride import CrashOverride, Handler, RecoveryReport

__all__ = ["TaskGroupRunner", "TaskHandler", "task"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

TASK_BRIEF = """\
This is the task shown above (`task`), a coroutine running concurrently with other tasks, which
keep running while you work. The coroutine has ended; its locals are readable through `caller`;
`args` and `kwargs` are its arguments. Finish it in one of two ways: `set_result(value)` to make
the task return that value, or, after repairing the code, `rerun()` to have the coroutine
function called once more with the same arguments when you finish. A rerun repeats everything
the coroutine did before it failed, except its declared effects already done (`effects()`),
which return their recorded result: if it did another side effect (a charge, a message, a
write not declared), finish the remaining work yourself and use `set_result`. If neither is
right, call give_up: the task then fails exactly as it would have."""

COROUTINE_BRIEF = """\
This is the task shown above (`task`), a coroutine running concurrently with other tasks, which
keep running while you work. The coroutine has ended; its locals are readable through `caller`.
Finish it with `set_result(value)` to make the task return that value. A coroutine object runs
only once, so `rerun()` is not available; still repair the code so later tasks succeed. If no
trustworthy value can be produced, call give_up: the task then fails exactly as it would have."""


def task(app: CrashOverride, prompt: str = "", **options: Any) -> TaskHandler:
    """A recovery handler for coroutines and tasks.

    Args:
        app: The application's ``CrashOverride``.
        prompt: The task's objective, written as a postcondition on its return value.
        **options: Any ``CrashOverride.handler`` option (``catch``, ``timeout``, ``tools``,
            ``postcondition``, ``followups``...).
    """
    return TaskHandler(app.handler(prompt, **options))


class TaskHandler:
    """Protects coroutine functions (decorator) and coroutine objects (``wrap``)."""

    __slots__ = ("_handler", "_tasks")

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        # asyncio keeps only weak references to tasks: these are held until they end.
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def handler(self) -> Handler:
        return self._handler

    @property
    def report(self) -> RecoveryReport | None:
        """The report of the latest recovery in the current context (task)."""
        return self._handler.report

    def __call__(self, func: F) -> F:
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                "func", f"expected a coroutine function, got {type(func).__name__}"
            )
        handler = self._handler

        @functools.wraps(func)
        async def protected(*args: Any, **kwargs: Any) -> Any:
            return await _guarded(handler, func, args, kwargs, None)

        return protected  # type: ignore[return-value]

    def wrap(self, coro: Awaitable[T]) -> Coroutine[Any, Any, T]:
        """A coroutine that awaits ``coro`` and recovers it if it raises (``set_result`` only)."""
        if not inspect.isawaitable(coro):
            raise ConfigurationError("coro", f"expected an awaitable, got {type(coro).__name__}")
        return _guarded(self._handler, None, (), {}, coro)

    def create_task(
        self, coro: Awaitable[T], *, name: str | None = None, context: Context | None = None
    ) -> asyncio.Task[T]:
        """``asyncio.create_task(self.wrap(coro))``, held by this handler until it ends."""
        spawned = asyncio.get_running_loop().create_task(
            self.wrap(coro), name=name, context=context
        )
        self._tasks.add(spawned)
        spawned.add_done_callback(self._tasks.discard)
        return spawned


async def _guarded(
    handler: Handler,
    func: Callable[..., Awaitable[Any]] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    coro: Awaitable[Any] | None,
) -> Any:
    # Each run is a unit of work, its recovery included: ``rerun()`` and agent code find the
    # declared effects (``CrashOverride.effect``) the failed run made instead of repeating them.
    with integration.unit_of_work(handler):
        return await _run(handler, func, args, kwargs, coro)


async def _run(
    handler: Handler,
    func: Callable[..., Awaitable[Any]] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    coro: Awaitable[Any] | None,
) -> Any:
    try:
        if coro is None:
            assert func is not None
            coro = func(*args, **kwargs)
        return await coro
    except Exception as exc:  # cancellation is a BaseException: never caught here
        if not integration.catches(handler, exc):
            raise
        postcondition = handler.settings.postcondition
        # The builders are passed, never kept in a local: they hold ``exc``, whose traceback
        # holds this frame, and that cycle would keep the failed task's locals alive.
        outcome = await integration.arecover(
            handler, exc,
            functools.partial(_call_block, postcondition, func, args, kwargs, exc)
            if func is not None
            else functools.partial(_coroutine_block, postcondition, coro, exc),  # type: ignore[arg-type]
        )  # fmt: skip
        if not integration.settle(handler, outcome, exc):
            raise
        assert outcome is not None
        return outcome.value


def _task_fields(name: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"task": name}
    if integration.on_asyncio():
        current = asyncio.current_task()
        if current is not None:
            fields["asyncio_task"] = current.get_name()
    return fields


def _call_block(
    postcondition: Callable[..., Any] | None,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException,
) -> integration.Block:
    name = getattr(func, "__qualname__", repr(func))
    return integration.call_block(
        func, args, kwargs, exc, postcondition=postcondition, kind="task",
        brief=integration.Brief(TASK_BRIEF, task=name), fields=_task_fields(name),
    )  # fmt: skip


def _coroutine_block(
    postcondition: Callable[..., Any] | None, coro: Awaitable[Any], exc: BaseException
) -> integration.Block:
    frame = _coroutine_frame(exc, coro)
    name = getattr(coro, "__qualname__", type(coro).__qualname__)
    chosen: dict[str, Any] = {}

    def set_result(value: Any) -> str:
        """The value the task returns."""
        chosen["value"] = value
        return "Result set."

    def rerun() -> str:
        raise RuntimeError(
            "rerun() is not available: a coroutine object runs only once; use set_result(value)"
        )

    def check(state: Any) -> Any:
        if "value" not in chosen:
            return "the agent finished without set_result()"
        state.result = chosen["value"]
        if postcondition is None:
            return True
        state.verified_by = "postcondition"  # the application's check: a fix may travel
        view = integration.result_view(state.result)
        return integration.judge(lambda: postcondition(view), what="the postcondition")

    return integration.Block(
        kind="task",
        frame=frame,
        globals_=frame.f_globals if frame is not None else {},
        # The coroutine has ended: its locals are for reading; the result is set explicitly.
        caller=MappingProxyType(dict(frame.f_locals)) if frame is not None else None,
        bindings={"set_result": set_result, "rerun": rerun, "coroutine": coro},
        brief=integration.Brief(COROUTINE_BRIEF, task=name),
        check=check,
        fields=_task_fields(name),
    )


def _coroutine_frame(exc: BaseException, coro: Awaitable[Any]) -> FrameType | None:
    code = getattr(coro, "cr_code", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return tb.tb_frame
        tb = tb.tb_next
    return None
