"""The application of the tasks data scenarios (see ``scenarios/tasks_data.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

import csv
import io

PARCELS = {"p-1": {"weight_g": 2400}, "p-2": {"weight_g": 800}, "p-3": {"weight_g": 15000}}


def postage_cents(weight_kg: float) -> int:
    """450 cents up to 1 kg, then 120 cents per started kg above it."""
    extra = max(0, -(-int(weight_kg * 1000 - 1000) // 1000))
    return 450 + 120 * extra


async def postage_for(parcel_id: str) -> int:
    return postage_cents(PARCELS[parcel_id]["weight_kg"])


EXPORTS = {
    "mon": "sku;qty\nkettle;3\nteapot;2\nmug;10\n",
    "tue": "sku;qty\nkettle;1\nmug;4\n",
}


def parse_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


async def units_sold(day: str) -> int:
    return sum(int(row["qty"]) for row in parse_rows(EXPORTS[day]))
