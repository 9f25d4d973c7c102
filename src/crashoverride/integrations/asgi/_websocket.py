"""One websocket connection as it passes through the middleware: the happy path's recorder.

Handling one message, seen from ASGI: an endpoint reads like ``while True: msg = await
ws.receive_text(); ...``, so the handling of a message starts when ``receive()`` hands the app
a ``websocket.receive`` event and ends when the app calls ``receive()`` again. When the app
raises in between, the last message it received is the one it was handling. This module only
records what that takes, without copies: the connection's handshake state, whether a
``receive()`` is pending, the last message (its text or bytes by reference, only if it fits in
``max_message``), and counts. Everything that runs after a failure lives in
``_ws_session`` (the rest of the connection), ``_ws_restart`` (a restarted run of
the endpoint) and ``_ws_block`` (what the agent gets).

Each message is a unit of work (``integration.unit_of_work``) from the moment the app receives
it until it asks for the next one: the declared effects (``CrashOverride.effect``) its handling
made are found, not made again, by a replay of it.
"""

from __future__ import annotations

from collections import deque
from contextlib import AbstractContextManager
from typing import Any

from crashoverride import Handler, integration
from crashoverride.integrations.asgi._exchange import (
    Message,
    Receive,
    Scope,
    Send,
    cancel_pending,
    wraps,
)

RECEIVE = "websocket.receive"
DISCONNECT = "websocket.disconnect"

# Why a failure is not recovered (``recovery.skipped`` and a note on the exception).
NOT_ACCEPTED = "the websocket handshake had not been accepted; there is no connection to keep"
CLOSED = "the application had closed the websocket connection"
GONE = "the client had disconnected; there is nobody to answer"
NO_MESSAGE = "no message was being handled: the endpoint failed before it received one"
WAITING = (
    "the endpoint was waiting for the next message when it failed: the failure is not the "
    "handling of a message"
)


class Connection:
    """Per-connection recorder; its ``receive`` and ``send`` wrap the server's."""

    __slots__ = (
        "_receive",
        "_send",
        "accepted",
        "channel_error",
        "closed",
        "disconnected",
        "handler",
        "held",
        "last",
        "last_size",
        "limit",
        "live_scope",
        "received",
        "scope",
        "sent",
        "sent_for_last",
        "unit",
        "waiting",
    )

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, limit: int, handler: Handler
    ) -> None:
        # Routing mutates the scope in place: a restart needs it as the server delivered it.
        self.scope = dict(scope)
        self.live_scope = scope
        self._receive = receive
        self._send = send
        self.limit = limit
        self.handler = handler
        self.accepted = False
        self.closed = False
        self.disconnected = False
        # ``receive()`` calls the app is awaiting: a failure while one is pending is not the
        # handling of a message (an endpoint with a task group of its own, say).
        self.waiting = 0
        # The last ``websocket.receive`` event, a copy of its envelope; None when none came or
        # it was larger than ``limit`` (``last_size`` says how large).
        self.last: Message | None = None
        self.last_size = 0
        self.received = 0
        self.sent = 0
        self.sent_for_last = 0  # what the app sent while handling the last message
        # Messages the client sent while a recovery ran (at most one, see ``pump``), for the app.
        self.held: deque[Message] = deque()
        self.channel_error: BaseException | None = None
        # The unit of work of the message being handled (None: no effect is declared).
        self.unit: AbstractContextManager[None] | None = None

    # -- happy path ------------------------------------------------------------------------

    async def receive(self) -> Message:
        """The first run's ``receive``: each message it gets is a unit of work of its own."""
        message = await self.take()
        if message["type"] == RECEIVE:
            self.unit = next_unit(self.unit, self.handler)
        return message

    async def take(self) -> Message:
        """The next message for the app (one held during a recovery first), recorded."""
        self.waiting += 1
        try:
            message = self.held.popleft() if self.held else await self._receive()
        except Exception as exc:
            self.channel_error = exc
            raise
        finally:
            self.waiting -= 1
        self.delivered(message)
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            self.accepted = True
        elif kind in ("websocket.close", "websocket.http.response.start"):
            self.closed = True  # set before: a close that failed half-way may have gone out
        try:
            await self._send(message)
        except Exception as exc:
            self.channel_error = exc
            raise
        if kind == "websocket.send":
            self.sent += 1
            self.sent_for_last += 1

    def delivered(self, message: Message) -> None:
        """The app got ``message``: the handling of the last one ended, a new one's begins."""
        kind = message["type"]
        if kind == RECEIVE:
            self.received += 1
            self.sent_for_last = 0
            data = message.get("text")
            if data is None:
                data = message.get("bytes")
            size = len(data) if data is not None else 0
            self.last_size = size
            self.last = (
                {"type": RECEIVE, "text": message.get("text"), "bytes": message.get("bytes")}
                if size <= self.limit
                else None
            )
        elif kind == DISCONNECT:
            self.disconnected = True

    def end_unit(self) -> None:
        """The first run ended: close its last message's unit, in the context it opened it."""
        if self.unit is not None:
            self.unit.__exit__(None, None, None)
            self.unit = None

    async def raw_receive(self) -> Message:
        """The server's ``receive``, unrecorded (the recovery's watch of the channel)."""
        return await self._receive()

    def raised_by_channel(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or wraps) an error of the server's channel: not the app's."""
        return wraps(exc, self.channel_error)

    def fields(self) -> dict[str, Any]:
        """Connection context for every event of a recovery."""
        return {"path": self.scope.get("path", ""), "websocket": True}


def next_unit(
    current: AbstractContextManager[None] | None,
    handler: Handler,
    unit: AbstractContextManager[None] | None = None,
) -> AbstractContextManager[None]:
    """End the unit of the message handled until now (``current``) and begin ``unit`` (default:
    a new one). Called in the app's task, so the unit is the context of the code that handles
    the message; costs one object when no effect is declared in the process."""
    if current is not None:
        current.__exit__(None, None, None)
    if unit is None:
        unit = integration.unit_of_work(handler)
    unit.__enter__()
    return unit


def unrecoverable(conn: Connection, exc: BaseException, catch: Any) -> str | None:
    """Why the failure ``exc`` cannot be recovered per message: a reason to log
    (``recovery.skipped``), ``""`` to re-raise it without a word (not ours: control flow, the
    server's channel, a cancellation), or None: recover it."""
    if not isinstance(exc, catch) or conn.raised_by_channel(exc) or cancel_pending():
        return ""
    if conn.disconnected:
        return GONE
    if conn.closed:
        return CLOSED
    if not conn.accepted:
        return NOT_ACCEPTED
    if conn.waiting:
        return WAITING
    if conn.received == 0:
        return NO_MESSAGE
    return None
