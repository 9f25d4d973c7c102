"""The one deadline of a recovery: set once at the top, observed by every layer below.

A recovery's budget (``timeout``) starts when the recovery starts, so it covers the waits for a
concurrent recovery and for a free slot as well as the agent run. The pipeline turns it into one
anyio cancel scope; the placements, the watchdog and the owner threads that wait for a stuck
agent read the same object instead of restating ``timeout`` plus a margin.
"""

from __future__ import annotations

import time

# How long past the deadline an owner waits for a stuck agent (one blocked in a C call, say)
# before leaving it behind. Keeps "the original exception is back within ``timeout`` + 1 s".
GRACE = 0.5


class Deadline:
    """A point in ``time.monotonic()`` seconds plus the budget it was made from."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float, began: float | None = None) -> None:
        """``began``: when the budget started (``time.monotonic()``), if before now."""
        self.timeout = timeout
        self.at = (time.monotonic() if began is None else began) + timeout

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    @property
    def hard(self) -> float:
        """When an owner stops waiting for an agent that ignored the deadline."""
        return self.at + GRACE

    def backend_deadline(self) -> float:
        """The deadline on the running anyio backend's clock (trio's is not monotonic())."""
        import anyio

        return anyio.current_time() + (self.at - time.monotonic())

    def message(self, what: str = "") -> str:
        """The one wording of a time-out, for reports, notes and events."""
        suffix = f" {what}" if what else ""
        return f"timed out after {self.timeout:g}s{suffix}"
