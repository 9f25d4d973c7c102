"""The application of the websocket scenarios (see ``scenarios/websocket.py``).

A live quotes feed: the client sends a symbol, the endpoint answers with its quote. Only
application code and its "upstream" data live here: this module is the agent's namespace.
"""

from __future__ import annotations

from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

# The market data service's current quotes.
QUOTES: dict[str, dict[str, Any]] = {
    "ACME": {"last": {"amount": "12.50", "currency": "EUR"}, "venue": "XPAR"},
    "BOLT": {"last": {"amount": "7.05", "currency": "EUR"}, "venue": "XPAR"},
    "CORE": {"last": {"amount": "101.20", "currency": "USD"}, "venue": "XNYS"},
}


def quote_of(symbol: str) -> dict[str, Any]:
    entry = QUOTES[symbol]
    return {"symbol": symbol, "price": entry["price"], "currency": entry["currency"]}


async def quotes(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            symbol = await websocket.receive_text()
            await websocket.send_json(quote_of(symbol.strip().upper()))
    except WebSocketDisconnect:
        return
