"""A waiter's side of fleet single-flight: the outcome of the episode whose lease it found.

It subscribes to the failure's outcome channel first, THEN reads the stored outcome (one
published in between is not missed), and waits for a message, looking at the lease again at
least every ``MAX_WAKE`` seconds (its holder may have died). It runs on the fleet's helper loop,
bounded by the recovery's deadline; each call to Redis by ``op_timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crashoverride._fleet.scripts import MAX_WAKE, newer, outcome_and_lease


async def wait_outcome(
    client: Any, keys: dict[str, str], token: int, bound: float
) -> dict[str, Any] | None:
    """The outcome of episode ``token`` or a later one; None when the lease lapsed without
    one (its holder is gone: the caller takes over)."""
    pubsub = client.pubsub()
    try:
        async with asyncio.timeout(bound):  # a connection of its own: no longer than a call
            await pubsub.subscribe(keys["channel"])
        while True:
            async with asyncio.timeout(bound):
                raw, left_ms = await outcome_and_lease(client, keys)
            outcome = newer(raw, token)
            if outcome is not None:
                return outcome
            if left_ms == -2:  # no lease and no outcome: the holder is gone
                return None
            message = await _heard(pubsub, min(MAX_WAKE, max(left_ms, 0) / 1000 + 0.05))
            if message is not None:
                outcome = newer(message.get("data"), token)
                if outcome is not None:
                    return outcome
    finally:
        try:
            async with asyncio.timeout(bound):
                await pubsub.aclose()
        except Exception:  # a dead connection: nothing left to close cleanly
            pass


async def _heard(pubsub: Any, wake: float) -> dict[str, Any] | None:
    """The next message on the channel within ``wake`` seconds, else None. The subscription's
    own confirmation is none: redis-py hands it back as None at once, which would send the
    waiter to Redis again for nothing (two more commands per waiter, measured by
    ``benchmarks.bench_fleet_scale``)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wake
    while (left := until - loop.time()) > 0:
        message: dict[str, Any] | None = await pubsub.get_message(
            ignore_subscribe_messages=True, timeout=left
        )
        if message is not None:
            return message
    return None
