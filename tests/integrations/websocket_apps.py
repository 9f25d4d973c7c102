"""Starlette websocket endpoints with the failures the websocket recovery tests need.

The price source "renamed" a field: ``PRICES`` items carry ``cost`` while ``read_price`` still
reads ``price``. A recovery repairs ``read_price`` in this module and replays the message.
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from crashoverride.integrations.asgi import CrashOverrideMiddleware

PRICES: dict[str, dict[str, int]] = {"apple": {"cost": 3}, "pear": {"cost": 5}}

# Set by agent code that waits to be cancelled (the client leaves meanwhile).
RECOVERING = threading.Event()
SETUPS: list[str] = []  # one entry per run of the endpoint's setup


def read_price(item: str) -> int:
    return PRICES[item]["price"]  # the source now says "cost"


async def prices(websocket: WebSocket) -> None:
    await websocket.accept()
    SETUPS.append(websocket.url.path)
    await websocket.send_text("welcome")
    handled = 0  # local state: lost with a failed run
    while True:
        item = await websocket.receive_text()
        if item == "bye":
            await websocket.close(code=4000, reason="bye")
            return
        if item == "boom":
            raise RuntimeError("boom: the endpoint cannot go on")
        handled += 1
        await websocket.send_json({"item": item, "price": read_price(item), "n": handled})


async def before_accept(websocket: WebSocket) -> None:
    read_price("apple")
    await websocket.accept()


async def after_close(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.receive_text()
    await websocket.close(code=4001)
    read_price("apple")


ROUTES = [
    WebSocketRoute("/prices", prices),
    WebSocketRoute("/before-accept", before_accept),
    WebSocketRoute("/after-close", after_close),
]


def app(**options: Any) -> Starlette:
    """The endpoints behind ``CrashOverrideMiddleware``; no options: without it."""
    middleware = [Middleware(CrashOverrideMiddleware, **options)] if options else []
    return Starlette(routes=ROUTES, middleware=middleware)


def fastapi_app(**options: Any) -> FastAPI:
    """The same endpoints in a FastAPI app."""
    app = FastAPI()
    for route in ROUTES:
        app.add_api_websocket_route(route.path, route.endpoint)
    if options:
        app.add_middleware(CrashOverrideMiddleware, **options)
    return app
