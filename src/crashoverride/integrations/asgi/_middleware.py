"""``CrashOverrideMiddleware``: its options, and where each ASGI scope type goes (the ``http``
path is ``_http``; a websocket connection's recorder is ``_websocket``, the rest of a connection
after a failure ``_ws_session``; the lifespan is here)."""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterable
from typing import Any

import anyio

from crashoverride import ConfigurationError, CrashOverride, integration
from crashoverride.followups import TaskGroupRunner
from crashoverride.integration import UNSET
from crashoverride.integrations.asgi import _options as check
from crashoverride.integrations.asgi._exchange import ASGIApp, Message, Receive, Scope, Send
from crashoverride.integrations.asgi._http import Requests
from crashoverride.integrations.asgi._websocket import Connection, unrecoverable

DEFAULT_MAX_REPLAY_BODY = 4 * 1024 * 1024
DEFAULT_MAX_MESSAGE = 1024 * 1024


class CrashOverrideMiddleware:
    """Recover failed HTTP requests with a CrashOverride agent.

    Args:
        app: The ASGI application to protect.
        crash_override: The application's ``CrashOverride``.
        prompt: The recovery objective for requests (added to the built-in request brief).
        include: Path patterns to protect (globs like ``"/api/*"`` or compiled regexes);
            default: every path.
        exclude: Path patterns never to protect; wins over ``include``.
        methods: HTTP methods to protect; default: all (the agent is told which are not
            idempotent).
        catch: Exception class(es) that trigger a recovery; default: the application's.
        timeout: Budget of one request's recovery, in seconds; default: the application's
            ``timeout``. Keep it under your proxy's timeout so the client gets an answer
            (recovered or the 500) before it gives up.
        max_replay_body: Request bodies up to this many bytes are kept for replay.
        request_id_header: Header whose value is logged as ``request_id`` with every event, and
            echoed on a recovered response.
        idempotency_header: Header whose value is the client's idempotency key: a request
            carrying one is a unit of work a retry with the same key (same method, path,
            query and credentials) finds again, so the declared effects
            (``CrashOverride.effect``) it made are not made twice. ``None``: no request has
            one. See ``integrations.asgi._units``.
        shutdown_grace: Seconds background work gets to finish when the app shuts down.
        name: Handler name in events and reports (default ``"request"``).
        tools: Extra agent tools for request recoveries.
        mcp_servers: Extra MCP servers for request recoveries.
        model: Overrides the application's model.
        max_turns: Overrides the application's ``max_turns``.
        followups: Follow-up objectives added to the application's (see
            ``crashoverride.followups``). Follow-ups of a request recovery run in the lifespan's
            task group unless a ``followup_runner`` is configured.
        warm_up: At lifespan startup, import the Agents SDK (1-3 s, in a worker thread, before
            the app's own startup runs) rather than at the first failure, where the import
            would compete with every other request for the interpreter. Skipped when no
            recovery could run (no credentials: see ``integration.awarm_up``). ``False`` keeps the
            import lazy: faster boots, and a first recovery that stalls the server briefly.
        repair_after_start: When a response fails after it started (a stream cut short), run a
            repair-only recovery: nothing can be sent any more, but the agent repairs the code
            so later requests work (event ``recovery.repaired``). Off by default: such failures
            are only logged (``recovery.skipped``). Background tasks are recovered either way.
        websockets: Recover websocket endpoints per message (``False``: websocket connections
            pass straight through). ``include`` and ``exclude`` apply to their paths too;
            ``methods`` does not.
        max_message: The last message a websocket endpoint received is kept for a replay when
            it has at most this many characters (text) or bytes (binary).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        crash_override: CrashOverride,
        prompt: str = "",
        include: Iterable[str | re.Pattern[str]] = (),
        exclude: Iterable[str | re.Pattern[str]] = (),
        methods: Iterable[str] | None = None,
        catch: Any = UNSET,
        timeout: Any = UNSET,
        max_replay_body: int = DEFAULT_MAX_REPLAY_BODY,
        request_id_header: str | None = "x-request-id",
        idempotency_header: str | None = "idempotency-key",
        shutdown_grace: float = 10.0,
        name: str | None = None,
        tools: Iterable[Any] = (),
        mcp_servers: Iterable[Any] = (),
        model: Any = UNSET,
        max_turns: Any = UNSET,
        followups: str | Iterable[str] = (),
        warm_up: bool = True,
        repair_after_start: bool = False,
        websockets: bool = True,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if not callable(app):
            raise ConfigurationError("app", f"expected an ASGI application, got {app!r}")
        if not isinstance(crash_override, CrashOverride):
            raise ConfigurationError(
                "crash_override", f"expected a CrashOverride, got {type(crash_override).__name__}"
            )
        self.app = app
        self._co = crash_override
        # Every option is checked here, at construction, by the core's own settings.
        self.handler = crash_override.handler(
            prompt,
            catch=catch,
            timeout=timeout,
            name=name,
            tools=check.sequence("tools", tools),
            mcp_servers=check.sequence("mcp_servers", mcp_servers),
            model=model,
            max_turns=max_turns,
            followups=check.objectives(followups),
        )
        self.settings = self.handler.settings
        self._catch = self.settings.catch
        self._include = check.patterns("include", include)
        self._exclude = check.patterns("exclude", exclude)
        self._methods = check.methods(methods)
        self._limit = check.non_negative_int("max_replay_body", max_replay_body)
        self._grace = check.non_negative_number("shutdown_grace", shutdown_grace)
        self._request_id = check.header("request_id_header", request_id_header)
        self._idempotency = check.header("idempotency_header", idempotency_header)
        self._warm_up = check.flag("warm_up", warm_up)
        self._repair_after_start = check.flag("repair_after_start", repair_after_start)
        self._websockets = check.flag("websockets", websockets)
        self._max_message = check.non_negative_int("max_message", max_message)
        self._filtered = bool(self._include or self._exclude or self._methods)
        self._runner: TaskGroupRunner | None = None
        self._requests = Requests(
            self,
            limit=self._limit,
            request_id=self._request_id,
            idempotency=self._idempotency,
            repair_after_start=self._repair_after_start,
        )

    @property
    def background(self) -> TaskGroupRunner | None:
        """The runner of the current lifespan (None outside one); ``submit(fn, name=...)``."""
        return self._runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self._filtered and not self._protects(scope):
                await self.app(scope, receive, send)
            else:
                await self._requests(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)
        elif kind == "websocket" and self._websockets and self._protects(scope):
            await self._websocket(scope, receive, send)
        else:  # any future scope type: not ours to touch
            await self.app(scope, receive, send)

    def _protects(self, scope: Scope) -> bool:
        if self._methods and scope["type"] == "http" and scope.get("method") not in self._methods:
            return False
        path = scope.get("path", "")
        if self._include and not any(p.fullmatch(path) for p in self._include):
            return False
        return not any(p.fullmatch(path) for p in self._exclude)

    def _followups_here(self) -> contextlib.AbstractContextManager[Any]:
        """Send this recovery's follow-ups to the lifespan's task group (unless configured)."""
        runner = self._runner
        if runner is None or self.settings.followup_runner is not None:
            return contextlib.nullcontext()
        from crashoverride import followups

        return followups.using(runner)

    # -- websocket -------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        conn = Connection(scope, receive, send, self._max_message, self.handler)
        try:
            # Called exactly as a pass-through middleware would: same task, same context.
            await self.app(scope, conn.receive, conn.send)
        except Exception as exc:
            # The failed message's unit of work, for the recovery to find its declared effects.
            unit = integration.current_unit()
            conn.end_unit()
            reason = unrecoverable(conn, exc, self._catch)
            if reason is not None:
                if reason:
                    integration.skip(self.handler, exc, reason, kind="message", **conn.fields())
                raise
            failure = exc
        else:
            conn.end_unit()
            return
        # Outside the handler: a later failure of the connection is not chained to this one.
        error = await self._websocket_session(conn, failure, unit)
        if error is not None:
            try:
                raise error
            finally:
                error = failure = None  # type: ignore[assignment]

    async def _websocket_session(
        self, conn: Connection, failure: Exception, unit: Any
    ) -> BaseException | None:
        """The rest of the connection (``_ws_session``); the exception to raise, or None."""
        try:
            from crashoverride.integrations.asgi._ws_session import Session

            session = Session(app=self.app, conn=conn, handler=self.handler,
                              context=contextvars.copy_context(),
                              followups_here=self._followups_here)  # fmt: skip
        except Exception as problem:
            integration.internal_failure(self.handler, failure, problem)
            return failure
        return await session.run(failure, unit)

    # -- lifespan --------------------------------------------------------------------------

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            runner = TaskGroupRunner(grace=self._grace, group=group)

            async def lifespan_receive() -> Message:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._runner = runner
                    if self._warm_up:
                        await self._warm()
                elif message["type"] == "lifespan.shutdown":
                    # Finish follow-up work while the app's resources still exist, then let
                    # the app's own shutdown run.
                    if self._runner is runner:
                        self._runner = None
                    await runner.drain()
                return message

            try:
                await self.app(scope, lifespan_receive, send)
            except Exception as exc:
                # Re-raised below, outside the task group, so the server sees the app's own
                # exception rather than an exception group of ours.
                failure = exc
            finally:
                if self._runner is runner:
                    self._runner = None
                runner.cancel_all()
        if failure is not None:
            try:
                raise failure
            finally:
                failure = None

    async def _warm(self) -> None:
        try:
            # Skipped (nothing imported) when no recovery could run: no credentials.
            await integration.awarm_up(self.handler)
        except Exception as exc:
            # A broken SDK install must not stop the app from starting: the first recovery
            # meets the same error and reports it where it belongs.
            integration.emit(
                "warning", integration.RECOVERY_WARM_UP_FAILED,
                error=integration.clip(f"{type(exc).__name__}: {exc}", 500),
            )  # fmt: skip
