"""``Handler``: the ``with`` / ``async with`` / decorator front of a recovery.

The happy path is the product: a block that does not raise costs two method calls and one
``is None`` test. Everything else (settings derivation, the pipeline, structlog, asyncio, anyio,
the SDK) is imported and built only when a matching exception arrives, and async entry points
import it off the event loop.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from crashoverride._effects import journal as _effects
from crashoverride._errors import ConfigurationError
from crashoverride._placement.offloop import load
from crashoverride._security.notes import note_internal_error, redactor_of

if TYPE_CHECKING:
    from crashoverride._app import CrashOverride
    from crashoverride._config.settings import Settings
    from crashoverride._core.recovery import Decision
    from crashoverride._observe.report import RecoveryReport

F = TypeVar("F", bound=Callable[..., Any])
_CO_COROUTINE = 0x80
_CO_GENERATOR = 0x20
_CO_ASYNC_GENERATOR = 0x200
_ENTRY = "crashoverride._core.entry"

# The latest report per handler, per context (task or thread). One variable for every handler,
# holding a weak mapping replaced on write: a handler per loop iteration adds no context entry,
# and a handler that is gone takes its report with it.
_REPORTS: ContextVar[weakref.WeakKeyDictionary[Handler, RecoveryReport] | None] = ContextVar(
    "crashoverride_reports", default=None
)


class Handler:
    """Protects a block or a function; see ``CrashOverride.handler``."""

    # ``_settings`` holds the prompt until the settings are first needed (a failure, mostly):
    # one slot written on the way in, not two (see ``CrashOverride.handler``).
    __slots__ = ("__weakref__", "_app", "_mark", "_settings")

    def __init__(self, app: CrashOverride, prompt: str, overrides: dict[str, Any] | None) -> None:
        if type(prompt) is not str:
            raise ConfigurationError("prompt", f"expected a str, got {type(prompt).__name__}")
        self._app = app
        self._settings: Settings | str = prompt
        self._mark = _IDLE
        if overrides:
            # Validate now: bad input fails at construction, not at the first failure.
            self._settings = app._settings.for_handler({"prompt": prompt, **overrides})
            coordination = app._settings.coordination
            if coordination is not None and coordination.apply_fixes == "eager":
                from crashoverride._fleet.eager import check_handler

                check_handler(app._settings, self._settings)

    # -- settings and reports --------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        settings = self._settings
        if type(settings) is str:
            settings = self._settings = self._app._settings.for_handler({"prompt": settings})
        assert not isinstance(settings, str)
        return settings

    @property
    def report(self) -> RecoveryReport | None:
        """The report of this handler's latest recovery in the current context (task/thread)."""
        reports = _REPORTS.get()
        return None if reports is None else reports.get(self)

    def _store(self, report: RecoveryReport) -> None:
        old = _REPORTS.get()
        reports = weakref.WeakKeyDictionary(old) if old is not None else weakref.WeakKeyDictionary()
        reports[self] = report
        _REPORTS.set(reports)

    def _settle(self, decision: Decision | None, exc: BaseException) -> bool:
        """Act on the outcome: True to suppress ``exc``; raises what replaces it, if anything."""
        if decision is None:
            return False
        if decision.report is not None:
            self._store(decision.report)
        return decision.settle(exc)

    # -- the two ways in (the public contract wraps these; see ``crashoverride.integration``) --

    def recover(self, exc: BaseException, block: Callable[[], Any]) -> Decision | None:
        """Recover ``exc`` from sync code; ``block`` builds the Block. None: let it propagate."""
        if _stack_left() < _STACK_NEEDED:
            return None  # see _STACK_NEEDED
        try:
            from crashoverride._core.entry import recover_sync

            built = block()
        except Exception as problem:
            _internal(exc, problem, self)
            return None
        return recover_sync(self._app, self.settings, exc, built)

    async def arecover(self, exc: BaseException, block: Callable[[], Any]) -> Decision | None:
        """Recover ``exc`` from async code on any anyio backend. None: let it propagate."""
        if _stack_left() < _STACK_NEEDED:
            return None  # see _STACK_NEEDED
        try:
            await load(_ENTRY)  # off the loop, the first time
            from crashoverride._core.entry import recover_async

            built = block()
        except Exception as problem:
            _internal(exc, problem, self)
            return None
        return await recover_async(self._app, self.settings, exc, built)

    # -- with / async with -----------------------------------------------------------------

    # A ``with`` opens no unit of work: it notes where the journal's numbering stood
    # (``_effects.serial``), and if it fails, its unit is the enclosing one, or else the
    # effect calls its thread made since then (``_effects.ambient_unit``). A context variable
    # set on the way in and back on the way out would double the happy path's cost.
    # ``_mark``: ``_IDLE``; that number while one ``with`` runs; ``_SHARED`` once the handler
    # was entered again while open (nested in itself, shared by threads or tasks): a second
    # mark has no room here, so from then on every entry opens a unit in its context, and the
    # exits check which entry they end.

    def __enter__(self) -> Handler:
        if self._mark == -1:  # _IDLE (a constant: the happy path pays no global's lookup)
            self._mark = _effects.serial
        else:
            self._mark = _SHARED
            if _effects.declared:
                try:
                    _effects.opened(self)
                except RecursionError:  # see _NO_ROOM
                    pass
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None and self._mark >= 0:
            self._mark = -1  # _IDLE
            return False
        try:
            return self._exited(exc, tb)
        except RecursionError:  # no room even for that call (see _NO_ROOM): ``exc`` goes on
            return False

    def _exited(self, exc: BaseException | None, tb: TracebackType | None) -> bool:
        """``__exit__`` past the happy path: a failure, or a shared handler's entry."""
        mark = self._mark
        attempt = None
        if mark >= 0:
            self._mark = _IDLE
        else:  # shared: an entry that opened a unit, or the first one (its mark is lost)
            try:
                attempt = _effects.closed(self)
            except RecursionError:  # see _NO_ROOM
                pass
        if exc is None:
            return False
        try:
            settings = self.settings
            if not isinstance(exc, settings.catch):
                return False
            # The first traceback entry is the frame that holds the ``with`` statement.
            frame = tb.tb_frame if tb is not None else None
            # A partial, not a lambda: a closure would make ``settings`` and ``frame`` cell
            # variables, paid on every exit, including the happy path's.
            block = functools.partial(_with_block, settings, frame, attempt, mark)
            decision = self.recover(exc, block)
        except RecursionError:  # not even the room to look (see _STACK_NEEDED): ``exc`` goes on
            return False
        return self._settle(decision, exc)

    async def __aenter__(self) -> Handler:
        if _effects.declared:
            try:
                _effects.opened(self)
            except RecursionError:  # see _NO_ROOM
                pass
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        attempt = None
        if _effects.declared:
            try:
                attempt = _effects.closed(self)
            except RecursionError:  # see _NO_ROOM
                pass
        if exc is None:
            return False
        try:
            settings = self.settings
            if not isinstance(exc, settings.catch):
                return False
            frame = tb.tb_frame if tb is not None else None
            decision = await self.arecover(
                exc, functools.partial(_with_block, settings, frame, attempt, _SHARED)
            )
        except RecursionError:  # not even the room to look (see _STACK_NEEDED): ``exc`` goes on
            return False
        return self._settle(decision, exc)

    # -- decorator -------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        if not callable(func):
            raise ConfigurationError("func", f"expected a callable, got {type(func).__name__}")
        code = getattr(func, "__code__", None)
        if code is not None:
            flags = code.co_flags
        else:
            import inspect

            flags = _CO_COROUTINE if inspect.iscoroutinefunction(func) else 0
            if inspect.isgeneratorfunction(func):
                flags = _CO_GENERATOR
            elif inspect.isasyncgenfunction(func):
                flags = _CO_ASYNC_GENERATOR
        if flags & (_CO_GENERATOR | _CO_ASYNC_GENERATOR):
            asynchronous = bool(flags & _CO_ASYNC_GENERATOR)
            kind, use = ("an async", "async with") if asynchronous else ("a", "with")
            raise ConfigurationError(
                "func",
                f"{getattr(func, '__qualname__', func)!r} is {kind} generator function: its "
                "body runs while it is iterated, after the decorator has returned, so the "
                f"decorator cannot protect it. Protect the code that iterates it with `{use} "
                "co.handler(...)`, or decorate a regular function it calls.",
            )
        return self._wrap_async(func) if flags & _CO_COROUTINE else self._wrap_sync(func)  # type: ignore[return-value]

    # A decorated call's failure: None unless ``exc`` is caught and a recovery decided. In
    # methods of their own so the wrappers' ``except`` blocks hold one guarded call each.
    def _call_builder(
        self, exc: Exception, func: Callable[..., Any], args: Any, kwargs: Any
    ) -> Callable[[], Any] | None:
        settings = self.settings
        if not isinstance(exc, settings.catch):
            return None
        return functools.partial(_call_block, settings, func, args, kwargs, exc)

    def _recover_call(
        self, exc: Exception, func: Callable[..., Any], args: Any, kwargs: Any
    ) -> Decision | None:
        build = self._call_builder(exc, func, args, kwargs)
        try:
            return None if build is None else self.recover(exc, build)
        finally:
            del build  # it holds the exception, whose traceback holds the caller's frame

    async def _arecover_call(
        self, exc: Exception, func: Callable[..., Any], args: Any, kwargs: Any
    ) -> Decision | None:
        build = self._call_builder(exc, func, args, kwargs)
        try:
            return None if build is None else await self.arecover(exc, build)
        finally:
            del build  # it holds the exception, whose traceback holds the caller's frame

    def _wrap_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        handler = self

        @functools.wraps(func)
        def protected(*args: Any, **kwargs: Any) -> Any:
            unit = _effects.declared  # each call is a unit of work (see ``__enter__``)
            if unit:
                try:
                    _effects.opened(handler)
                except RecursionError:  # see _NO_ROOM
                    unit = False
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                try:
                    decision = handler._recover_call(exc, func, args, kwargs)
                except RecursionError:  # not even the room to look (see _STACK_NEEDED)
                    decision = None
                if decision is None or not handler._settle(decision, exc):
                    raise
                assert decision is not None
                return decision.value
            finally:
                if unit:
                    try:
                        _effects.closed(handler)
                    except RecursionError:  # see _NO_ROOM
                        pass

        return protected

    def _wrap_async(self, func: Callable[..., Any]) -> Callable[..., Any]:
        handler = self

        @functools.wraps(func)
        async def protected(*args: Any, **kwargs: Any) -> Any:
            unit = _effects.declared  # each call is a unit of work (see ``__enter__``)
            if unit:
                try:
                    _effects.opened(handler)
                except RecursionError:  # see _NO_ROOM
                    unit = False
            try:
                return await func(*args, **kwargs)
            except Exception as exc:
                try:
                    decision = await handler._arecover_call(exc, func, args, kwargs)
                except RecursionError:  # not even the room to look (see _STACK_NEEDED)
                    decision = None
                if decision is None or not handler._settle(decision, exc):
                    raise
                assert decision is not None
                return decision.value
            finally:
                if unit:
                    try:
                        _effects.closed(handler)
                    except RecursionError:  # see _NO_ROOM
                        pass

        return protected


