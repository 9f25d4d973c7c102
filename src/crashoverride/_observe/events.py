"""Every structlog event name crashoverride emits, in one place.

The library emits; it never configures logging or structlog.

Event names follow ``noun.verb_past``; like every field, they are redactor output (``fixed``).
Emitting must never disturb a recovery, so a failing logging pipeline is contained here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

from crashoverride._security.redact import Redacted, fixed

# What an event may carry: redactor output, numbers, flags, lists of redacted names. A plain
# ``str`` is a type error: it has not been through a redactor.
Field = Redacted | float | None | Sequence[Redacted]

STARTED: Final = fixed("recovery.started")
TOOL_CALLED: Final = fixed("recovery.tool_called")
SUCCEEDED: Final = fixed("recovery.succeeded")
# A repair-only block (a response that had started) whose code was repaired for later calls.
REPAIRED: Final = fixed("recovery.repaired")
FAILED: Final = fixed("recovery.failed")
SKIPPED: Final = fixed("recovery.skipped")
CANCELLED: Final = fixed("recovery.cancelled")
REPLAY_FAILED: Final = fixed("recovery.replay_failed")
LOOP_BLOCKED: Final = fixed("recovery.loop_blocked")
# A recipe (an earlier recovery's state repair) failed to run here: the agent runs instead.
RECIPE_FAILED: Final = fixed("recovery.recipe_failed")
CALLBACK_FAILED: Final = fixed("recovery.callback_failed")
# A telemetry observer (OpenTelemetry, Sentry) raised: it is dropped for that recovery.
OBSERVER_FAILED: Final = fixed("recovery.observer_failed")
# A ledger sink (RedisStreamLedger) could not store a report.
LEDGER_FAILED: Final = fixed("ledger.write_failed")
SOURCE_CHANGED: Final = fixed("recovery.source_changed")
# A live patch made things worse (``patch_watch``, ``_repair.watch``): the old code is back.
PATCH_REVERTED: Final = fixed("recovery.patch_reverted")
WARM_UP_FAILED: Final = fixed("recovery.warm_up_failed")

# Fleet coordination (RedisCoordination). Degraded: Redis did not answer in time; this process
# coordinates alone for a while.
COORDINATION_DEGRADED: Final = fixed("coordination.degraded")
LEASE_TAKEN: Final = fixed("fleet.lease_taken")
LEASE_LOST: Final = fixed("fleet.lease_lost")
FIX_PUBLISHED: Final = fixed("fleet.fix_published")
FIX_APPLIED: Final = fixed("fleet.fix_applied")
FIX_REFUSED: Final = fixed("fleet.fix_refused")
# A fix applied eagerly (no recovery, so no report): its audit line, as ``*.tool_called``.
FLEET_TOOL_CALLED: Final = fixed("fleet.tool_called")
# A recovery's recipe holds a secret: its fix record goes out without it (``_repair.recipes``).
RECIPE_WITHHELD: Final = fixed("fleet.recipe_withheld")
# A code fix whose new source holds a secret: it runs here, and is never published.
FIX_WITHHELD: Final = fixed("fleet.fix_withheld")

# Declared effects (``CrashOverride.effect``) met again by a replay or by agent code: returned
# from the journal without running, confirmed by the probe, or refused as uncertain.
EFFECT_REPLAYED: Final = fixed("effect.replayed")
EFFECT_PROBED: Final = fixed("effect.probed")
EFFECT_UNCERTAIN: Final = fixed("effect.uncertain")
# A journal entry read from Redis that does not verify (unsigned, malformed, copied from another
# call, unit or namespace, expired): taken as no entry.
EFFECT_REFUSED: Final = fixed("effect.refused")
EFFECTS: Final = {
    "replayed": EFFECT_REPLAYED,
    "probed": EFFECT_PROBED,
    "uncertain": EFFECT_UNCERTAIN,
}

FOLLOWUP_SUBMITTED: Final = fixed("followup.submitted")
FOLLOWUP_STARTED: Final = fixed("followup.started")
FOLLOWUP_TOOL_CALLED: Final = fixed("followup.tool_called")
FOLLOWUP_SUCCEEDED: Final = fixed("followup.succeeded")
FOLLOWUP_FAILED: Final = fixed("followup.failed")
# Sent to a queue (Celery) that no running worker consumes: it will wait there, unrun.
FOLLOWUP_UNCONSUMED: Final = fixed("followup.unconsumed")

BACKGROUND_SUBMITTED: Final = fixed("background.submitted")
BACKGROUND_SUCCEEDED: Final = fixed("background.succeeded")
BACKGROUND_FAILED: Final = fixed("background.failed")
BACKGROUND_CANCELLED: Final = fixed("background.cancelled")


def emit(level: str, event: Redacted, **fields: Field) -> None:
    """Emit ``event`` to structlog, if structlog is loaded.

    A process that never imported structlog cannot have configured it, nor be capturing its
    events: the event would only be printed by structlog's defaults. Importing it for that (it
    imports asyncio, and twisted or rich when they are installed) would cost a failure that
    never reaches the run machinery, one without credentials, most of its time. A recovery that
    runs loads structlog with ``_core.pipeline``, so its events are emitted as always.
    """
    structlog = sys.modules.get("structlog")
    if structlog is None or not hasattr(structlog, "get_logger"):  # absent, or still importing
        return
    try:
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
