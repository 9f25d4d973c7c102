"""What a follow-up is: the job (objective + the recovery's report), its result, its text.

A follow-up is an agent run of its own, with a larger budget, that receives the text of the
``RecoveryReport`` and never blocks the application. Jobs serialise to JSON for runners that hand
them to another process (a Celery queue, a detached subprocess).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from crashoverride._observe.report import RecoveryReport, SourceChange, Usage
from crashoverride._security.audit import Approver, ToolCallRecord
from crashoverride._security.redact import Redacted, RedactedData, clip, scanned, scanned_data

# An agent that asks for dozens of follow-ups is looping; the first few carry the signal.
MAX_PER_RECOVERY = 5
OBJECTIVE_LIMIT = 2_000
CONTEXT_LIMIT = 8_000


@dataclass(frozen=True, slots=True)
class FollowupJob:
    """One follow-up: an objective plus the report of the recovery that asked for it.

    Attributes:
        id: Unique id (``fu_...``), in every event of the job.
        objective: What the follow-up agent must achieve.
        origin: ``"handler"`` (declared with ``followups=``) or ``"agent"`` (``spawn_followup``).
        context: Notes from the recovery agent (what it found), may be empty.
        report: The recovery's report (text only).
        timeout: Wall-clock budget of the follow-up agent, in seconds.
        max_turns: Model turns the follow-up agent may take.
        approver: The name of the recovery's ``approve=`` (``""`` without one).
        approver_ref: ``"module:qualname"`` that imports that approver in another process
            (``""``: none does, e.g. a lambda or a closure; then the job runs only where
            ``approve`` is at hand).
        tracing: Whether the recovery allowed SDK tracing.
        approve: The approver itself; it never leaves the process (not in the payload).

    What the job runs under is made from these by ``run_settings``, for every runner.
    """

    # Redacted text only: a job may travel through a broker or a subprocess's arguments.
    id: Redacted
    objective: Redacted
    origin: Redacted
    context: Redacted
    report: RecoveryReport
    timeout: float
    max_turns: int
    approver: str = ""
    approver_ref: str = ""
    tracing: bool = False
    approve: Approver | None = field(default=None, compare=False, repr=False)

    def to_payload(self) -> RedactedData:
        """A JSON-safe dict, for runners that hand the job to another process: scanned again
        on the way out, like the record of a report."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "approve"}
        data["report"] = dataclasses.asdict(self.report)
        data["report"]["tool_calls"] = [dict(call) for call in data["report"]["tool_calls"]]
        data["report"]["source_changes"] = [dict(c) for c in data["report"]["source_changes"]]
        return scanned_data(data)

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> FollowupJob:
        raw = dict(data["report"])
        raw["tool_calls"] = tuple(ToolCallRecord(**call) for call in raw.get("tool_calls", ()))
        raw["usage"] = Usage(**raw.get("usage", {}))
        raw["source_changes"] = tuple(
            SourceChange(**change) for change in raw.get("source_changes", ())
        )
        raw["occurrence"] = tuple(
            (scanned(str(name)), scanned(str(value))) for name, value in raw.get("occurrence", ())
        )
        return cls(
            # Redacted by its sender; what arrives is scanned again, as any text with no
            # recovery at hand.
            id=scanned(str(data["id"])),
            objective=scanned(str(data["objective"])),
            origin=scanned(str(data.get("origin", "handler"))),
            context=scanned(str(data.get("context", ""))),
            report=RecoveryReport(**raw),
            timeout=float(data["timeout"]),
            max_turns=int(data["max_turns"]),
            approver=str(data.get("approver", "")),
            approver_ref=str(data.get("approver_ref", "")),
            tracing=data.get("tracing") is True,
        )


@dataclass(frozen=True, slots=True)
class FollowupResult:
    """How a follow-up ended. ``summary`` is the agent's last line or the failure reason.

    ``tool_calls``: the follow-up agent's calls, as in ``RecoveryReport.tool_calls`` (each
    also a ``followup.tool_called`` event).
    """

    id: Redacted
    outcome: Literal["succeeded", "failed"]
    summary: Redacted
    duration_ms: float
    tool_calls: tuple[ToolCallRecord, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"


def new_id() -> str:
    return "fu_" + os.urandom(6).hex()


def render_report(report: RecoveryReport, *, limit: int = 20_000) -> str:
    """The report as the text a follow-up agent reads: traceback, executed code, diagnosis."""
    lines = [
        f"Recovery {report.recovery_id} of handler {report.handler!r}: {report.outcome}"
        f" ({report.reason}).",
        f"Exception: {report.exception}",
        f"Fingerprint: {report.fingerprint}",
        "",
        "Traceback:",
        report.traceback.rstrip(),
        "",
        f"What the recovery agent executed ({len(report.tool_calls)} tool calls):",
    ]
    for number, call in enumerate(report.tool_calls, 1):
        state = "ok" if call.ok else "error"
        lines.append(f"--- {number}. {call.tool} [{state}]")
        lines.append(clip(call.code, 1_500))
        lines.append(f">>> {clip(call.result, 1_000)}")
    lines += ["", f"Diagnosis: {report.diagnosis or '(none given)'}"]
    return clip("\n".join(lines), limit)
