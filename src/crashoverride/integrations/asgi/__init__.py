"""ASGI middleware: a request whose endpoint raises is repaired and answered instead of a 500.

Usage with Starlette or FastAPI::

    app.add_middleware(CrashOverrideMiddleware, crash_override=co, prompt="...")

What it does:

* ``http`` requests: the endpoint runs untouched (same task, same context). If it raises a
  ``catch``-matching exception before ``http.response.start`` was sent, and the request is not
  being cancelled, a recovery runs with request tools (``request``, ``replay_request()``,
  ``respond(...)``, ``spawn_background(...)``). Only a trustworthy response (a captured replay
  or ``respond``) is sent, marked: the request's id header echoed back and
  ``crashoverride-recovery: <recovery id>`` (``CrashOverride(recovery_header=False)``: no such
  header); otherwise the original exception propagates, with a note, and the app's normal 500
  follows. Nothing that fails inside crashoverride or on the client's channel
  meanwhile replaces that exception.
* Each protected request is a unit of work: a replay of it (``replay_request()``, a
  single-flight waiter's, a background task's ``rerun()``) finds the declared effects
  (``CrashOverride.effect``) its failed run made and does not make them again; so does a
  client's retry carrying the same ``Idempotency-Key`` (``idempotency_header``; see
  ``integrations.asgi._units`` for what scopes a key).
* The request body is recorded as it is read, up to ``max_replay_body`` bytes, so the request
  can be replayed. Larger bodies still stream to the app unchanged; they are just not replayable.
* If the response had already started, nothing more is sent. A Starlette/FastAPI background
  task that raised after the response is recovered as a task call, then the tasks queued after
  it run; a stream that failed is logged as ``recovery.skipped``, or, with
  ``repair_after_start``, the agent repairs the code for later requests while the exception
  propagates. See ``integrations.asgi._after``.
* ``lifespan``: passed through; the middleware also opens the task group background work
  spawned by recoveries runs in, and drains it (bounded) at shutdown. With ``warm_up`` (the
  default) startup first imports the Agents SDK in a worker thread, so a server's first failure
  does not stall its event loop with that import (see ``CrashOverride.awarm_up``); not when no
  recovery could run (no credentials), where the import would buy nothing.
* ``websocket``: when the endpoint raises while handling a received message, a recovery runs
  with message tools (``message``, ``connection``, ``replay_message()``, ``send_text(...)``);
  a recovered connection stays open, in a restarted run of the endpoint (its handshake already
  done; the state local to the failed run is lost). Not recovered, the exception and the close
  code are what they are without crashoverride. See ``_websocket`` and ``_ws_session``, and
  docs/guides/websockets.md.
* Other scope types: passed straight through.

Installed with ``add_middleware`` it sits inside Starlette's ``ServerErrorMiddleware`` (which
turns a propagated exception into the 500) and outside ``ExceptionMiddleware`` (so handled
``HTTPException`` responses never reach it). Do not wrap a whole Starlette or FastAPI app from
the outside instead: its own ``ServerErrorMiddleware`` would have sent the 500 already, and the
middleware only logs ``recovery.skipped``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from crashoverride import ConfigurationError, CrashOverride, integration
from crashoverride.followups import TaskGroupRunner
from crashoverride.integration import UNSET
from crashoverride.integrations.asgi import _options as check
from crashoverride.integrations.asgi._exchange import (
    ASGIApp,
    CapturedResponse,
    Exchange,
    Message,
    NotReplayable,
    Receive,
    Scope,
    Send,
    cancel_pending,
    outranking,
    send_response,
)
from crashoverride.integrations.asgi._units import unit_id
from crashoverride.integrations.asgi._websocket import Connection, unrecoverable

__all__ = ["CapturedResponse", "CrashOverrideMiddleware", "NotReplayable", "TaskGroupRunner"]

DEFAULT_MAX_REPLAY_BODY = 4 * 1024 * 1024
# On every response a recovery produced: its value is the recovery's id (``recovery_header``).
RECOVERY_HEADER = b"crashoverride-recovery"
DEFAULT_MAX_MESSAGE = 1024 * 1024
_STARTED = "the response had already started; a second http.response.start is never sent"
_GONE = "the client had disconnected; there is nobody to answer"


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

    @property
    def background(self) -> TaskGroupRunner | None:
        """The runner of the current lifespan (None outside one); ``submit(fn, name=...)``."""
        return self._runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self._filtered and not self._protects(scope):
                await self.app(scope, receive, send)
            elif integration.effects_declared():
                # The request is a unit of work, its recovery included: replays and a client's
                # retry with the same idempotency key find the declared effects it made
                # (``_units``).
                with integration.unit_of_work(self.handler, unit_id(scope, self._idempotency)):
                    await self._unit(scope, receive, send)
            else:  # no effect declared in the process: no unit to open (``unit_of_work``)
                await self._unit(scope, receive, send)
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

    # -- http ------------------------------------------------------------------------------

    async def _unit(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(scope, receive, send, self._limit)
        resume: Callable[[], Awaitable[None]] | None = None
        try:
            # Called exactly as a pass-through middleware would: same task, same context.
            await self.app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            if not isinstance(exc, self._catch) or exchange.raised_by_channel(exc):
                raise
            if cancel_pending():
                # A recovery would itself be cancelled, and the enclosing scope would absorb
                # that cancellation together with the application's exception.
                raise
            outcome = await self._outcome(exc, exchange)
            if outcome is None or (
                isinstance(outcome, CapturedResponse) and not await self._answer(send, outcome, exc)
            ):
                # The application's exception, as it was raised (bare ``raise`` keeps its
                # context and traceback): its normal 500 follows.
                raise
            if not isinstance(outcome, CapturedResponse):
                resume = outcome  # a recovered background task: the ones after it run below
        if resume is not None:
            # Outside the handler: a later task's own failure is not chained to this one.
            await resume()

    async def _outcome(
        self, exc: Exception, exchange: Exchange
    ) -> CapturedResponse | Callable[[], Awaitable[None]] | None:
        """The response a recovery produced, the background tasks to resume, or None.
        Contained: nothing that goes wrong inside crashoverride replaces ``exc``. Only an
        interrupt, a cancellation, or the exception the agent chose to raise instead
        propagates from here."""
        try:
            if exchange.started:
                outcome = await self._after_start(exc, exchange)
            elif exchange.disconnected:
                self._skip(exc, exchange, _GONE)
                return None
            else:
                outcome = await self._recover(exc, exchange)
        except Exception as problem:  # imports included; ExceptionGroups of task groups too
            integration.internal_failure(self.handler, exc, problem)
            return None
        except BaseExceptionGroup as group:
            member = outranking(group)
            if member is None:
                integration.internal_failure(self.handler, exc, group)
                return None
            raise member from None
        except anyio.get_cancelled_exc_class():
            # Never swallowed; the note says why the application's exception is its context.
            integration.note(exc, "crashoverride: recovery cancelled: the request was cancelled")
            raise
        if isinstance(outcome, BaseException):
            raise outcome from exc  # the agent's ``raise_instead``
        return outcome

    async def _answer(self, send: Send, response: CapturedResponse, exc: Exception) -> bool:
        """Send the recovered response; False if the server's channel failed meanwhile."""
        try:
            await send_response(send, response)
        except Exception as problem:
            # Our own I/O: the client only sees that the request failed, and so does the log.
            integration.note(exc, f"crashoverride: recovered, but the response was not sent: "
                             f"{problem!r}")  # fmt: skip
            return False
        return True

    def _skip(self, exc: Exception, exchange: Exchange, reason: str) -> None:
        integration.skip(self.handler, exc, reason, kind="request", **self._fields(exchange))

    def _fields(self, exchange: Exchange) -> dict[str, Any]:
        from crashoverride.integrations.asgi._block import request_fields

        return request_fields(exchange, self._request_id)

    async def _after_start(
        self, exc: Exception, exchange: Exchange
    ) -> CapturedResponse | Callable[[], Awaitable[None]] | BaseException | None:
        """After ``http.response.start``: a background task's failure, or a stream's."""
        from crashoverride.integrations.asgi._after import BackgroundRecovery, locate

        queued = locate(exc)
        if queued is not None and exchange.finished:
            background = BackgroundRecovery(self.handler, self._fields(exchange))
            recovered = await background.recover(exc, queued)
            if isinstance(recovered, BaseException) or not recovered:
                return recovered or None  # the agent's raise_instead, or re-raise ``exc``
            return functools.partial(background.run, queued.after)
        if not self._repair_after_start or exchange.finished or queued is not None:
            # Never replayed for a repair: a response that finished, or one whose background
            # task raised (its end went out in some way not known here), would run its
            # background tasks again, the ones that already ran included.
            self._skip(exc, exchange, _STARTED)
            return None
        return await self._recover(exc, exchange)  # repair-only: the exception propagates

    async def _recover(
        self, exc: Exception, exchange: Exchange
    ) -> CapturedResponse | BaseException | None:
        from crashoverride.integrations.asgi._after import StreamRepair
        from crashoverride.integrations.asgi._block import RequestRecovery

        # A response that started cannot be answered again: only the code can be repaired.
        repair_only = exchange.started
        job = (StreamRepair if repair_only else RequestRecovery)(
            app=self.app,
            exc=exc,
            exchange=exchange,
            runner=self._runner,
            request_id_header=self._request_id,
            is_secret=integration.redactor(self.handler).is_secret,
        )
        outcome = None
        # No budget of its own: the recovery's one deadline (the handler's ``timeout``) ends it.
        async with anyio.create_task_group() as group:
            # The client's channel is ours now: finish the body, watch for a disconnect (a
            # repair serves later requests: the client leaving does not end it).
            stop = (lambda: None) if repair_only else group.cancel_scope.cancel
            group.start_soon(exchange.pump, stop)
            try:
                with self._followups_here():
                    outcome = await integration.arecover(self.handler, exc, lambda: job.block)
            finally:
                group.cancel_scope.cancel()
        if outcome is None:
            if exchange.disconnected:
                integration.note(exc, "crashoverride: recovery cancelled: the client disconnected")
            return None
        try:
            recovered = integration.settle(self.handler, outcome, exc)
        except Exception as replacement:  # the agent's raise_instead, chained to ``exc``
            return replacement
        if not recovered or repair_only:
            return None
        response = job.response
        if isinstance(outcome.value, CapturedResponse):
            response = outcome.value  # a single-flight waiter's replay through the repaired app
        if response is None:
            return None
        recovery_id = str(outcome.report.recovery_id) if outcome.report is not None else None
        return self._marked(response, exchange, recovery_id)

    def _marked(
        self, response: CapturedResponse, exchange: Exchange, recovery_id: str | None
    ) -> CapturedResponse:
        """The recovered response, saying so: the request's id echoed back (when the request
        had one and the response does not) and ``crashoverride-recovery: <recovery id>``
        (unless ``recovery_header=False``), so a client or a proxy log can tell it apart."""
        headers = [(k, v) for k, v in response.raw_headers if k.lower() != RECOVERY_HEADER]
        if self._request_id is not None and response.header(self._request_id.decode()) is None:
            for key, value in exchange.scope.get("headers", ()):
                if bytes(key).lower() == self._request_id:
                    headers.append((self._request_id, bytes(value)))
                    break
        if self.settings.recovery_header and recovery_id is not None:
            headers.append((RECOVERY_HEADER, recovery_id.encode("latin-1")))
        return CapturedResponse(response.status, headers, response.body, response.source)

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
