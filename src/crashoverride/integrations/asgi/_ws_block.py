"""What a websocket message whose handling failed looks like to the recovery: the ``Block``, the
agent's tools (``replay_message()``, ``send_text``...) and the brief.

Imported only after a failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from crashoverride import Handler
from crashoverride.integration import (
    Block,
    Brief,
    clip,
    is_secret_name,
    mask_fields,
)
from crashoverride.integrations.asgi._exchange import ASGIApp, Message, NotReplayable
from crashoverride.integrations.asgi._failed import ScopeInfo, failed_block
from crashoverride.integrations.asgi._websocket import Connection
from crashoverride.integrations.asgi._ws_restart import Instance

# The brief's parts are fixed here; the path and the counts are values, fenced.
MESSAGE_BRIEF = """\
This block is the handling of one message (`message`) received on the websocket connection
shown above (`connection`), in an ASGI application. The endpoint raised while handling it; the
connection is still open, and the client waits. The endpoint's coroutine has ended: its local
variables are readable through `caller`, and lost with it. `connection` describes the
connection (path, query and headers with secrets masked, counts of messages)."""
SENT_BEFORE = (
    "Before it raised, the failed handling had already sent the messages counted above "
    "(`sent_before_failure`): the client has them, and a replay sends its own in full."
)
NOT_KEPT = (
    "The message is NOT replayable (larger than max_message, shown above): replay_message() "
    "will fail; answer with send_text/send_bytes/send_json or give up."
)
MESSAGE_FINISH = """\
Postcondition: the message was handled, in one of two ways:
- Repair the code first (patch the failing function in its module, e.g. with
  replace_function or a `global` statement, so later messages work too), then
  `r = await replay_message()`: the endpoint is started again for this connection, the
  handshake already done (what it sends before its first message is not sent again), the
  message is handled again by the repaired code, and what it sends is captured (r.sent,
  r.texts, r.closed), sent to the client when you finish. The endpoint then goes on with the
  client's next messages. Its earlier local state is not restored: it starts from scratch.
- `send_text(text)`, `send_bytes(data)` or `send_json(value)`: the reply the client gets,
  sent when you finish; the endpoint is then started again the same way, for the next
  messages. Only with data from a real source; never invent content.
