"""The application of the tasks scenarios (see ``scenarios/tasks.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

from typing import Any

INVOICES = {
    "inv-1": {"lines": [{"qty": 2, "unit": {"amount_cents": 1250}},
                        {"qty": 1, "unit": {"amount_cents": 999}}]},
    "inv-2": {"lines": [{"qty": 3, "unit": {"amount_cents": 100}}]},
}  # fmt: skip


def line_cents(line: dict[str, Any]) -> int:
    return int(line["qty"]) * int(line["price_cents"])


def invoice_total(invoice_id: str) -> int:
    return sum(line_cents(line) for line in INVOICES[invoice_id]["lines"])


class Payments:
    """The payment provider. ``charges_for`` is its lookup API."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int]] = []

    async def charge(self, order_id: str, cents: int) -> str:
        self.charges.append((order_id, cents))
        return f"ch_{len(self.charges)}"

    def charges_for(self, order_id: str) -> list[str]:
        return [f"ch_{n}" for n, (o, _) in enumerate(self.charges, 1) if o == order_id]


PAYMENTS = Payments()


ORDERS: dict[str, dict[str, Any]] = {"o-1": {"cents": 4200, "contact_email": "ada@example.com"},
          "o-2": {"cents": 990, "contact_email": "bob@example.com"}}  # fmt: skip


RECEIPTS: list[dict[str, Any]] = []


def receipt_for(order: dict[str, Any], charge_id: str) -> dict[str, Any]:
    return {"to": order["email"], "charge": charge_id, "cents": order["cents"]}


async def settle_order(order_id: str) -> str:
    order = ORDERS[order_id]
    charge_id = await PAYMENTS.charge(order_id, order["cents"])
    RECEIPTS.append(receipt_for(order, charge_id))
    return charge_id


OUTBOX: list[tuple[str, str]] = []


USERS: dict[str, dict[str, Any]] = {
    "u-7": {"email": "cy@example.com", "flags": {"beta"}},
    "u-8": {"email": "di@example.com", "flags": set()},
}


async def send_mail(to: str, subject: str) -> None:
    OUTBOX.append((to, subject))


def mark_welcomed(user: dict[str, Any]) -> None:
    user["flags"].append("welcomed")


async def welcome(user_id: str) -> str:
    user = USERS[user_id]
    await send_mail(user["email"], "Welcome aboard!")
    mark_welcomed(user)
    return "sent"


STOCK: dict[str, int] = {}


RETRY_POLICY = {"retry_on": "ConnectionError", "max_retries": 5, "backoff_s": 60}


async def fetch_stock() -> dict[str, int]:
    raise ConnectionError(
        "inventory service: 503 Service Unavailable (maintenance, back at 06:00 UTC)"
    )


async def sync_stock() -> int:
    stock = await fetch_stock()
    STOCK.update(stock)
    return len(stock)
