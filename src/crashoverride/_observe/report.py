"""The public record of one recovery (text only: never frames, tracebacks or locals), and what
``approve=`` is shown of each tool call before it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from crashoverride._security.audit import ToolCallRecord
from crashoverride._security.redact import EMPTY, Redacted, fixed

Outcome = Literal["recovered", "repaired", "failed", "skipped"]
REPAIR = fixed("repair")


@dataclass(frozen=True, slots=True)
class SourceChange:
    """A source file a recovery changed (``written``) or proposed a patch for (``proposed``),
    or a live function whose code agent code replaced in the process (``live``,
    ``replace_function``: ``path`` names the function, the diff is its old source against new).

    ``file`` is the backup of the previous source, the ``.patch`` file for review, or (live)
    the file the function was defined in.
    """

    path: Redacted
    kind: Literal["written", "proposed", "live"]
    diff: Redacted
    file: Redacted


@dataclass(frozen=True, slots=True)
class Usage:
    """Model usage summed over the run."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What happened in one recovery.

    Attributes:
        recovery_id: Unique id, also in every event and in the note on a re-raised exception.
        outcome: ``"recovered"`` (exception suppressed), ``"failed"`` (original re-raised),
            ``"skipped"`` (no agent ran: breaker open, overload, or the response had started)
            or ``"repaired"`` (a repair-only block: the code was repaired so later calls work,
            but this occurrence could not be undone and its exception is re-raised).
        reason: Why the outcome is what it is, in one line.
        via: ``"agent"``, ``"replay"`` (a single-flight waiter re-ran after another recovery
            fixed the code), ``"recipe"`` (an earlier recovery's state repair of this ``with``
            block ran again and the postcondition holds: no model call) or ``"none"``.
        diagnosis: The agent's final message, or its give-up reason.
        fleet_role: With ``RedisCoordination``: ``"leader"`` (ran the agent for the fleet),
            ``"waiter"`` (waited for another process's recovery), ``"replayed-fix"`` (applied
            a stored fix record and replayed: no model call) or ``"degraded"`` (Redis did not
            answer: coordinated in this process alone). Empty in-process.
        fencing_token: The fleet lease's token of the episode this recovery led or waited for.
        fix_record: The id of the fix record this recovery published or applied.
        occurrence: What the entry point said of this occurrence, as (name, value) pairs: a
            request's ``method``, ``path`` and ``request_id``, a task's name and id.
    """

    # Every text is redactor output (``Redacted``): the report is what every sink is built
    # from (the record, the ledger, Sentry, OpenTelemetry, the transcript, follow-ups).
    recovery_id: Redacted
    handler: Redacted
    fingerprint: Redacted
    exc_type: Redacted
    exception: Redacted
    traceback: Redacted
    outcome: Outcome
    reason: Redacted
    via: Redacted
    model: Redacted
    diagnosis: Redacted = EMPTY
    tool_calls: tuple[ToolCallRecord, ...] = ()
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    started_at: float = 0.0
    duration_ms: float = 0.0
    waited_ms: float = 0.0
    mode: Redacted = REPAIR
    source_changes: tuple[SourceChange, ...] = ()
    fleet_role: Redacted = EMPTY
    fencing_token: int = 0
    fix_record: Redacted = EMPTY
    occurrence: tuple[tuple[Redacted, Redacted], ...] = ()

    @property
    def recovered(self) -> bool:
        return self.outcome == "recovered"
