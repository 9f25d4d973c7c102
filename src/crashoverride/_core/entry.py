"""Where a failure enters the pipeline: begin its record, admit it, hand it to ``_core.pipeline``.

Admission's first question, whether any model can be reached, is answered here, before the
run machinery (anyio, the placements, the agent and its tools) is imported: a recovery that
cannot run must give the user's exception back in milliseconds. Only what that answer needs
(the record) is imported with this module; not even structlog (it imports asyncio, and more):
the refusal's event goes to a structlog that is already loaded, else nowhere
(``_observe.events.COLD``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, TypeVar

from crashoverride._admission.credentials import missing_credentials
from crashoverride._agent.state import AgentRun
from crashoverride._config.settings import Settings
from crashoverride._core.block import Block
from crashoverride._core.recovery import Decision, Recovery, internal_failure
from crashoverride._core.seen import mark, seen
from crashoverride._observe import events
from crashoverride._placement.lane import lane
from crashoverride._placement.offloop import load
from crashoverride._security.notes import redactor_of

if TYPE_CHECKING:
    from crashoverride._admission.limits import Limits
    from crashoverride._core.record import Record
    from crashoverride._followups.session import Run

_PIPELINE = "crashoverride._core.pipeline"

C = TypeVar("C")


class App(Protocol):
    """What a recovery needs of its ``CrashOverride`` (the composition root, above this)."""

    def _limits(self) -> Limits: ...

    @property
    def _mark(self) -> str: ...

    @property
    def _run_followup(self) -> Run: ...


def admit(rec: Record[C]) -> C | None:
    """Step 1 (credentials): the record's conclusion when no model can be reached, else None.

    ``rec`` is a ``Recovery`` or a follow-up's record; both conclude the same way.
    """
    missing = missing_credentials(rec.settings)
    if missing is None:
        return None
    cold = events.COLD.set(True)  # its event is not worth importing structlog for
    try:
        return rec.concluded(AgentRun(failure=missing), None)
    finally:
        events.COLD.reset(cold)


def _start(
    app: App, settings: Settings, exc: BaseException, block: Block, began: float | None = None
) -> Recovery | Decision | None:
    """The admitted record; or the ``Decision`` that ends the recovery here; or None (let
    ``exc`` propagate as it is)."""
    if seen(exc, app):
        return None  # already through a recovery of this CrashOverride: let it pass, unchanged
    mark(exc, app)
    from crashoverride._repair import watch

    # First: a live patch this failure shows worse is reverted before anything is decided,
    # so this failure is recovered afresh, against the old code (never replayed through it).
    watch.observe(exc)
    try:
        rec = Recovery(settings, app._limits(), exc, block, app._run_followup, began)
    except Exception as problem:
        internal_failure(exc, problem, redactor_of(lambda: settings))
        return None
    try:
        refused = admit(rec)
    except Exception as problem:
        _broken(rec, exc, problem)
        return None
    return rec if refused is None else refused


def _broken(rec: Recovery, exc: BaseException, problem: Exception) -> None:
    internal_failure(exc, problem, rec.redact)
    rec.abandon()


async def recover_async(
    app: App, settings: Settings, exc: BaseException, block: Block
) -> Decision | None:
    """Recover from async code on any anyio backend. None: let ``exc`` propagate as it is."""
    began = time.monotonic()  # the budget starts now, the wait for the lane included
    async with lane():  # one failure's heavy start at a time on the loop (``_placement.lane``)
        rec = _start(app, settings, exc, block, began)
    if not isinstance(rec, Recovery):
        return rec
    try:
        await load(_PIPELINE)  # the run machinery, off the loop the first time
    except Exception as problem:
        _broken(rec, exc, problem)
        return None
    except BaseException:  # cancelled or interrupted meanwhile: one terminal event, re-raised
        rec.cancelled()
        rec.abandon()
        raise
    from crashoverride._core.pipeline import recover_admitted_async

    return await recover_admitted_async(rec, exc)


def recover_sync(app: App, settings: Settings, exc: BaseException, block: Block) -> Decision | None:
    """Recover from synchronous code. None: let ``exc`` propagate as it is."""
    rec = _start(app, settings, exc, block)
    if not isinstance(rec, Recovery):
        return rec
    try:
        from crashoverride._core.pipeline import recover_admitted_sync
    except Exception as problem:
        _broken(rec, exc, problem)
        return None
    return recover_admitted_sync(rec, exc)
