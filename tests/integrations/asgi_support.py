"""A real uvicorn server on 127.0.0.1 in a thread, and scripted-agent step builders."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from agents.testing import ScriptedModel, assistant_message, function_call

_ids = itertools.count(1)


def exec_step(statements: str) -> list[Any]:
    return [function_call("exec_python", {"statements": statements}, call_id=f"asgi{next(_ids)}")]


def give_up_step(reason: str) -> list[Any]:
    return [function_call("give_up", {"reason": reason}, call_id=f"asgi{next(_ids)}")]


def done_step(text: str = "done") -> list[Any]:
    return [assistant_message(text)]


def scripted(*steps: list[Any]) -> ScriptedModel:
    """One list of output items per model turn; turns are consumed across agent runs."""
    return ScriptedModel(list(steps))


def tool_outputs(model: ScriptedModel) -> list[str]:
    """The tool results the model was sent, in order."""
    outputs: list[str] = []
    seen: set[str] = set()
    for call in model.calls:
        for item in call.input if isinstance(call.input, list) else []:
            is_output = isinstance(item, dict) and item.get("type") == "function_call_output"
            if is_output and item["call_id"] not in seen:
                seen.add(item["call_id"])
                outputs.append(str(item["output"]))
    return outputs


def first_input(model: ScriptedModel) -> str:
    """The text the agent was first given (exception, traceback, brief)."""
    call = model.first_call
    assert call is not None
    items = call.input
    if isinstance(items, str):
        return items
    return "\n".join(str(item.get("content", "")) for item in items if isinstance(item, dict))


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
