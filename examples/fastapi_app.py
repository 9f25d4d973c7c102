"""A FastAPI app where a recovery answers a request with ``respond(...)``.

The exchange-rate cache lacks ``CHF``; ``/convert`` raises ``KeyError``. The agent checks the
authoritative source (``fetch_rate``), refreshes the cache so later requests work, and answers
this request with a response it builds itself. The client sees a 200, never the 500.

    python examples/fastapi_app.py           # offline: scripted agent, uvicorn on 127.0.0.1
    python examples/fastapi_app.py --serve   # a real model (OPENAI_API_KEY), on port 8000
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from crashoverride import CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware

RATE_CACHE = {"EUR": 0.92, "GBP": 0.79}


def fetch_rate(currency: str) -> float:
    """The authoritative rate source (a remote service in a real application)."""
    return {"EUR": 0.92, "GBP": 0.79, "CHF": 0.88}[currency]


def build_app(model: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/convert")
    async def convert(amount: float, currency: str) -> dict[str, Any]:
        rate = RATE_CACHE[currency]
        return {"amount": amount, "currency": currency, "converted": round(amount * rate, 2)}

    co = CrashOverride(
        project_prompt="A currency API. Rates must come from fetch_rate(); never guess one.",
        model=model,
    )
    app.add_middleware(
        CrashOverrideMiddleware,
        crash_override=co,
        prompt="Answer with the correct conversion; refresh stale caches from the real source.",
    )
    return app


def scripted_agent() -> Any:
    from crashoverride.testing import done, exec_python, script

    answer = (
        "from urllib.parse import parse_qs\n"
        "q = {k: v[0] for k, v in parse_qs(request.query).items()}\n"
        "rate = fetch_rate(q['currency'])\n"
        "RATE_CACHE[q['currency']] = rate\n"
        "amount = float(q['amount'])\n"
        "respond(200, {'amount': amount, 'currency': q['currency'],"
        " 'converted': round(amount * rate, 2)})"
    )
    return script(
        exec_python("print(request)\nprint(RATE_CACHE)"),
        exec_python(answer),
        done("CHF was missing from RATE_CACHE; fetched it from fetch_rate and answered."),
    )


def offline_demo() -> None:
    print("(offline: the model is scripted, no AI involved)")
    app = build_app(scripted_agent())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        for currency in ("CHF", "CHF", "EUR"):
            url = f"http://127.0.0.1:{port}/convert?amount=10&currency={currency}"
            response = httpx.get(url, timeout=60)
            print(f"GET /convert?amount=10&currency={currency} -> {response.status_code} "
                  f"{response.text}")  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="serve with a real model on :8000")
    args = parser.parse_args()
    if args.serve:
        uvicorn.run(build_app(model=None), host="127.0.0.1", port=8000)
    else:
        offline_demo()


if __name__ == "__main__":
    main()
