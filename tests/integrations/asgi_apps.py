"""Starlette and FastAPI apps with the failures the ASGI middleware tests need.

The data source "renamed" a field: ``PRICES`` items carry ``cost`` while ``read_price`` still
reads ``price``. A recovery repairs ``read_price`` in this module and replays the request.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi import Request as FastAPIRequest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from crashoverride.integrations.asgi import CrashOverrideMiddleware

PRICES: dict[str, dict[str, int]] = {"apple": {"cost": 3}, "pear": {"cost": 5}}


def read_price(item: str) -> int:
    return PRICES[item]["price"]  # the source now says "cost"


class Probe:
    """What the apps did, observed from the test thread."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.failures = 0
        self.lock = threading.Lock()
        self.background_done = threading.Event()
        self.cancelled = threading.Event()
        self.burst_size = 0

    def failed(self) -> None:
        with self.lock:
            self.failures += 1

    async def wait_for_burst(self) -> int:
        """Agent code awaits this so every request of a burst has failed before the repair."""
        with anyio.fail_after(20):
            # Polled: failures are counted from any thread (sync endpoints run in a pool).
            while self.failures < self.burst_size:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return self.failures

    async def hang(self) -> None:
        """Agent code that runs until it is cancelled (the client disconnects meanwhile)."""
        try:
            await anyio.sleep(60)
        finally:
            self.cancelled.set()


PROBE = Probe()


# ------------------------------------------------------------------------------- endpoints


def counted_price(item: str) -> int:
    try:
        return read_price(item)
    except KeyError:
        PROBE.failed()
        raise


async def price(request: Request) -> Response:
    item = request.path_params["item"]
    return JSONResponse({"item": item, "price": counted_price(item)})


async def order(request: Request) -> Response:
    payload = await request.json()
    return JSONResponse({"ordered": payload["item"], "total": read_price(payload["item"]) * 2})


async def stream_ok(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"chunk-{i}\n".encode()
            await anyio.sleep(0.01)

    return StreamingResponse(chunks(), media_type="text/plain")


async def stream_fail(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first\n"
        await anyio.sleep(0.05)
        read_price("apple")  # fails mid-stream, after the response started
        yield b"never\n"

    return StreamingResponse(chunks(), media_type="text/plain")


async def upload(request: Request) -> Response:
    digest = hashlib.sha256()
    chunks = size = 0
    async for chunk in request.stream():
        if chunk:
            chunks += 1
            size += len(chunk)
            digest.update(chunk)
    if request.query_params.get("fail"):
        read_price("apple")
    return JSONResponse({"chunks": chunks, "size": size, "sha256": digest.hexdigest()})


async def with_background(request: Request) -> Response:
    def later() -> None:
        PROBE.events.append("background ran")
        PROBE.background_done.set()

    return PlainTextResponse("queued", background=BackgroundTask(later))


async def hang(request: Request) -> Response:
    read_price("pear")
    return PlainTextResponse("unreachable")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        text = await websocket.receive_text()
        if text == "bye":
            await websocket.close()
            return
        await websocket.send_text(f"echo: {text}")


def _lifespan(state_value: str) -> Callable[[Any], Any]:
    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, str]]:
        PROBE.events.append("startup")
        yield {"greeting": state_value}
        PROBE.events.append("shutdown")

    return lifespan


async def greeting(request: Request) -> Response:
    return PlainTextResponse(request.state.greeting)


ROUTES = [
    Route("/price/{item}", price),
    Route("/order", order, methods=["POST"]),
    Route("/stream", stream_ok),
    Route("/stream-fail", stream_fail),
    Route("/upload", upload, methods=["POST"]),
    Route("/background", with_background),
    Route("/hang", hang, methods=["GET", "POST"]),
    Route("/greeting", greeting),
    WebSocketRoute("/ws", echo),
]


def starlette_app(**options: Any) -> Starlette:
    return Starlette(
        routes=ROUTES,
        middleware=[Middleware(CrashOverrideMiddleware, **options)],
        lifespan=_lifespan("hello from starlette"),
    )


def fastapi_app(**options: Any) -> FastAPI:
    app = FastAPI(lifespan=_lifespan("hello from fastapi"))

    @app.get("/price/{item}")
    async def fastapi_price(item: str) -> dict[str, Any]:
        return {"item": item, "price": counted_price(item)}

    @app.post("/order")
    async def fastapi_order(request: FastAPIRequest) -> dict[str, Any]:
        payload = await request.json()
        return {"ordered": payload["item"], "total": read_price(payload["item"]) * 2}

    @app.get("/sync-price/{item}")
    def fastapi_sync_price(item: str) -> dict[str, Any]:
        return {"item": item, "price": read_price(item)}

    for route in ROUTES[2:]:
        app.router.routes.append(route)
    app.add_middleware(CrashOverrideMiddleware, **options)
    return app
