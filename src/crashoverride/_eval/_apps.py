"""Small pieces scenario applications share: the ASGI app, its client, task wrappers.

The eval is a measurement tool, not the integration suite: requests are ASGI calls in process
(no server, no sockets, no HTTP client to install) through the real middleware.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from crashoverride._eval._scenario import LATER, STATE, Check, Env, equal, one_recovery

if TYPE_CHECKING:
    from crashoverride._app import CrashOverride


def service(co: CrashOverride, prompt: str, *routes: tuple[str, Callable[..., Any]]) -> Any:
    """A Starlette app with ``routes`` (path, endpoint) behind ``CrashOverrideMiddleware``."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    # Through importlib: ``crashoverride.integrations`` is mapped from ``integrations/`` at
    # install time, which type checkers reading this source tree do not see.
    middleware = importlib.import_module("crashoverride.integrations.asgi").CrashOverrideMiddleware
    every = ["GET", "POST"]
    app = Starlette(routes=[Route(path, endpoint, methods=every) for path, endpoint in routes])
    app.add_middleware(middleware, crash_override=co, prompt=prompt, warm_up=False)
    return app


@dataclass(frozen=True)
class Answer:
    """What the client of an in-process request received."""

    status: int
    body: bytes

    def json(self) -> Any:
        """The JSON of a 200 response; None for anything else (a 500, a body not JSON)."""
        if self.status != 200:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


async def call(app: Any, path: str, *, method: str = "GET", body: bytes = b"") -> Answer:
    """One request through ``app`` in process, as an ASGI server would make it.

    An exception that escapes the app (Starlette re-raises after sending its 500) ends as
    the 500 the client saw: the eval is about what the client received.
    """
    target, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": target, "raw_path": target.encode(), "root_path": "",
        "query_string": query.encode(), "headers": [(b"host", b"app.eval")],
        "client": ("127.0.0.1", 50000), "server": ("app.eval", 80),
    }  # fmt: skip
    sent = False
    status, chunks = 500, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()  # the client stays connected until the app answers
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:
        pass  # Starlette already sent its 500 (or nothing was sent: a 500 all the same)
    return Answer(status, b"".join(chunks))


def socket_service(co: CrashOverride, prompt: str, path: str, endpoint: Callable[..., Any]) -> Any:
    """A Starlette app with one websocket endpoint behind ``CrashOverrideMiddleware``."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    middleware = importlib.import_module("crashoverride.integrations.asgi").CrashOverrideMiddleware
    app = Starlette(routes=[WebSocketRoute(path, endpoint)])
    app.add_middleware(middleware, crash_override=co, prompt=prompt, warm_up=False)
    return app


@dataclass(frozen=True)
class Conversation:
    """What the client of an in-process websocket connection received: one reply per message
    it sent (None where none came), and whether the connection ended on the app's exception."""

    replies: list[Any]
    raised: bool


async def converse(app: Any, path: str, texts: list[str]) -> Conversation:
    """A websocket client in process: each message is sent once the previous one was answered
    (or the connection ended), then the client disconnects. Replies are decoded as JSON."""
    scope = {
        "type": "websocket", "asgi": {"version": "3.0"}, "scheme": "ws", "path": path,
        "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"host", b"app.eval")], "client": ("127.0.0.1", 50000),
        "server": ("app.eval", 80), "subprotocols": [],
    }  # fmt: skip
    replies: list[Any] = []
    changed = anyio.Event()
    connected = False
    given = 0

    async def receive() -> dict[str, Any]:
        nonlocal connected, given, changed
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        while len(replies) < given:  # a client waits for its answer before asking again
            await changed.wait()
            changed = anyio.Event()
        if given == len(texts):
            return {"type": "websocket.disconnect", "code": 1000}
        given += 1
        return {"type": "websocket.receive", "text": texts[given - 1]}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "websocket.send":
            try:
                replies.append(json.loads(message.get("text") or message.get("bytes") or b""))
            except ValueError:
                replies.append(message.get("text"))
            changed.set()

    raised = False
    try:
        await app(scope, receive, send)
    except Exception:
        raised = True  # the server would log it and drop the connection
    return Conversation(replies + [None] * (len(texts) - len(replies)), raised)


def task(co: CrashOverride, prompt: str) -> Any:
    """The asyncio task wrapper of ``crashoverride.integrations.asyncio``."""
    return importlib.import_module("crashoverride.integrations.asyncio").task(co, prompt)


async def judge_requests(
    env: Env, app: Any, first: tuple[str, Any], later: list[tuple[str, Any]]
) -> list[Check]:
    """The usual oracles of an endpoint scenario: the failing request's answer, the later
    requests' answers (ground truth), and no recovery after the first."""
    answer = (await call(app, first[0])).json()
    answers = [(await call(app, path)).json() for path, _ in later]
    return [
        equal(STATE, "first answer", answer, first[1]),
        equal(LATER, "later answers", answers, [expected for _, expected in later]),
        one_recovery(env),
    ]
