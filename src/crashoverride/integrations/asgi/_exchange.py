"""One HTTP exchange as it passes through the middleware, and replays of it.

The happy path only records: a pristine copy of the scope, the request body as it is read (up to
a bound) and whether ``http.response.start`` went out. Everything else here runs after a failure.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from crashoverride import integration

if TYPE_CHECKING:
    from crashoverride import Handler

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A replay's response is held in memory until it is sent; an endless stream must not exhaust it.
MAX_CAPTURED_BODY = 32 * 1024 * 1024


# Messages that carry the response's content. A body message (and a zero-copy send, its
# extension) ends the response when no more body follows; a file sent by path
# (``http.response.pathsend``, offered by servers such as Granian and used by Starlette's
# ``FileResponse``) is always the whole of it.
_CONTENT = frozenset({"http.response.body", "http.response.zerocopysend"})
_WHOLE = frozenset({"http.response.pathsend"})


def ends_response(message: Message) -> bool:
    """Whether ``message`` is the last of its response's content: after it the client has its
    whole answer, and Starlette runs the response's background tasks. The one test of the end,
    for the live response and a replay's alike."""
    kind = message["type"]
    return kind in _WHOLE or (kind in _CONTENT and not message.get("more_body", False))


class NotReplayable(RuntimeError):
    """The request cannot be run again (its body was too large, or the client left)."""


