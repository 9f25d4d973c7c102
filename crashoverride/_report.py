"""The public record of one recovery (text only: never frames, tracebacks or locals), and what
``approve=`` is shown of each tool call before it runs."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ._text import clip

Outcome = Literal["recovered", "repaired", "failed", "skipped"]


class ApprovalRequest(str):
    """One tool call, as ``approve=`` receives it.

    As a ``str`` it is the Python source to judge: a snippet's code for the tools that run code
    (``eval_python``, ``exec_python``, ``inspect_python``), ``name(arg=value, ...)`` for every
    other tool. An approver written for snippets (``lambda code: ...``) therefore sees every
    call, application and MCP tools included.

    Attributes:
        tool: The tool's name.
        arguments: Its arguments as the model sent them (read-only).
        source: ``"builtin"``, ``"application"`` (``tools=``, handler tools) or ``"mcp"``.
        is_code: Whether the call runs its argument as Python code in the process.
    """

    tool: str
    arguments: Mapping[str, Any]
    source: str
    is_code: bool

    def __new__(
        cls,
        text: str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        source: str = "builtin",
        is_code: bool = False,
    ) -> ApprovalRequest:
        made = super().__new__(cls, text)
        made.tool, made.source, made.is_code = tool, source, is_code
        made.arguments = MappingProxyType(dict(arguments))
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles keep the attributes (``str`` would rebuild from the text alone).
        rebuild = functools.partial(
            ApprovalRequest, tool=self.tool, arguments=dict(self.arguments), source=self.source,
            is_code=self.is_code,
        )  # fmt: skip
        return rebuild, (str(self),)

    @classmethod
    def of(
        cls, tool: str, arguments: Mapping[str, Any], source: str = "builtin"
    ) -> ApprovalRequest:
        """A call of a tool that does not run code: its text is ``tool(name=value, ...)``."""
        if all(isinstance(key, str) and key.isidentifier() for key in arguments):
            shown = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
        else:
            shown = f"**{dict(arguments)!r}"
        return cls(f"{tool}({shown})", tool=tool, arguments=arguments, source=source)

    @classmethod
    def of_json(cls, tool: str, text: str, source: str) -> ApprovalRequest:
        """A call whose arguments arrived as JSON text (what the SDK hands a function tool)."""
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = None
        if not isinstance(data, dict):
            # Not an object: the tool will reject it; the approver still sees the raw text.
            return cls(f"{tool}(<arguments: {text!r}>)", tool=tool, arguments={}, source=source)
        return cls.of(tool, data, source)


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call the agent made, in order, denied ones included.

    Attributes:
        tool: The tool's name.
        code: What ``approve=`` judged: a snippet's code, or ``tool(arg=value, ...)``.
        result: The (redacted, truncated) output, or why it did not run.
        ok: Whether it ran and succeeded.
        approved_by: Who approved or denied it (``"not required ..."`` without ``approve=``).
        source: ``"builtin"``, ``"application"`` (``tools=``) or ``"mcp"``.
    """

    tool: str
    code: str
    result: str
    ok: bool
    duration_ms: float
    approved_by: str = ""
    source: str = "builtin"

    def event_fields(self) -> dict[str, object]:
        """The fields of its ``*.tool_called`` event: one shape for every audit line."""
        return {
            "tool": self.tool, "source": self.source, "code": clip(self.code, 1_000),
            "ok": self.ok, "approved_by": self.approved_by, "duration_ms": self.duration_ms,
        }  # fmt: skip


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
