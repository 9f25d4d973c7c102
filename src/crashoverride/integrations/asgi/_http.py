"""The middleware's ``http`` path: a protected request runs untouched; one whose endpoint
raises is recovered and answered with a trustworthy response, or left to the app's normal 500.

What a failed request looks like to the recovery is ``_block``; a failure after the response
started (a background task, a stream) is ``_after``; one exchange's channel is ``_exchange``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from crashoverride import integration
from crashoverride.integrations.asgi._exchange import (
    CapturedResponse,
    Exchange,
    Receive,
    Scope,
    Send,
    cancel_pending,
    contain,
    send_response,
)
from crashoverride.integrations.asgi._units import unit_id

if TYPE_CHECKING:
    from crashoverride.integrations.asgi._middleware import CrashOverrideMiddleware

# On every response a recovery produced: its value is the recovery's id (``recovery_header``).
RECOVERY_HEADER = b"crashoverride-recovery"
STARTED = "the response had already started; a second http.response.start is never sent"
GONE = "the client had disconnected; there is nobody to answer"


class Requests:
    """The ``http`` requests of one ``CrashOverrideMiddleware``, each a unit of work."""

    def __init__(
        self,
        middleware: CrashOverrideMiddleware,
        *,
        limit: int,
        request_id: bytes | None,
        idempotency: bytes | None,
        repair_after_start: bool,
    ) -> None:
        # The middleware's options, checked there; its lifespan's runner and follow-up routing
        # are read from it when a recovery needs them.
        self._middleware = middleware
        self.app = middleware.app
        self.handler = middleware.handler
        self.settings = middleware.settings
        self._catch = self.settings.catch
        self._limit = limit
        self._request_id = request_id
        self._idempotency = idempotency
        self._repair_after_start = repair_after_start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not integration.effects_declared():  # none in the process: no unit to open
            await self._unit(scope, receive, send)
            return
        # The request is a unit of work, its recovery included: replays and a client's retry
        # with the same idempotency key find the declared effects it made (``_units``).
        with integration.unit_of_work(self.handler, unit_id(scope, self._idempotency)):
            await self._unit(scope, receive, send)

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
                self._skip(exc, exchange, GONE)
                return None
            else:
                outcome = await self._recover(exc, exchange)
        except Exception as problem:  # imports included; ExceptionGroups of task groups too
            integration.internal_failure(self.handler, exc, problem)
            return None
        except BaseExceptionGroup as group:
            contain(self.handler, exc, group)
            return None
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
            self._skip(exc, exchange, STARTED)
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
            runner=self._middleware.background,
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
                with self._middleware._followups_here():
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
