"""The rest of a websocket connection after its endpoint failed while handling a message.

Each failure is recovered on its own (``_ws_block``); a recovered one goes on in a restarted
run of the endpoint (``_ws_restart``), whose own failures are recovered the same way, until
the connection ends. A failure that is not recovered ends the connection as it would have
without crashoverride: its exception leaves the middleware and the server closes the
connection with the code it always uses for an application error.

During a recovery the client's channel is watched for it leaving: a disconnect cancels the
recovery. The watch holds at most one message the client sends meanwhile (the endpoint gets it
first, once it runs again) and reads no further until the recovery ends, so memory stays
bounded: a disconnect after such a message is noticed when the recovery ends.

Imported only after a failure.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from crashoverride import Handler, integration
from crashoverride.integrations.asgi._exchange import ASGIApp, contain
from crashoverride.integrations.asgi._websocket import (
    DISCONNECT,
    NO_MESSAGE,
    Connection,
    unrecoverable,
)
from crashoverride.integrations.asgi._ws_restart import Instance

Outcome = Instance | BaseException | None


class Session:
    """Recovers the failures of one connection, and runs what goes on after each."""

    def __init__(
        self,
        *,
        app: ASGIApp,
        conn: Connection,
        handler: Handler,
        context: contextvars.Context,
        followups_here: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self.app = app
        self.conn = conn
        self.handler = handler
        # The connection's context before any recovery: every restarted run starts in a copy of
        # it, never in the recovery's (whose tool calls start them).
        self.context = context
        self.followups_here = followups_here
        self._group: anyio.abc.TaskGroup | None = None

    async def run(self, failure: Exception, unit: Any) -> BaseException | None:
        """Recover ``failure`` (raised in ``unit`` of work) and what follows; the exception to
        raise when the connection ends on one, None when it ended well."""
        result: BaseException | None = None
        async with anyio.create_task_group() as group:
            self._group = group
            exc: Exception = failure
            while True:
                outcome = await self._recover(exc, unit)
                if not isinstance(outcome, Instance):
                    result = exc if outcome is None else outcome
                    break
                await outcome.finished.wait()
                if outcome.error is None:
                    break  # the endpoint ended the connection (or the client left) normally
                exc, unit = outcome.error, outcome.error_unit
                reason = unrecoverable(self.conn, exc, self.handler.settings.catch)
                if reason is None and not outcome.taken:
                    reason = NO_MESSAGE  # its setup failed: the last message was handled
                if reason is not None:
                    if reason:
                        integration.skip(self.handler, exc, reason, kind="message",
                                         **self.conn.fields())  # fmt: skip
                    result = exc
                    break
            group.cancel_scope.cancel()
        self._group = None
        return result

    def start(self, instance: Instance) -> None:
        """Run ``instance`` in the connection's task group, in a copy of its context."""
        group = self._group
        if group is None:  # pragma: no cover - only called while ``run`` holds the group
            raise RuntimeError("the connection has ended")
        instance.started = True
        self.context.run(group.start_soon, instance.run)

    async def _recover(self, exc: Exception, unit: Any) -> Outcome:
        """The run that goes on (live), the exception the agent raised instead, or None.
        Contained: nothing that goes wrong inside crashoverride replaces ``exc``."""
        from crashoverride.integrations.asgi._ws_block import MessageRecovery

        job: MessageRecovery | None = None
        try:
            job = MessageRecovery(
                app=self.app, exc=exc, conn=self.conn, handler=self.handler, unit=unit,
                start=self.start, is_secret=integration.redactor(self.handler).is_secret,
            )  # fmt: skip
            built = job
            outcome = None
            async with anyio.create_task_group() as watch:
                watch.start_soon(self._watch, watch.cancel_scope.cancel)
                try:
                    with self.followups_here():
                        outcome = await integration.arecover(self.handler, exc, lambda: built.block)
                finally:
                    watch.cancel_scope.cancel()
            return await self._settle(job, outcome, exc)
        except Exception as problem:  # imports included; ExceptionGroups of task groups too
            if job is not None:
                job.discard()
            integration.internal_failure(self.handler, exc, problem)
            return None
        except BaseExceptionGroup as group:
            if job is not None:
                job.discard()
            contain(self.handler, exc, group)
            return None
        except anyio.get_cancelled_exc_class():
            if job is not None:
                job.discard()
            integration.note(exc, "crashoverride: recovery cancelled: the connection was "
                             "cancelled")  # fmt: skip
            raise

    async def _settle(self, job: Any, outcome: Any, exc: Exception) -> Outcome:
        if outcome is None:
            job.discard()
            if self.conn.disconnected:
                integration.note(exc, "crashoverride: recovery cancelled: the client "
                                 "disconnected")  # fmt: skip
            return None
        try:
            recovered = integration.settle(self.handler, outcome, exc)
        except Exception as replacement:  # the agent's raise_instead, chained to ``exc``
            job.discard()
            return replacement
        if not recovered:
            job.discard()
            return None
        instance: Instance = job.continuation()
        try:
            for message in [*instance.captured, *job.replies]:
                await self.conn.send(message)
        except Exception as problem:
            # The server's channel: the client only sees that the connection failed.
            instance.cancel()
            integration.note(exc, f"crashoverride: recovered, but the reply was not sent: "
                             f"{problem!r}")  # fmt: skip
            return None
        if not instance.started:
            self.start(instance)
        instance.go_live()
        return instance

    async def _watch(self, on_disconnect: Callable[[], None]) -> None:
        """Watch the client's channel during a recovery (see the module's docstring)."""
        conn = self.conn
        if conn.held or conn.disconnected:
            return
        try:
            message = await conn.raw_receive()
        except Exception:  # the server's channel: its business, never the recovery's outcome
            return
        conn.held.append(message)
        if message["type"] == DISCONNECT:
            conn.disconnected = True
            on_disconnect()
