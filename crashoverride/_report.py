"""The public record of one recovery. Holds text only: never frames, tracebacks or locals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["recovered", "repaired", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call the agent made, in order."""

    tool: str
    code: str
    result: str
    ok: bool
    duration_ms: float
    approved_by: str = ""


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
            fixed the code) or ``"none"``.
        diagnosis: The agent's final message, or its give-up reason.
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

    @property
    def recovered(self) -> bool:
        return self.outcome == "recovered"
