"""Helpers for the transparency and containment tests: an ASGI call, probes, a loop-import guard."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import trio

ctxvar: contextvars.ContextVar[str] = contextvars.ContextVar("ctxvar", default="unset")


class PassThrough:
    """The do-nothing middleware every comparison is made against."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Sent(list[dict[str, Any]]):
    @property
    def status(self) -> int | None:
        starts = [m for m in self if m["type"] == "http.response.start"]
        assert len(starts) <= 1, "http.response.start sent twice"
        return starts[0]["status"] if starts else None

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self if m["type"] == "http.response.body")


def http_scope(
    method: str = "GET", path: str = "/", headers: Sequence[tuple[bytes, bytes]] = ()
) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": list(headers), "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip


async def call(
    app: Any,
    receive: Callable[[], Any] | None = None,
    send: Callable[[Any], Any] | None = None,
    **scope: Any,
) -> Sent:
    """One request through ``app``; the client stays connected unless ``receive`` says not."""
    sent = Sent()
    delivered = False

    async def default_receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def record(message: dict[str, Any]) -> None:
        sent.append(message)
        if send is not None:
            await send(message)

    await app(http_scope(**scope), receive or default_receive, record)
    return sent


class LoopImportError(ImportError):
    """What a blocking-call detector raises for an import on the event loop."""


def _on_an_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return trio.lowlevel.in_trio_run()
    return True


@contextlib.contextmanager
def imports_fail_on_the_loop() -> Iterator[list[str]]:
    """Every import made by crashoverride's code on an event loop raises, as an import would
    under a blocking-call detector when the module is not loaded yet. Yields what was refused."""
    real_import = builtins.__import__
    refused: list[str] = []

    def guarded(
        name: str,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> Any:
        importer = str((globals or {}).get("__name__", ""))
        if importer.startswith("crashoverride") and _on_an_event_loop():
            refused.append(f"{importer}: {name or '.'}")
            raise LoopImportError(f"import of {name or fromlist!r} on the event loop")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded
    try:
        yield refused
    finally:
        builtins.__import__ = real_import
