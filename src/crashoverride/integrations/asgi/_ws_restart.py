"""A restarted run of a websocket endpoint, for a connection whose handshake is done.

When an endpoint raises, its coroutine is gone, and with it everything local to it: ASGI has no
way to resume it. What can continue is the connection. The app is called again with a fresh
copy of the connection's scope, and sees a new connection that is in fact the old one:

- its first ``receive()`` is the ``websocket.connect`` it expects; its ``websocket.accept`` is
  swallowed (the client was accepted long ago), and so is what it sends before it asks for its
  first message (a greeting, a history: the client has it already). A ``websocket.close`` it
  sends there is kept: the restarted endpoint refuses to go on.
- in a replay, the message that failed is its first message, and what it sends while handling
  it is captured, not sent; when it asks for the next message the message is handled, and the
  run waits there until the recovery ends: it then goes live (what it captured is sent first)
  or is cancelled (nothing it captured is ever sent).
- live, it reads the connection's channel and sends to it, as the first run did.

Imported only after a failure.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from crashoverride import Handler, integration
from crashoverride.integrations.asgi._exchange import MAX_CAPTURED_BODY, ASGIApp, Message
from crashoverride.integrations.asgi._websocket import RECEIVE, Connection, next_unit

CONNECT, SETUP, HANDLING, HANDLED = "connect", "setup", "handling", "handled"


class Instance:
    """One restarted run of the app. ``message``: the message to replay (None: go live at once,
    continuing with the client's next message); ``unit``: the unit of work of its failed
    handling, whose declared effects the replay finds."""

    def __init__(
        self,
        app: ASGIApp,
        conn: Connection,
        handler: Handler,
        message: Message | None,
        unit: Any = None,
    ) -> None:
        self.app = app
        self.conn = conn
        self.handler = handler
        self.message = message
        self.unit = unit
        self.phase = CONNECT
        self.live = message is None
        self.started = False
        self.captured: list[Message] = []
        self.captured_size = 0
        self.dropped = 0  # what the setup sent again, swallowed
        self.taken = 0  # messages it received live: a failure before the first is its setup's
        self.error: Exception | None = None
        self.error_unit: Any = None  # the unit of work the error was raised in
        self.ended = False
        self.settled = anyio.Event()  # handled, ended or failed
        self.finished = anyio.Event()
        self._release = anyio.Event()
        self._cancel = anyio.CancelScope()
        self._unit: contextlib.AbstractContextManager[None] | None = None
        if self.live:
            self._release.set()

    @property
    def handled(self) -> bool:
        """The replayed message was handled: the app asked for the next one, or ended well
        after receiving it."""
        if self.phase == HANDLED:
            return True
        return self.ended and self.error is None and self.phase == HANDLING

    async def run(self) -> None:
        """The task body (started in the connection's context, see ``_ws_session``)."""
        with self._cancel:
            try:
                await self.app(dict(self.conn.scope), self.receive, self.send)
            except Exception as exc:
                self.error = exc
                self.error_unit = integration.current_unit()
            finally:
                self.ended = True
                if self._unit is not None:
                    self._unit.__exit__(None, None, None)
                    self._unit = None
                self.settled.set()
                self.finished.set()

    def cancel(self) -> None:
        """Stop a run that never went live: nothing it captured is sent."""
        if not self.live:
            self._cancel.cancel()

    def go_live(self) -> None:
        self.live = True
        self.captured = []
        self._release.set()

    # -- the app's channel -----------------------------------------------------------------

    async def receive(self) -> Message:
        phase = self.phase
        if phase == CONNECT:
            self.phase = SETUP
            return {"type": "websocket.connect"}
        if phase == SETUP and self.message is not None:
            self.phase = HANDLING
            # The failed handling's unit of work, a later attempt of it (its effects are found).
            self._unit = next_unit(self._unit, self.handler, integration.attempt_of(self.unit))
            return dict(self.message)
        if phase == HANDLING:
            self.phase = HANDLED
            self.settled.set()
        elif phase == SETUP:
            self.phase = HANDLED  # continuing: the setup ended, the client's next message
        if self._unit is not None:  # the replayed message's handling ended here
            self._unit.__exit__(None, None, None)
            self._unit = None
        await self._release.wait()
        message = await self.conn.take()
        if message["type"] == RECEIVE:
            self.taken += 1
            self._unit = next_unit(self._unit, self.handler)
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if self.phase in (CONNECT, SETUP):
            if kind == "websocket.accept":
                return  # the handshake was accepted by the first run
            if kind == "websocket.send":
                self.dropped += 1  # the client has what the setup sends
                return
        if self.live:
            await self.conn.send(message)
            return
        payload = message.get("text") or message.get("bytes") or b""
        self.captured_size += len(payload)
        if self.captured_size > MAX_CAPTURED_BODY:
            raise RuntimeError(f"the replay sent more than {MAX_CAPTURED_BODY} bytes")
        self.captured.append(dict(message))
