"""The application of the revert scenarios (see ``scenarios/revert.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

LEDGER: list[tuple[str, float]] = []  # account, amount booked


def parse_amount(text: str) -> float:
    return float(text)


async def import_row(row: str) -> float:
    account, amount = row.split(";")
    value = parse_amount(amount)
    LEDGER.append((account, value))
    return value
