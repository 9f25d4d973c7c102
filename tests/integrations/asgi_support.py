"""A real uvicorn server on 127.0.0.1 in a thread, and what the agent was first given."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from tests.helpers import first_input  # noqa: F401  (re-exported for the ASGI tests)


def decorated(endpoint: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """An endpoint decorator defined in another module than the endpoint (as an application's
    auth or logging decorator is): the wrapper's ``__globals__`` are this module's."""

    @functools.wraps(endpoint)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await endpoint(*args, **kwargs)

    return wrapper


class Served:
    def __init__(self, server: uvicorn.Server, url: str) -> None:
        self.server = server
        self.url = url


@contextlib.contextmanager
def serve(app: Any, **config: Any) -> Iterator[Served]:
    """Run ``app`` under uvicorn on a free loopback port until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {
        "log_config": None,  # leave logging alone so caplog sees uvicorn's error log
        "access_log": False,
        "lifespan": "on",
        "loop": "asyncio",
        "http": "h11",
        "ws": "websockets-sansio",
        "timeout_graceful_shutdown": 5,
        **config,
    }
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield Served(server, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def named(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The captured events called ``event``."""
    return [e for e in logs if e["event"] == event]
