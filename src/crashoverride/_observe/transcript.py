"""A recovery told end to end, as plain text: the Sentry attachment and ``crashoverride show``.

Built only from a ``RecoveryReport`` (already redacted text), so it can be rendered anywhere,
later, from a ledger record.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Final

from crashoverride._observe.report import RecoveryReport
from crashoverride._security.audit import ToolCallRecord

RULE: Final = "-" * 72


def when(report: RecoveryReport) -> str:
    if not report.started_at:
        return "unknown"
    moment = datetime.datetime.fromtimestamp(report.started_at, datetime.UTC)
    return moment.isoformat(timespec="seconds")


def facts(report: RecoveryReport) -> list[tuple[str, str]]:
    """The summary lines: (label, value), in reading order."""
    usage = report.usage
    rows = [
        ("Outcome", f"{report.outcome} (via {report.via})"),
        ("Reason", report.reason),
        ("Handler", report.handler),
        *_occurrence(report),
        ("Exception", report.exc_type),
        ("Fingerprint", report.fingerprint),
        ("Started", when(report)),
        ("Duration", f"{report.duration_ms:.0f} ms (waited {report.waited_ms:.0f} ms)"),
        ("Model", f"{report.model}, {report.turns} turns, {usage.requests} requests"),
        ("Tokens", f"{usage.input_tokens} in, {usage.output_tokens} out"),
        ("Mode", report.mode),
    ]
    if report.fleet_role:
        rows.append(("Fleet role", f"{report.fleet_role} (token {report.fencing_token})"))
    if report.fix_record:
        rows.append(("Fix record", report.fix_record))
    return rows


def _occurrence(report: RecoveryReport) -> list[tuple[str, str]]:
    """A request as one line (method, path, request id); any other field of the entry point
    (a task's name and id) as one line of ``name=value``."""
    said: dict[str, str] = {str(k): str(v) for k, v in report.occurrence}
    rows = []
    method, path = said.pop("method", ""), said.pop("path", "")
    request_id = said.pop("request_id", "")
    if method or path:
        tail = f" (request id {request_id})" if request_id else ""
        rows.append(("Request", f"{method} {path}".strip() + tail))
    elif request_id:
        said["request_id"] = request_id
    if said:
        rows.append(("Occurrence", ", ".join(f"{k}={v}" for k, v in said.items())))
    return rows


def call_heading(number: int, call: ToolCallRecord) -> str:
    status = "ok" if call.ok else "FAILED"
    return (
        f"[{number}] {call.tool} ({call.source}) {status}, {call.duration_ms:.1f} ms"
        f" - {call.approved_by}"
    )


def _indented(text: str, prefix: str = "    ") -> Iterator[str]:
    for line in (text or "(empty)").splitlines() or [""]:
        yield prefix + line


def render(report: RecoveryReport) -> str:
    """The whole recovery as text, for a terminal or an attachment."""
    lines = [f"Recovery {report.recovery_id}", RULE]
    width = max(len(label) for label, _ in facts(report))
    lines += [f"{label:<{width}}  {value}" for label, value in facts(report)]
    lines += ["", "Exception", *_indented(report.exception), "", "Traceback"]
    lines += _indented(report.traceback)
    lines += ["", f"Tool calls ({len(report.tool_calls)})"]
    for number, call in enumerate(report.tool_calls, 1):
        lines += ["", "  " + call_heading(number, call), "  code:", *_indented(call.code)]
        lines += ["  result:", *_indented(call.result)]
    if report.source_changes:
        lines += ["", "Source changes"]
        for change in report.source_changes:
            lines += [f"  {change.path} ({change.kind}; {change.file})", *_indented(change.diff)]
    lines += ["", "Diagnosis", *_indented(report.diagnosis), ""]
    return "\n".join(lines)