If neither is possible, call give_up(reason): the exception is raised as it would have been
without crashoverride, and the connection closes the way it would have."""

NO_REPLY = (
    "the message was not handled: after repairing, `await replay_message()` until it handles "
    "the message, or send a reply with send_text/send_bytes/send_json, or call give_up(reason)"
)


class MessageInfo:
    """The failed message as the agent sees it: secret-named JSON fields masked."""

    __slots__ = ("_is_secret", "_message", "kind", "size")

    def __init__(self, conn: Connection, is_secret: Callable[[str], bool]) -> None:
        self._message = conn.last
        self._is_secret = is_secret
        self.size = conn.last_size
        message = conn.last
        self.kind = "bytes" if message is not None and message.get("text") is None else "text"

    @property
    def kept(self) -> bool:
        return self._message is not None

    @property
    def text(self) -> str | None:
        """The text of a text message (secret-named JSON fields masked); None otherwise."""
        message = self._message
        if message is None or message.get("text") is None:
            return None
        text = str(message["text"])
        try:
            data = json.loads(text)
        except ValueError:
            return text
        return json.dumps(mask_fields(data, self._is_secret))

    @property
    def data(self) -> bytes | None:
        """The bytes of a binary message; None otherwise."""
        message = self._message
        return None if message is None else message.get("bytes")

    def json(self) -> Any:
        text = self.text if self.text is not None else (self.data or b"").decode()
        return json.loads(text)

    def __repr__(self) -> str:
        if not self.kept:
            return f"<websocket {self.kind} message of {self.size} (not kept)>"
        shown = self.text if self.text is not None else repr(self.data)
        return f"<websocket {self.kind} message: {clip(shown or '', 300)!r}>"


class ConnectionInfo(ScopeInfo):
    """The connection as the agent sees it; secret-looking headers and query parameters
    masked."""

    __slots__ = ("_conn", "subprotocols")

    def __init__(self, conn: Connection, is_secret: Callable[[str], bool]) -> None:
        super().__init__(conn.scope, is_secret)
        self._conn = conn
        self.subprotocols = list(conn.scope.get("subprotocols") or ())

    @property
    def received(self) -> int:
        """Messages the endpoint received on this connection, the failed one included."""
        return self._conn.received

    @property
    def sent(self) -> int:
        """Messages the application sent on this connection."""
        return self._conn.sent

    def __repr__(self) -> str:
        target = self.path + ("?" + self.query if self.query else "")
        return f"<websocket {target} received={self.received} sent={self.sent}>"


class MessageReplay:
    """What a replay of the message did: what the endpoint sent (captured, not yet sent)."""

    __slots__ = ("closed", "dropped", "handled", "sent")

    def __init__(self, instance: Instance) -> None:
        self.handled = instance.handled
        self.sent: list[str | bytes] = [
            _payload(m) for m in instance.captured if m["type"] == "websocket.send"
        ]
        close = next((m for m in instance.captured if m["type"] == "websocket.close"), None)
        self.closed: int | None = None if close is None else int(close.get("code", 1000))
        self.dropped = instance.dropped

    @property
    def texts(self) -> list[str]:
        return [s if isinstance(s, str) else s.decode("utf-8", "replace") for s in self.sent]

    def __repr__(self) -> str:
        shown = clip(repr(self.sent), 500)
        closed = f" closed={self.closed}" if self.closed is not None else ""
        return f"<replay handled={self.handled} sent={shown}{closed}>"


def _payload(message: Message) -> str | bytes:
    text = message.get("text")
    return str(text) if text is not None else bytes(message.get("bytes") or b"")


class MessageRecovery:
    """Builds the ``Block`` of one failed message and holds what the agent produced."""

    def __init__(
        self,
        *,
        app: ASGIApp,
        exc: BaseException,
        conn: Connection,
        handler: Handler,
        unit: Any,
        start: Callable[[Instance], None],
        is_secret: Callable[[str], bool] = is_secret_name,
    ) -> None:
        self.app = app
        self.conn = conn
        self.handler = handler
        self.unit = unit
        self.start = start
        self.instance: Instance | None = None
        self.replies: list[Message] = []
        self.message = MessageInfo(conn, is_secret)
        self.info = ConnectionInfo(conn, is_secret)
        self.sent_before = conn.sent_for_last
        self.block = self._block(exc)

    # -- the agent's tools -----------------------------------------------------------------

    async def replay_message(self) -> MessageReplay:
        """Start the endpoint again for this connection and let it handle the message again."""
        message = self.conn.last
        if message is None:
            raise NotReplayable(
                f"the message ({self.conn.last_size} characters or bytes) is larger than "
                f"max_message ({self.conn.limit}) and was not kept; reply with send_text() "
                "or send_json() instead"
            )
        self.discard()  # an earlier replay's run: its captured messages are never sent
        instance = self.instance = Instance(self.app, self.conn, self.handler, message, self.unit)
        self.start(instance)
        await instance.settled.wait()
        if instance.error is not None:
            raise instance.error
        return MessageReplay(instance)

    def send_text(self, text: str) -> str:
        """Queue a text message for the client, sent when you finish."""
        if not isinstance(text, str):
            raise TypeError(f"send_text takes a str, got {type(text).__name__}")
        return self._queue({"type": "websocket.send", "text": text})

    def send_bytes(self, data: bytes) -> str:
        """Queue a binary message for the client, sent when you finish."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"send_bytes takes bytes, got {type(data).__name__}")
        return self._queue({"type": "websocket.send", "bytes": bytes(data)})

    def send_json(self, value: Any) -> str:
        """Queue a JSON text message for the client, sent when you finish."""
        return self._queue({"type": "websocket.send", "text": json.dumps(value)})

    def _queue(self, message: Message) -> str:
        self.replies.append(message)
        return f"Queued reply {len(self.replies)}; it is sent when you finish."

    async def replay_for_waiter(self) -> MessageReplay:
        """Single-flight: another recovery of this failure succeeded; try the message again."""
        replay = await self.replay_message()
        if not replay.handled:
            raise RuntimeError("the replayed message was not handled")
        return replay

    def check(self, state: Any) -> bool | str:
        instance = self.instance
        if instance is not None and instance.handled:
            state.verified_by = "replay_message"  # handled again by the repaired endpoint
            return True
        if self.replies:
            return True
        return NO_REPLY

    # -- after the recovery ----------------------------------------------------------------

    def discard(self) -> None:
        """Cancel a replay's run that will not go live."""
        if self.instance is not None:
            self.instance.cancel()
            self.instance = None

    def continuation(self) -> Instance:
        """The run that goes on with the connection: the replay's that handled the message,
        or a new one (the agent replied itself)."""
        instance = self.instance
        if instance is not None and instance.handled:
            return instance
        self.discard()
        return Instance(self.app, self.conn, self.handler, None)

    # -- the block -------------------------------------------------------------------------

    def _block(self, exc: BaseException) -> Block:
        return failed_block(
            "message",
            exc,
            self.conn.live_scope,
            self,
            bindings={
                "message": self.message,
                "connection": self.info,
                "replay_message": self.replay_message,
                "send_text": self.send_text,
                "send_bytes": self.send_bytes,
                "send_json": self.send_json,
            },
            fields=self.conn.fields(),
            secrets=self.info.secret_values,
            unit=self.unit,
        )

    def why_cancelled(self) -> str | None:
        return "the client disconnected" if self.conn.disconnected else None

    def brief(self) -> Brief:
        return Brief(
            MESSAGE_BRIEF,
            SENT_BEFORE if self.sent_before else "",
            "" if self.message.kept else NOT_KEPT,
            MESSAGE_FINISH,
            connection=self.info.path,
            message_kind=self.message.kind,
            message_size=self.message.size,
            **({"sent_before_failure": self.sent_before} if self.sent_before else {}),
            **({} if self.message.kept else {"max_message": self.conn.limit}),
        )
