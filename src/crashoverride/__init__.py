"""crashoverride: an async-native, agentic exception handler.

When a protected block raises, an LLM agent gets the exception, the traceback and tools wired
into the live process; it repairs state or implements missing behaviour, and execution
continues after the block, or the original exception is re-raised untouched.

Importing this package is cheap: the Agents SDK, openai, structlog and asyncio are loaded only
when a recovery starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crashoverride._app import CrashOverride
from crashoverride._errors import ConfigurationError, EffectUncertain
from crashoverride._handler import Handler
from crashoverride._security.redact import Redaction
from crashoverride._version import __version__

if TYPE_CHECKING:
    from crashoverride._config.coordination import RedisCoordination
    from crashoverride._effects.effect import NOT_DONE
    from crashoverride._eval import evaluate
    from crashoverride._observe.ledger import JsonLinesLedger, RedisStreamLedger
    from crashoverride._observe.report import RecoveryReport, SourceChange, Usage
    from crashoverride._security.audit import ApprovalRequest, Approver, ToolCallRecord


__all__ = [
    "NOT_DONE",
    "ApprovalRequest",
    "Approver",
    "ConfigurationError",
    "CrashOverride",
    "EffectUncertain",
    "Handler",
    "JsonLinesLedger",
    "RecoveryReport",
    "Redaction",
    "RedisCoordination",
    "RedisStreamLedger",
    "SourceChange",
    "ToolCallRecord",
    "Usage",
    "__version__",
    "evaluate",
]

_LAZY = {"RecoveryReport", "SourceChange", "Usage"}


def __getattr__(name: str) -> Any:
    if name == "evaluate":  # ``crashoverride eval`` from Python (the docs, "Choosing a model")
        from crashoverride._eval import evaluate

        return evaluate
    if name == "NOT_DONE":  # what a declared effect's probe returns when it did not happen
        from crashoverride._effects.effect import NOT_DONE

        return NOT_DONE
    if name == "RedisCoordination":  # a description only: it never imports redis
        from crashoverride._config.coordination import RedisCoordination

        return RedisCoordination
    if name in ("JsonLinesLedger", "RedisStreamLedger"):  # on_recovery sinks
        from crashoverride._observe import ledger

        return getattr(ledger, name)
    # The report types pull in dataclasses; keep them off the import path until asked for.
    if name in ("ApprovalRequest", "Approver", "ToolCallRecord"):
        from crashoverride._security import audit

        return getattr(audit, name)
    if name in _LAZY:
        from crashoverride._observe import report

        return getattr(report, name)
    raise AttributeError(f"module 'crashoverride' has no attribute {name!r}")
