"""A real Granian server on 127.0.0.1, embedded in a thread of this process.

Granian (a Rust HTTP server) offers the ASGI ``http.response.pathsend`` extension, which uvicorn
does not: with it, Starlette's ``FileResponse`` ends its response with one
``http.response.pathsend`` message instead of body messages. Embedded, the server runs the app
on an asyncio loop of its own in this process, so the scripted model and the probes of a test
are the ones the app uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serve_granian(app: Any) -> Iterator[str]:
    """Run ``app`` (lifespan on) under Granian until the block ends; yields its base URL."""
    port = _free_port()
    server = Server(
        app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_enabled=False
    )
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # reported to the test thread below
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="granian", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while True:
        if failure or not thread.is_alive():
            raise RuntimeError(f"granian did not start: {failure!r}")
        try:  # the socket is bound before the app's startup: requests wait for it
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("granian did not start") from None
            time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.stop)
        thread.join(20)
        assert not thread.is_alive(), "granian did not stop"
        assert not failure, failure
