"""A Starlette app whose endpoint breaks at runtime and is repaired by CrashOverrideMiddleware.

The inventory service renamed a field (``stock`` became ``qty``); ``stock_level`` still reads
the old name, so ``GET /stock/widget`` raises ``KeyError``. The recovery agent reads the code
and the data, patches ``stock_level`` in the running process, replays the request through the
repaired app and the client gets a real 200. Later requests never fail again.

    python examples/asgi_app.py           # offline: scripted agent, uvicorn on 127.0.0.1
    python examples/asgi_app.py --serve   # a real model (OPENAI_API_KEY), on port 8000
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from crashoverride import CrashOverride, RecoveryReport
from crashoverride.integrations.asgi import CrashOverrideMiddleware

INVENTORY = {"widget": {"qty": 4}, "gadget": {"qty": 0}}


def stock_level(sku: str) -> int:
    return INVENTORY[sku]["stock"]  # the service now calls it "qty"


async def stock(request: Request) -> JSONResponse:
    sku = request.path_params["sku"]
    return JSONResponse({"sku": sku, "in_stock": stock_level(sku)})


def build_app(model: Any, on_recovery: Any = None) -> Starlette:
    crash_override = CrashOverride(
        project_prompt="An inventory API. Stock levels must come from INVENTORY; never guess.",
        model=model,
        on_recovery=on_recovery,
    )
    app = Starlette(routes=[Route("/stock/{sku}", stock)])
    app.add_middleware(
        CrashOverrideMiddleware,
        crash_override=crash_override,
        prompt="Answer with the real stock level. Repair the code so later requests work.",
        timeout=20,
    )
    return app


def scripted_agent() -> Any:
    """What a model would do here, scripted so the example runs offline."""
    from agents.testing import ScriptedModel, assistant_message, function_call

    look = "import inspect\nprint(inspect.getsource(stock_level))\nINVENTORY['widget']"
    repair = (
        "def stock_level(sku):\n"
        "    return INVENTORY[sku]['qty']\n"
        "globals()['stock_level'] = stock_level\n"
        "r = await replay_request()\n"
        "r.status, r.json()"
    )
    return ScriptedModel(
        [
            [function_call("exec_python", {"statements": look}, call_id="look")],
            [function_call("exec_python", {"statements": repair}, call_id="repair")],
            [assistant_message("INVENTORY renamed 'stock' to 'qty'; patched and replayed.")],
        ]
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
        for sku in ("widget", "gadget"):
            response = httpx.get(f"http://127.0.0.1:{port}/stock/{sku}", timeout=30)
            print(f"GET /stock/{sku} -> {response.status_code} {response.text}")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    for report in reports:
        print(f"recovery {report.outcome} via {report.via}: {report.diagnosis}")
        print(f"  {len(report.tool_calls)} tool calls, {report.duration_ms:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description="CrashOverride ASGI middleware example")
    parser.add_argument("--serve", action="store_true", help="serve with a real model on :8000")
    args = parser.parse_args()
    if args.serve:
        uvicorn.run(build_app(model=None), host="127.0.0.1", port=8000)
    else:
        offline_demo()


if __name__ == "__main__":
    main()