_IDLE = -1
_SHARED = -2  # see ``Handler.__enter__``
# A failure raised this close to the recursion limit (a runaway recursion, mostly) is not
# recovered here: the recovery's own calls would hit the limit and fail, or worse, replace
# the user's exception. It propagates untouched, unmarked, to an outer frame of a protected
# call that has the room. (Where even that check cannot run, the caller's ``except
# RecursionError`` lets the exception go on in the same way.)
_STACK_NEEDED = 120
# _NO_ROOM: where not even a unit of work can be opened or closed (a runaway recursion through
# a protected call or block), the code runs without one, and the recursion fails where it would
# have, in the application's code, not in ours.


def _stack_left() -> int:
    """Frames left before the recursion limit, counted from the caller (a failure path only)."""
    depth = 0
    frame: Any = sys._getframe(1)
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return sys.getrecursionlimit() - depth


def _with_block(settings: Settings, frame: Any, attempt: Any, mark: int) -> Any:
    """``mark``: where the journal's numbering stood when the block began (< 0: unknown)."""
    from crashoverride._core.block import with_block

    # The unit itself is made here, on the failure path: a block that ends well makes none.
    # The block's own (an overlapping entry's, or an ``async with``'s), else the enclosing
    # one, else (a ``with`` that opened none) this thread's calls since it began.
    if attempt is not None:
        unit = attempt.unit
    else:
        unit = _effects.current_unit()
        if unit is None:
            unit = _effects.ambient_unit(mark if mark >= 0 else None)
    return with_block(settings.postcondition, frame, unit)


def _call_block(
    settings: Settings,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException,
) -> Any:
    from crashoverride._core.block import call_block

    return call_block(func, args, kwargs, exc, postcondition=settings.postcondition)


def _internal(exc: BaseException, problem: BaseException, handler: Handler) -> None:
    """crashoverride could not even start: say so on the user's exception, which propagates."""
    from crashoverride._core.seen import mark, seen

    if seen(exc, handler._app):
        return  # noted once already (a deep recursion fails at every level on its way out)
    mark(exc, handler._app)
    note_internal_error(exc, problem, redactor_of(lambda: handler.settings))
