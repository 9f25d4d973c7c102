"""Coordination: the one pluggable piece of admission (steps 1-2 of ``_core.pipeline``).

It answers two questions for a failure the pipeline is about to recover: may a recovery run
(the breaker), and who runs the agent for this fingerprint (single-flight). The in-process
backend (the default) answers from ``_admission.limits``; the fleet backend (``_fleet.backend``,
built from a ``RedisCoordination``) first asks the in-process one, so that one failure per process
at most talks to Redis, then coordinates that one with the other processes.

Everything else (the slot, the agent run, the verdict, the outcome) stays in ``_core.pipeline``:
a backend never runs an agent, it only says who does, and after the outcome (``land``) tells
whoever waits elsewhere.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from crashoverride._admission.limits import Admission, Limits
    from crashoverride._core.recovery import Decision, Recovery
    from crashoverride._placement.bridge import Dispatch


class Joined(NamedTuple):
    """Single-flight's answer for one failure."""

    leading: bool
    """This caller runs the agent."""
    recovered: bool = False
    """Not leading: whether the recovery it waited for succeeded (then its unit replays)."""
    skip: str | None = None
    """Why no recovery may run at all (a fleet breaker or budget), in words."""


LEAD = Joined(True)


class Coordination(Protocol):
    """What the pipeline asks of a coordination backend, in this order, once per recovery."""

    def start(self) -> None:
        """Background work the backend does from warm-up on (eager fixes). Never blocks."""

    def admit(self, rec: Recovery) -> Admission:
        """The breaker: may this failure be recovered here? (Never waits.)"""

    async def join(self, rec: Recovery, call: Dispatch) -> Joined:
        """Single-flight: lead, or wait (within the recovery's deadline) for the leader."""

    def report_fields(self, rec: Recovery) -> dict[str, Any]:
        """Fields a succeeding recovery's report gets from coordination (its fix record)."""

    async def land(self, rec: Recovery, decision: Decision) -> None:
        """After the outcome: tell whoever waits. Bounded, never raises."""

    def abandon(self, rec: Recovery) -> None:
        """The recovery ended without an outcome: hand on what it held. Never blocks."""


class InProcess:
    """Today's behaviour: the breaker and single-flight of this process (``_admission.limits``)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def start(self) -> None:
        return None

    def admit(self, rec: Recovery) -> Admission:
        return self.limits.breaker.admit(rec.fingerprint)

    async def join(self, rec: Recovery, call: Dispatch) -> Joined:
        rec.flight, rec.leading = self.limits.flights.join(rec.fingerprint, rec.began)
        if rec.leading:
            return LEAD
        # anyio: only once a recovery is admitted
        from crashoverride._placement.waiting import wait_future

        began = time.monotonic()
        await wait_future(rec.flight.done)
        rec.waited += time.monotonic() - began
        return Joined(False, rec.flight.done.result())

    def report_fields(self, rec: Recovery) -> dict[str, Any]:
        return {}

    async def land(self, rec: Recovery, decision: Decision) -> None:
        # ``Recovery`` lands the local flight itself, with its outcome. Code changes noted for
        # a fix record have nowhere to go in-process.
        self.abandon(rec)

    def abandon(self, rec: Recovery) -> None:
        from crashoverride._repair.journal import take

        take(rec.id)
