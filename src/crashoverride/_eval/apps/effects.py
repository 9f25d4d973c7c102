"""The application of the effects scenarios (see ``scenarios/effects.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

from typing import Any

import anyio

CHARGE_TIMEOUT_S = 2.0


class Payments:
    """The payment provider's client. ``charges_for`` is its lookup API."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int]] = []

    async def charge(self, order_id: str, cents: int) -> str:
        self.charges.append((order_id, cents))
        charge_id = f"ch_{len(self.charges)}"
        if len(self.charges) == 1:
            await anyio.sleep(60)  # the provider took it; its answer is slow to come back
        return charge_id

    def charges_for(self, order_id: str) -> list[str]:
        return [f"ch_{n}" for n, (o, _) in enumerate(self.charges, 1) if o == order_id]


PAYMENTS = Payments()


ORDERS: dict[str, dict[str, Any]] = {"o-5": {"cents": 1800}, "o-6": {"cents": 2500}}


PAID: dict[str, str] = {}  # order id -> the charge that paid it


async def checkout(order_id: str) -> str:
    with anyio.fail_after(CHARGE_TIMEOUT_S):
        charge_id = await PAYMENTS.charge(order_id, ORDERS[order_id]["cents"])
    PAID[order_id] = charge_id
    return charge_id