class Exchange:
    """Per-request recorder; its ``receive`` and ``send`` wrap the server's."""

    __slots__ = (
        "_body_ready",
        "_receive",
        "_send",
        "channel_error",
        "chunks",
        "complete",
        "declared",
        "disconnected",
        "ended",
        "finished",
        "limit",
        "live_scope",
        "scope",
        "size",
        "started",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        # Routing mutates the scope in place (endpoint, path_params...): a replay needs it as the
        # server delivered it.
        self.scope = dict(scope)
        # The scope as routing left it (``endpoint``...), for describing the failure.
        self.live_scope = scope
        self._receive = receive
        self._send = send
        self.limit = limit
        # Body chunks by reference (no copies); None once the body outgrew ``limit``.
        self.chunks: list[bytes] | None = []
        self.size = 0
        self.complete = False
        # The server delivered the body's last message (``complete`` may also be inferred from
        # the headers, before any message was read).
        self.ended = False
        # The request has a body still to come: declared by its headers, or begun by the app.
        self.declared = False
        self.started = False
        # The response's last content went out (``ends_response``): what fails now (a background
        # task) fails after the client has its whole answer.
        self.finished = False
        self.disconnected = False
        # Raised by the server's (or an outer middleware's) receive/send: not the app's failure.
        self.channel_error: BaseException | None = None
        self._body_ready: anyio.Event | None = None

    # -- happy path ------------------------------------------------------------------------

    async def receive(self) -> Message:
        try:
            message = await self._receive()
        except Exception as exc:
            self.channel_error = exc
            raise
        if message["type"] == "http.request":
            self._record(message)
        elif message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            # Set before sending: a start that failed half-way may still have reached the client.
            self.started = True
        try:
            await self._send(message)
        except Exception as exc:
            self.channel_error = exc
            raise
        if ends_response(message):
            self.finished = True

    def raised_by_channel(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or wraps) an error of the server's channel, e.g. an outer body
        limit or a client gone away: the app did not fail, so there is nothing to recover."""
        return wraps(exc, self.channel_error)

    def _record(self, message: Message) -> None:
        last = not message.get("more_body", False)
        if not self.complete:
            body = message.get("body", b"")
            self.size += len(body)
            chunks = self.chunks
            if chunks is not None:
                if self.size > self.limit:
                    self.chunks = None  # not replayable: let go of what we held
                elif body:
                    chunks.append(body)
            self.complete = last
        self.ended = self.ended or last

    # -- after a failure -------------------------------------------------------------------

    @property
    def body(self) -> bytes | None:
        """The whole request body, if it was read completely and fits in the replay buffer."""
        if not self.complete or self.chunks is None:
            return None
        return b"".join(self.chunks)

    @property
    def replayable(self) -> bool | None:
        """True / False, or None while the rest of the body is still being read."""
        if self.chunks is None or (self.disconnected and not self.complete):
            return False
        return True if self.complete else None

    async def pump(self, on_disconnect: Callable[[], None]) -> None:
        """Own the client's channel during a recovery, and only as far as the app opened it.

        The rest of a body the request declared (see ``settle_body``) is read, bounded, so the
        request can be replayed. Once the body has ended, the channel is listened to for the
        client leaving, the way Starlette's streaming responses do. A request whose body was
        neither declared nor read by the app is left alone: its ``receive`` is never called
        (nothing is owed to it, and frameworks rely on that). An error of the channel only ends
        this: it is the server's business, never the request's outcome.
        """
        ready = self._ready_event()
        try:
            if not self.ended and (not self.declared or self.chunks is None):
                return  # no body to read, or one too large to keep: draining it helps nobody
            while True:
                message = await self._receive()
                if message["type"] == "http.request":
                    if self.ended:
                        return  # body after the end: this channel is not worth listening to
                    self._record(message)
                    if self.chunks is None:
                        return  # outgrew the replay buffer: reading on would only drain it
                    if self.complete:
                        ready.set()
                elif message["type"] == "http.disconnect":
                    self.disconnected = True
                    ready.set()
                    on_disconnect()
                    return
        except Exception:
            if not self.complete:
                self.chunks = None  # what was read is only part of the body
        finally:
            ready.set()

    def _ready_event(self) -> anyio.Event:
        if self._body_ready is None:
            self._body_ready = anyio.Event()
            if self.complete or self.chunks is None:
                self._body_ready.set()
        return self._body_ready

    async def full_body(self) -> bytes:
        if not self.complete and self.chunks is not None and not self.disconnected:
            await self._ready_event().wait()
        body = self.body
        if body is None:
            if self.chunks is None:
                raise NotReplayable(
                    f"the request body is larger than max_replay_body ({self.limit} bytes), or "
                    "of unknown length, and was not kept; answer with respond() instead"
                )
            raise NotReplayable("the client disconnected before the request body was complete")
        return body


class CapturedResponse:
    """A response produced by a replay (or by ``respond``), held until it is sent."""

    __slots__ = ("body", "raw_headers", "source", "status")

    def __init__(
        self, status: int, raw_headers: list[tuple[bytes, bytes]], body: bytes, source: str
    ) -> None:
        self.status = status
        self.raw_headers = raw_headers
        self.body = body
        self.source = source

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        for key, value in self.raw_headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        preview = self.body[:300].decode("utf-8", errors="replace")
        more = f" ... ({len(self.body)} bytes)" if len(self.body) > 300 else ""
        kind = self.header("content-type") or "no content-type"
        return f"<{self.source} response {self.status} {kind}: {preview!r}{more}>"


async def replay(app: ASGIApp, exchange: Exchange) -> CapturedResponse:
    """Run the request through ``app`` again; capture the response instead of sending it."""
    body = await exchange.full_body()
    scope = dict(exchange.scope)
    # Extensions that make the app hand the response to the server some other way (files by
    # path, trailers, pushes) cannot be captured: the replay must use plain body messages.
    extensions = scope.get("extensions") or {}
    scope["extensions"] = {
        key: value for key, value in extensions.items() if not key.startswith("http.response.")
    }
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    parts: list[bytes] = []
    size = 0
    done = False
    delivered = False

    async def replay_receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The live client is watched by the recovery itself, which cancels us if it leaves.
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def capture(message: Message) -> None:
        nonlocal status, headers, size, done
        kind = message["type"]
        if kind == "http.response.start":
            if status is not None:
                raise RuntimeError("the replay sent http.response.start twice")
            status = int(message["status"])
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif kind == "http.response.body":
            if status is None or done:
                raise RuntimeError("the replay sent a body outside a response")
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > MAX_CAPTURED_BODY:
                raise RuntimeError(f"the replayed response exceeds {MAX_CAPTURED_BODY} bytes")
            parts.append(chunk)
            done = ends_response(message)
        elif ends_response(message):
            # Another way to send the content, which the replay did not offer (see above).
            raise RuntimeError(f"the replay sent its response as {kind}, which it cannot capture")

    await app(scope, replay_receive, capture)
    if status is None or not done:
        raise RuntimeError("the replay ended without a complete response")
    return CapturedResponse(status, headers, b"".join(parts), "replayed")


async def send_response(send: Send, response: CapturedResponse) -> None:
    await send(
        {"type": "http.response.start", "status": response.status, "headers": response.raw_headers}
    )
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


# -- containment: what may leave the middleware after the application failed ------------------


def wraps(exc: BaseException, channel: BaseException | None) -> bool:
    """Whether ``exc`` is ``channel``, or holds it (as a cause, a context, a group member)."""
    if channel is None:
        return False
    seen: set[int] = set()
    pending = [exc]
    while pending and len(seen) < 50:
        current = pending.pop()
        if current is channel:
            return True
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def cancel_pending() -> bool:
    """Whether the current task is being cancelled: its next checkpoint would raise."""
    try:
        # anyio scopes (and trio's) report a cancelled or expired scope as a deadline passed.
        if anyio.current_effective_deadline() <= anyio.current_time():
            return True
        # A native asyncio cancellation (``task.cancel()``, ``asyncio.timeout``) is invisible
        # to them; one the task has not acknowledged (``uncancel``) is counted by the task.
        task = asyncio.current_task()
    except Exception:  # not on an asyncio loop (trio), or on a loop anyio does not know
        return False
    return task is not None and task.cancelling() > 0


def outranking(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The member of a task group's exception that must propagate instead of the application's
    exception: an interrupt or exit first, then a cancellation. None if there is none (every
    other member is an internal failure, and the application's exception wins over it)."""
    cancelled = anyio.get_cancelled_exc_class()
    found: BaseException | None = None
    pending: list[BaseException] = [group]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, KeyboardInterrupt | SystemExit):
            return current
        elif found is None and isinstance(current, cancelled):
            found = current
    return found


def contain(handler: Handler, exc: BaseException, group: BaseExceptionGroup[BaseException]) -> None:
    """A task group's exception while ``exc`` was being recovered: the member that outranks
    ``exc`` propagates (``outranking``); with none, the group is an internal failure, noted on
    ``exc``, and the caller goes on to raise ``exc``."""
    member = outranking(group)
    if member is None:
        integration.internal_failure(handler, exc, group)
        return
    raise member from None
