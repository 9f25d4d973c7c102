"""The audit trail's two records: what a tool call asked for, and what became of it.

``ApprovalRequest`` is what ``approve=`` sees before a call runs (its tool, arguments and, for
code, the code); ``ToolCallRecord`` is the line each call leaves in ``report.tool_calls``,
denied calls included. Both are written by the gate (``_security.gate``), the one place calls
pass.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias

from crashoverride._security.redact import EMPTY, Redacted, clip, fixed


class ApprovalRequest(str):
    """One tool call, as ``approve=`` receives it.

    As a ``str`` it is the Python source to judge: a snippet's code for the tools that run code
    (``eval_python``, ``exec_python``, ``inspect_python``), ``name(arg=value, ...)`` for every
    other tool. An approver written for snippets (``lambda code: ...``) therefore sees every
    call, application and MCP tools included.

    Attributes:
        tool: The tool's name.
        arguments: Its arguments as the model sent them (read-only).
        source: ``"builtin"``, ``"application"`` (``tools=``, handler tools), ``"mcp"``,
            ``"handoff"`` (a tool of an agent the run hands off to), ``"recipe"`` (a snippet
            of a recipe, replayed) or ``"fleet"`` (a fix record, applied here).
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


BUILTIN = fixed("builtin")
# What an approver answers: only a true one approves (the docs, "What a check's result means").
Approval: TypeAlias = bool | str | None
Approver: TypeAlias = Callable[[ApprovalRequest], Approval | Awaitable[Approval]]
"""``approve=``: a sync or async callable given each ``ApprovalRequest``; True approves, a
string (the reason), False or None denies. One written for snippets, ``(code: str) -> bool``,
is one too."""


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call the agent made, in order, denied ones included.

    Attributes:
        tool: The tool's name.
        code: What ``approve=`` judged: a snippet's code, or ``tool(arg=value, ...)``.
        result: The (redacted, truncated) output, or why it did not run.
        ok: Whether it ran and succeeded.
        approved_by: Who approved or denied it (``"not required ..."`` without ``approve=``).
        source: Where the call came from, as ``ApprovalRequest.source``.
    """

    # Every text redacted (it reaches the report, events, Sentry, OpenTelemetry).
    tool: Redacted
    code: Redacted
    result: Redacted
    ok: bool
    duration_ms: float
    approved_by: Redacted = EMPTY
    source: Redacted = BUILTIN

    def event_fields(self) -> dict[str, Redacted | bool | float]:
        """The fields of its ``*.tool_called`` event: one shape for every audit line."""
        return {
            "tool": self.tool, "source": self.source, "code": clip(self.code, 1_000),
            "ok": self.ok, "approved_by": self.approved_by, "duration_ms": self.duration_ms,
        }  # fmt: skip
