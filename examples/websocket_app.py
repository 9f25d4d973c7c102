"""A Starlette websocket endpoint that breaks mid-connection and is repaired per message.

The shipment service renamed a field (``eta`` became ``arrives``); ``describe`` still reads the
old name, so the message ``A17`` makes the endpoint raise ``KeyError`` while the connection is
open. CrashOverrideMiddleware hands the failed message to the recovery agent, which patches
``describe`` in the running process and replays the message: the endpoint is started again for
the same connection (the handshake and its greeting are not repeated), handles ``A17`` with the
repaired code, and goes on with the client's next messages. The client never reconnects.

    python examples/websocket_app.py           # offline: scripted agent, uvicorn on 127.0.0.1
    python examples/websocket_app.py --serve   # a real model (OPENAI_API_KEY), on port 8000
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.sync.client import connect

from crashoverride import CrashOverride, RecoveryReport
from crashoverride.integrations.asgi import CrashOverrideMiddleware

SHIPMENTS = {
    "A17": {"status": "in transit", "arrives": "2026-12-09"},
    "B42": {"status": "delivered", "arrives": "2026-12-01"},
}


def describe(ref: str) -> dict[str, str]:
    shipment = SHIPMENTS[ref]
    return {"ref": ref, "status": shipment["status"], "eta": shipment["eta"]}  # now "arrives"


async def track(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_json({"hello": "send a shipment reference"})
    try:
        while True:
            ref = await websocket.receive_text()
            await websocket.send_json(describe(ref))
    except WebSocketDisconnect:
        return


def build_app(model: Any, on_recovery: Any = None) -> Starlette:
    crash_override = CrashOverride(
        project_prompt="A shipment tracker. Shipment data comes from SHIPMENTS; never guess.",
        model=model,
        on_recovery=on_recovery,
    )
    app = Starlette(routes=[WebSocketRoute("/track", track)])
    app.add_middleware(
        CrashOverrideMiddleware,
        crash_override=crash_override,
        prompt="Answer the message with real data. Repair the code so later messages work.",
        timeout=20,
    )
    return app


def scripted_agent() -> Any:
    """What a model would do here, scripted so the example runs offline."""
    from crashoverride.testing import done, exec_python, script

    repair = (
        "def describe(ref):\n"
        "    shipment = SHIPMENTS[ref]\n"
        "    return {'ref': ref, 'status': shipment['status'], 'eta': shipment['arrives']}\n"
        "replace_function(globals()['describe'], describe)\n"
        "replay = await replay_message()\n"
        "replay"
    )
    return script(
        exec_python("message, SHIPMENTS['A17']"),
        exec_python(repair),
        done("SHIPMENTS renamed 'eta' to 'arrives'; patched describe and replayed the message."),
    )


def offline_demo() -> None:
    reports: list[RecoveryReport] = []
    app = build_app(scripted_agent(), on_recovery=reports.append)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        with connect(f"ws://127.0.0.1:{port}/track") as websocket:
            print(f"<- {websocket.recv(timeout=30)}")
            for ref in ("A17", "B42"):
                websocket.send(ref)
                print(f"-> {ref}")
                print(f"<- {websocket.recv(timeout=30)}")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    for report in reports:
        print(f"recovery {report.outcome} via {report.via}: {report.diagnosis}")


def main() -> None:
    parser = argparse.ArgumentParser(description="CrashOverride websocket example")
    parser.add_argument("--serve", action="store_true", help="serve with a real model on :8000")
    args = parser.parse_args()
    if args.serve:
        uvicorn.run(build_app(model=None), host="127.0.0.1", port=8000)
    else:
        offline_demo()


if __name__ == "__main__":
    main()
