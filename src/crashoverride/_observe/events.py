"""Every structlog event name crashoverride emits, in one place.

The library emits; it never configures logging or structlog.

Event names follow ``noun.verb_past``; like every field, they are redactor output (``fixed``).
Emitting must never disturb a recovery, so a failing logging pipeline is contained here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, Final

from crashoverride._security.redact import Redacted, fixed

# What an event may carry: redactor output, numbers, flags, lists of redacted names. A plain
# ``str`` is a type error: it has not been through a redactor.
Field = Redacted | float | None | Sequence[Redacted]

# A recovery began: the failure was admitted and an agent (or a recipe, or a fleet fix) runs.
STARTED: Final = fixed("recovery.started")
# One tool call of a recovery, denied ones included: the code executed (truncated), its
# result and who approved it (``report.tool_calls`` holds the same).
TOOL_CALLED: Final = fixed("recovery.tool_called")
# Recovered: the exception was suppressed, a value returned or a response sent.
SUCCEEDED: Final = fixed("recovery.succeeded")
# A repair-only block (a response that had started) whose code was repaired for later calls.
REPAIRED: Final = fixed("recovery.repaired")
# Not recovered (with the reason): the original exception is re-raised with a note.
FAILED: Final = fixed("recovery.failed")
# No model call: breaker open, overload, budget, inside a recovery, the leader failed, a
# response already started, the client gone; the original is re-raised with a note.
SKIPPED: Final = fixed("recovery.skipped")
# The surrounding task was cancelled (or the process interrupted) during the recovery.
CANCELLED: Final = fixed("recovery.cancelled")
# A single-flight waiter's replay through the repaired code failed again.
REPLAY_FAILED: Final = fixed("recovery.replay_failed")
# A sync block failed inside a running event loop (sync code called from async code): that
# loop was blocked until the recovery ended (``blocked_ms``).
LOOP_BLOCKED: Final = fixed("recovery.loop_blocked")
# A recipe (an earlier recovery's state repair) failed to run here: the agent runs instead.
RECIPE_FAILED: Final = fixed("recovery.recipe_failed")
# ``on_recovery`` raised: logged, never raised to the application.
CALLBACK_FAILED: Final = fixed("recovery.callback_failed")
# A telemetry observer (OpenTelemetry, Sentry) raised: it is dropped for that recovery.
OBSERVER_FAILED: Final = fixed("recovery.observer_failed")
# A ledger sink (RedisStreamLedger) could not store a report.
LEDGER_FAILED: Final = fixed("ledger.write_failed")
# A fix was persisted to a source file (or proposed as a ``.patch``): the unified diff.
SOURCE_CHANGED: Final = fixed("recovery.source_changed")
# A live patch made things worse (``patch_watch``, ``_repair.watch``): the old code is back.
PATCH_REVERTED: Final = fixed("recovery.patch_reverted")
# ``warm_up()`` / ``awarm_up()`` could not import or prepare the SDK ahead of a failure.
WARM_UP_FAILED: Final = fixed("recovery.warm_up_failed")

# Fleet coordination (RedisCoordination). Degraded: Redis did not answer in time; this process
# coordinates alone for a while.
COORDINATION_DEGRADED: Final = fixed("coordination.degraded")
# This process leads the fleet's recovery of a fingerprint (``takeover``: a dead leader's).
LEASE_TAKEN: Final = fixed("fleet.lease_taken")
# A newer leader took over this recovery's lease: this process's outcome was not published.
LEASE_LOST: Final = fixed("fleet.lease_lost")
# A verified fix record (signed) was stored in Redis and announced to the fleet.
FIX_PUBLISHED: Final = fixed("fleet.fix_published")
# A fix record from the fleet was applied here (``not_applied``: file edits it only carried).
FIX_APPLIED: Final = fixed("fleet.fix_applied")
# A fix record was not applied (bad signature, another deployment's code, another failure's
# record, too old, denied by ``approve=``), with the reason.
FIX_REFUSED: Final = fixed("fleet.fix_refused")
# A fix applied eagerly (no recovery, so no report): its audit line, as ``*.tool_called``.
FLEET_TOOL_CALLED: Final = fixed("fleet.tool_called")
# A recovery's recipe holds a secret: its fix record goes out without it (``_repair.recipes``).
RECIPE_WITHHELD: Final = fixed("fleet.recipe_withheld")
# A code fix whose new source holds a secret: it runs here, and is never published.
FIX_WITHHELD: Final = fixed("fleet.fix_withheld")

# Declared effects (``CrashOverride.effect``) met again by a replay or by agent code: returned
# from the journal without running...
EFFECT_REPLAYED: Final = fixed("effect.replayed")
# ...confirmed by the effect's ``probe=`` (a call begun and never seen to end)...
EFFECT_PROBED: Final = fixed("effect.probed")
# ...or refused as uncertain: begun, never seen to end, no probe (``EffectUncertain``).
EFFECT_UNCERTAIN: Final = fixed("effect.uncertain")
# A journal entry read from Redis that does not verify (unsigned, malformed, copied from another
# call, unit or namespace, expired): taken as no entry.
EFFECT_REFUSED: Final = fixed("effect.refused")
EFFECTS: Final = {
    "replayed": EFFECT_REPLAYED,
    "probed": EFFECT_PROBED,
    "uncertain": EFFECT_UNCERTAIN,
}

# Follow-up jobs (``spawn_followup``, ``followups=``): handed to the runner...
FOLLOWUP_SUBMITTED: Final = fixed("followup.submitted")
# ...its agent run began...
FOLLOWUP_STARTED: Final = fixed("followup.started")
# ...one of its tool calls (the fields of ``recovery.tool_called``)...
FOLLOWUP_TOOL_CALLED: Final = fixed("followup.tool_called")
# ...it ended with its objective done...
FOLLOWUP_SUCCEEDED: Final = fixed("followup.succeeded")
# ...or not (gave up, timed out, refused, cut off at exit).
FOLLOWUP_FAILED: Final = fixed("followup.failed")
# Sent to a queue (Celery) that no running worker consumes: it will wait there, unrun.
FOLLOWUP_UNCONSUMED: Final = fixed("followup.unconsumed")

# Work a request recovery spawned (``spawn_background``) in the lifespan's task group: queued...
BACKGROUND_SUBMITTED: Final = fixed("background.submitted")
# ...finished...
BACKGROUND_SUCCEEDED: Final = fixed("background.succeeded")
# ...raised...
BACKGROUND_FAILED: Final = fixed("background.failed")
# ...or was cancelled (shut down before it started, or still running after ``shutdown_grace``).
BACKGROUND_CANCELLED: Final = fixed("background.cancelled")


# Set while a failure is refused before any run (no credentials, ``_core.entry.admit``): its
# event goes to a structlog already loaded, else nowhere. A process that never imported
# structlog cannot have configured it, nor be capturing its events; importing it for that (it
# imports asyncio, and twisted or rich when they are installed) would be most of that
# refusal's cost. Every other event imports structlog if it must, as it always has.
COLD: ContextVar[bool] = ContextVar("crashoverride_cold_event", default=False)


def emit(level: str, event: Redacted, **fields: Field) -> None:
    """Emit ``event`` to structlog (loaded if need be; see ``COLD`` for the one exception)."""
    # Absent, or still importing (a half-made module has no ``get_logger`` yet).
    if COLD.get() and not hasattr(sys.modules.get("structlog"), "get_logger"):
        return
    try:
        import structlog

        from crashoverride._security.redact import scanned_data

        # The last line of defence behind the types: a field that reached here untyped (an
        # integration's ``Any``) is still scanned, by the rules every redactor applies.
        getattr(structlog.get_logger("crashoverride"), level)(event, **scanned_data(fields))
    except Exception:  # a broken log pipeline must not replace the user's exception
        pass


def bound(**fields: Any) -> Any:
    """Bind ``fields`` to structlog's contextvars for the duration of a recovery."""
    import structlog.contextvars

    return structlog.contextvars.bound_contextvars(**fields)
