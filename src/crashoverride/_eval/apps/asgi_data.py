"""The application of the asgi data scenarios (see ``scenarios/asgi_data.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

CATALOGUE = {
    "kettle": {"sku": "kettle", "name": "Kettle", "unit_price": 2500},
    "teapot": {"sku": "teapot", "name": "Teapot", "unit_price": 1800},
}


async def fetch_product(sku: str) -> dict[str, Any]:
    return dict(CATALOGUE[sku])


def line_total(product: dict[str, Any], quantity: int) -> int:
    return int(product["price"]) * quantity


async def quote(request: Request) -> JSONResponse:
    sku = request.path_params["sku"]
    quantity = int(request.query_params.get("qty", "1"))
    product = await fetch_product(sku)
    return JSONResponse({"sku": sku, "total_cents": line_total(product, quantity)})


STATUS_LABELS = {"pending": "Awaiting payment", "paid": "Paid", "shipped": "On its way"}


# The order service's own catalogue of statuses and their labels: the source of truth.
_UPSTREAM_STATUSES = {**STATUS_LABELS, "on_hold": "On hold: address check"}


ORDERS = {"A1": "on_hold", "A2": "paid", "A3": "on_hold"}


async def fetch_status_catalogue() -> dict[str, str]:
    return dict(_UPSTREAM_STATUSES)


def label_for(status: str) -> str:
    return STATUS_LABELS[status]


async def order_status(request: Request) -> JSONResponse:
    order = request.path_params["order"]
    return JSONResponse({"order": order, "status": label_for(ORDERS[order])})


USERS: dict[str, dict[str, Any]] = {
    "u1": {"name": "Ada", "address": None},
    "u2": {"name": "Bob", "address": {"city": "Leeds"}},
    "u3": {"name": "Cy", "address": None},
}


def city_of(user: dict[str, Any]) -> str:
    return str(user["address"]["city"])


async def user_city(request: Request) -> JSONResponse:
    user_id = request.path_params["user"]
    return JSONResponse({"user": user_id, "city": city_of(USERS[user_id])})


NOW = datetime(2026, 11, 30, 12, 0)  # the service's clock: naive, in UTC


TOKENS = {
    "t1": "2026-11-30T13:30:00+02:00",
    "t2": "2026-11-30T12:45:00+00:00",
    "t3": "2026-11-30T10:00:00",
}


def expires_at(token: str) -> datetime:
    return datetime.fromisoformat(TOKENS[token])


async def token_state(request: Request) -> JSONResponse:
    token = request.path_params["token"]
    return JSONResponse({"token": token, "expired": expires_at(token) <= NOW})
