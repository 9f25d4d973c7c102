"""``Handler``: the ``with`` / ``async with`` / decorator front of a recovery.

The happy path is the product: a block that does not raise costs two method calls and one
``is None`` test. Everything else (settings derivation, the recovery machinery, structlog,
asyncio, anyio, the SDK) is imported and built only when a matching exception arrives.
"""

from __future__ import annotations

import _thread
import functools
from collections.abc import Callable
from contextvars import ContextVar
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._app import CrashOverride
    from ._block import Block
    from ._recovery import Decision
    from ._report import RecoveryReport
    from ._settings import Settings
    from ._state import RunState

F = TypeVar("F", bound=Callable[..., Any])
_CO_COROUTINE = 0x80
_VAR_LOCK = _thread.allocate_lock()


class Handler:
    """Protects a block or a function; see ``CrashOverride.handler``."""

    __slots__ = ("__weakref__", "_app", "_overrides", "_prompt", "_reports", "_settings")

    def __init__(self, app: CrashOverride, prompt: str, overrides: dict[str, Any] | None) -> None:
        if type(prompt) is not str:
            raise ConfigurationError("prompt", f"expected a str, got {type(prompt).__name__}")
        self._app = app
        self._prompt = prompt
        self._overrides = overrides
        self._reports: ContextVar[RecoveryReport | None] | None = None
        self._settings: Settings | None = None
        if overrides:
            # Validate now: bad input fails at construction, not at the first failure.
            self._settings = app._settings.for_handler({"prompt": prompt, **overrides})

    # -- settings and reports --------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        settings = self._settings
        if settings is None:
            settings = self._settings = self._app._settings.for_handler({"prompt": self._prompt})
        return settings

    @property
    def report(self) -> RecoveryReport | None:
        """The report of this handler's latest recovery in the current context (task/thread)."""
        var = self._reports
        return None if var is None else var.get()

    def _store(self, report: RecoveryReport) -> None:
        var = self._reports
        if var is None:
            with _VAR_LOCK:
                var = self._reports
                if var is None:
                    var = self._reports = ContextVar("crashoverride_report", default=None)
        var.set(report)

    def _apply(self, decision: Decision | None, exc: BaseException) -> bool:
        if decision is None:
            return False
        self._store(decision.report)
        if decision.replacement is not None:
            raise decision.replacement from exc
        return decision.suppress

    # -- with / async with -----------------------------------------------------------------

    def __enter__(self) -> Handler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        settings = self.settings
        if not isinstance(exc, settings.catch):
            return False
        from ._flow import recover_sync

        decision = recover_sync(settings, self._app._limits(), exc, self._block(settings, tb))
        return self._apply(decision, exc)

    async def __aenter__(self) -> Handler:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        settings = self.settings
        if not isinstance(exc, settings.catch):
            return False
        from ._flow import recover_async

        decision = await recover_async(
            settings, self._app._limits(), exc, self._block(settings, tb)
        )
        return self._apply(decision, exc)

    def _block(self, settings: Settings, tb: TracebackType | None) -> Block:
        from ._block import Block
        from ._frames import CallerLocals
        from ._prompt import WITH_BLOCK_BRIEF

        # The first traceback entry is the frame that holds the ``with`` statement.
        frame = tb.tb_frame if tb is not None else None
        caller = CallerLocals(frame) if frame is not None else None
        postcondition = settings.postcondition
        check = None
        if postcondition is not None:
            check = functools.partial(_check_postcondition, postcondition, caller)
        return Block(
            kind="with",
            frame=frame,
            globals_=frame.f_globals if frame is not None else {},
            caller=caller,
            brief=WITH_BLOCK_BRIEF,
            check=check,
        )

    # -- decorator -------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        if not callable(func):
            raise ConfigurationError("func", f"expected a callable, got {type(func).__name__}")
        code = getattr(func, "__code__", None)
        if code is not None:
            is_async = bool(code.co_flags & _CO_COROUTINE)
        else:
            import inspect

            is_async = inspect.iscoroutinefunction(func)
        return self._wrap_async(func) if is_async else self._wrap_sync(func)  # type: ignore[return-value]

    def _wrap_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        handler = self

        @functools.wraps(func)
        def protected(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                settings = handler.settings
                if not isinstance(exc, settings.catch):
                    raise
                from ._flow import recover_sync

                block = handler._call_block(settings, func, args, kwargs, exc)
                decision = recover_sync(settings, handler._app._limits(), exc, block)
                if not handler._apply(decision, exc):
                    raise
                assert decision is not None
                return _call_value(decision)

        return protected

    def _wrap_async(self, func: Callable[..., Any]) -> Callable[..., Any]:
        handler = self

        @functools.wraps(func)
        async def protected(*args: Any, **kwargs: Any) -> Any:
            try:
                return await func(*args, **kwargs)
            except Exception as exc:
                settings = handler.settings
                if not isinstance(exc, settings.catch):
                    raise
                from ._flow import recover_async

                block = handler._call_block(settings, func, args, kwargs, exc)
                decision = await recover_async(settings, handler._app._limits(), exc, block)
                if not handler._apply(decision, exc):
                    raise
                assert decision is not None
                return _call_value(decision)

        return protected

    def _call_block(
        self,
        settings: Settings,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        exc: BaseException,
    ) -> Block:
        from ._block import Block
        from ._prompt import CALL_BRIEF

        frame = _function_frame(exc, func)
        name = getattr(func, "__qualname__", repr(func))
        return Block(
            kind="call",
            frame=frame,
            globals_=getattr(func, "__globals__", None) or (frame.f_globals if frame else {}),
            # The call has ended: its locals are for reading; the result is set explicitly.
            caller=MappingProxyType(dict(frame.f_locals)) if frame is not None else None,
            bindings={"args": args, "kwargs": kwargs, "function": func},
            brief=CALL_BRIEF.format(name=name),
            check=functools.partial(_check_call, settings.postcondition, func, args, kwargs),
            replay=functools.partial(func, *args, **kwargs),
            returns=True,
            fields={"function": name},
        )


def _function_frame(exc: BaseException, func: Callable[..., Any]) -> Any:
    """The decorated function's own frame in the traceback (the wrapper's is first)."""
    target = getattr(func, "__code__", None)
    tb = exc.__traceback__
    first_inner = tb.tb_next if tb is not None else None
    while tb is not None:
        if tb.tb_frame.f_code is target:
            return tb.tb_frame
        tb = tb.tb_next
    return first_inner.tb_frame if first_inner is not None else None


def _call_value(decision: Decision) -> Any:
    if decision.replayed:
        return decision.value
    assert decision.state is not None
    return decision.state.result


def _verdict(value: Any) -> str | None:
    return None if value else "the postcondition does not hold"


def _check_postcondition(postcondition: Callable[..., Any], view: Any, _: RunState) -> Any:
    value = postcondition(view)
    if hasattr(value, "__await__"):
        return _await_verdict(value)
    return _verdict(value)


async def _await_verdict(awaitable: Any) -> str | None:
    return _verdict(await awaitable)


def _check_call(
    postcondition: Callable[..., Any] | None,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    state: RunState,
) -> Any:
    from ._state import NO_RESULT

    def judge(value: Any) -> Any:
        state.result = value
        if postcondition is None:
            return None
        return _check_postcondition(postcondition, MappingProxyType(
            {"result": value, "args": args, "kwargs": kwargs}), state)  # fmt: skip

    if state.rerun:
        # The agent repaired the code and asked for the call to be made again, once.
        try:
            value = func(*args, **kwargs)
        except Exception as again:
            return f"the re-run after repair raised {type(again).__name__}: {again}"
        if hasattr(value, "__await__"):
            return _rerun_async(value, judge)
        return judge(value)
    if state.result is NO_RESULT:
        return "the agent finished without set_result() or rerun()"
    return judge(state.result)


async def _rerun_async(awaitable: Any, judge: Callable[[Any], Any]) -> Any:
    try:
        value = await awaitable
    except Exception as again:
        return f"the re-run after repair raised {type(again).__name__}: {again}"
    verdict = judge(value)
    if hasattr(verdict, "__await__"):
        verdict = await verdict
    return verdict
