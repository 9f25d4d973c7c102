"""One failure at a time through the CPU-heavy start of a recovery on an application's loop.

Starting a recovery costs the loop a few milliseconds of CPU (formatting the traceback, finding
secrets, building the agent's namespace and texts) in one step, with no await inside. A burst of
failing requests arrives in one loop iteration, so without a lane the loop runs all of those
steps back to back before anything else, and every other request waits for the whole burst
(500 failures: seconds). In the lane, one failure does its heavy step, then yields one loop
iteration before letting the next one in: the loop serves other requests between any two
failures, and the burst's cost is spread instead of paid at once. The wait counts against each
recovery's deadline (its budget began when it failed).

asyncio only (the ``running-loop`` placement); elsewhere the lane is open.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# Per loop: a lock made on one loop is not usable on another (test runners, CLIs run several).
_LANES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def lane() -> AsyncIterator[None]:
    """Hold the running loop's lane for the body (synchronous work), after yielding once."""
    # Through sys.modules: this runs on a first failure, before asyncio need be imported.
    asyncio = sys.modules.get("asyncio")
    loop = asyncio.events._get_running_loop() if asyncio is not None else None
    if asyncio is None or loop is None:  # trio or another backend: its own scheduling
        yield
        return
    try:
        lock = _LANES.get(loop)
        if lock is None:
            lock = _LANES[loop] = asyncio.Lock()
    except TypeError:  # a loop that cannot be weakly referenced: no lane, never a failure
        lock = None
    if lock is None:
        yield
        return
    async with lock:
        # Holding the lane, one iteration first: the failures that arrived with this one queue
        # behind it (a cheap step each) instead of running their heavy steps in this same
        # iteration. Before the body, so a cancellation here leaves nothing half-begun.
        await asyncio.sleep(0)
        yield
