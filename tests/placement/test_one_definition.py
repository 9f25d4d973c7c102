"""The public contract's placement helpers are the placements' own, not copies of them."""

from __future__ import annotations

from crashoverride import integration
from crashoverride._placement import bridge


def test_integration_on_asyncio_is_the_bridge_function() -> None:
    # A second definition drifted once (the bridge's answer decides the placement; an
    # integration asking "am I on asyncio?" must get the same answer from the same code).
    assert integration.on_asyncio is bridge.on_asyncio
    assert integration.loop_running_here is bridge.loop_running_here
