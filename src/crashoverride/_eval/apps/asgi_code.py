"""The application of the asgi code scenarios (see ``scenarios/asgi_code.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

ITEMS = [f"item-{n}" for n in range(1, 9)]


async def fetch_page(cursor: str | None) -> dict[str, Any]:
    """The upstream list API. Its cursors used to be offsets; now they are opaque tokens."""
    start = 0 if cursor is None else int(base64.urlsafe_b64decode(cursor[2:]).decode())
    end = start + 3
    token = "c:" + base64.urlsafe_b64encode(str(end).encode()).decode()
    return {"items": ITEMS[start:end], "next": token if end < len(ITEMS) else None}


async def all_items() -> list[str]:
    items: list[str] = []
    cursor: int | None = None
    while True:
        page = await fetch_page(None if cursor is None else str(cursor))
        items += page["items"]
        if page["next"] is None:
            return items
        cursor = int(page["next"])


async def export(request: Request) -> JSONResponse:
    return JSONResponse({"items": await all_items()})


async def count(request: Request) -> JSONResponse:
    return JSONResponse({"count": len(await all_items())})


TAX: Any = 0.075


NET = {"notebook": Decimal("3.00"), "pen": Decimal("2.60"), "mug": Decimal("10.00")}


def gross(net: Decimal) -> Any:
    return round(net * (1 + TAX), 2)


async def price(request: Request) -> JSONResponse:
    item = request.path_params["item"]
    return JSONResponse({"item": item, "gross": str(gross(NET[item]))})


ACCOUNTS = {"acc_1001": {"balance_cents": 5000}, "acc_1002": {"balance_cents": 120}}


def account_key(raw: str) -> Any:
    return int(raw)


async def balance(request: Request) -> JSONResponse:
    key = account_key(request.path_params["account"])
    return JSONResponse({"account": key, "balance_cents": ACCOUNTS[key]["balance_cents"]})


def loyalty_points(total_cents: int, tier: str) -> int:
    """Points an order earns: one per full euro of the total, doubled for the "gold" tier.
    Orders under 5 euros earn nothing."""
    raise NotImplementedError("loyalty_points: see the docstring and the callers")


def receipt_footer(total_cents: int, tier: str) -> str:
    """How the receipt printer calls it (mobile checkout does the same)."""
    return f"You earned {loyalty_points(total_cents, tier)} points"


async def points(request: Request) -> JSONResponse:
    total = int(request.query_params["total"])
    tier = request.query_params.get("tier", "basic")
    return JSONResponse({"points": loyalty_points(total, tier)})
