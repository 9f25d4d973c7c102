"""The public record of one recovery (text only: never frames, tracebacks or locals), and what
``approve=`` is shown of each tool call before it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from crashoverride._security.audit import ToolCallRecord

Outcome = Literal["recovered", "repaired", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class SourceChange:
    """A source file a recovery changed (``written``) or proposed a patch for (``proposed``).

    ``file`` is the backup of the previous source, or the ``.patch`` file for review.
    """

    path: str
    kind: Literal["written", "proposed"]
    diff: str
    file: str


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
    """

    recovery_id: str
    handler: str
    fingerprint: str
    exc_type: str
    exception: str
    traceback: str
    outcome: Outcome
    reason: str
    via: str
    model: str
    diagnosis: str = ""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    started_at: float = 0.0
    duration_ms: float = 0.0
    waited_ms: float = 0.0
    mode: str = "repair"
    source_changes: tuple[SourceChange, ...] = ()
    fleet_role: str = ""
    fencing_token: int = 0
    fix_record: str = ""

    @property
    def recovered(self) -> bool:
        return self.outcome == "recovered"
