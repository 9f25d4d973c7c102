"""Every structlog event name crashoverride emits, in one place.

The library emits; it never configures logging or structlog.

Event names follow ``noun.verb_past``. Emitting must never disturb a recovery, so a failing
logging pipeline is contained here.
"""

from __future__ import annotations

from typing import Any

STARTED = "recovery.started"
TOOL_CALLED = "recovery.tool_called"
SUCCEEDED = "recovery.succeeded"
# A repair-only block (a response that had started) whose code was repaired for later calls.
REPAIRED = "recovery.repaired"
FAILED = "recovery.failed"
SKIPPED = "recovery.skipped"
CANCELLED = "recovery.cancelled"
REPLAY_FAILED = "recovery.replay_failed"
LOOP_BLOCKED = "recovery.loop_blocked"
# A recipe (an earlier recovery's state repair) failed to run here: the agent runs instead.
RECIPE_FAILED = "recovery.recipe_failed"
CALLBACK_FAILED = "recovery.callback_failed"
# A telemetry observer (OpenTelemetry, Sentry) raised: it is dropped for that recovery.
OBSERVER_FAILED = "recovery.observer_failed"
# A ledger sink (RedisStreamLedger) could not store a report.
LEDGER_FAILED = "ledger.write_failed"
SOURCE_CHANGED = "recovery.source_changed"
WARM_UP_FAILED = "recovery.warm_up_failed"

# Fleet coordination (RedisCoordination). Degraded: Redis did not answer in time; this process
# coordinates alone for a while.
COORDINATION_DEGRADED = "coordination.degraded"
LEASE_TAKEN = "fleet.lease_taken"
LEASE_LOST = "fleet.lease_lost"
FIX_PUBLISHED = "fleet.fix_published"
FIX_APPLIED = "fleet.fix_applied"
FIX_REFUSED = "fleet.fix_refused"
# A fix applied eagerly (no recovery, so no report): its audit line, as ``*.tool_called``.
FLEET_TOOL_CALLED = "fleet.tool_called"
# A recovery's recipe holds a secret: its fix record goes out without it (``_recipes``).
RECIPE_WITHHELD = "fleet.recipe_withheld"
# A code fix whose new source holds a secret: it runs here, and is never published.
FIX_WITHHELD = "fleet.fix_withheld"

FOLLOWUP_SUBMITTED = "followup.submitted"
FOLLOWUP_STARTED = "followup.started"
FOLLOWUP_TOOL_CALLED = "followup.tool_called"
FOLLOWUP_SUCCEEDED = "followup.succeeded"
FOLLOWUP_FAILED = "followup.failed"
# Sent to a queue (Celery) that no running worker consumes: it will wait there, unrun.
FOLLOWUP_UNCONSUMED = "followup.unconsumed"

BACKGROUND_SUBMITTED = "background.submitted"
BACKGROUND_SUCCEEDED = "background.succeeded"
BACKGROUND_FAILED = "background.failed"
BACKGROUND_CANCELLED = "background.cancelled"


def emit(level: str, event: str, **fields: Any) -> None:
    try:
        import structlog

        from crashoverride._security.redact import MASK
        from crashoverride._security.secrets import mask

        # The last line of defence for events: a field that escaped its recovery's redactor
        # (an exception's repr from a background job, an internal error) is still scanned.
        for name, value in fields.items():
            if isinstance(value, str):
                fields[name] = mask(value, MASK)
        getattr(structlog.get_logger("crashoverride"), level)(event, **fields)
    except Exception:  # a broken log pipeline must not replace the user's exception
        pass


def bound(**fields: Any) -> Any:
    """Bind ``fields`` to structlog's contextvars for the duration of a recovery."""
    import structlog.contextvars

    return structlog.contextvars.bound_contextvars(**fields)
