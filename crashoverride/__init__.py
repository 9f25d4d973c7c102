"""crashoverride: an async-native, agentic exception handler.

When a protected block raises, an LLM agent gets the exception, the traceback and tools wired
into the live process; it repairs state or implements missing behaviour, and execution
continues after the block, or the original exception is re-raised untouched.

Importing this package is cheap: the Agents SDK, openai, structlog and asyncio are loaded only
when a recovery starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._app import CrashOverride
from ._errors import ConfigurationError
from ._handler import Handler
from ._redact import Redaction

if TYPE_CHECKING:
    from ._eval import evaluate
    from ._ledger import JsonLinesLedger, RedisStreamLedger
    from ._redis_coordination import RedisCoordination
    from ._report import ApprovalRequest, RecoveryReport, SourceChange, ToolCallRecord, Usage

__version__ = "0.3.0.dev0"

__all__ = [
    "ApprovalRequest",
    "ConfigurationError",
    "CrashOverride",
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

_LAZY = {"ApprovalRequest", "RecoveryReport", "SourceChange", "ToolCallRecord", "Usage"}


def __getattr__(name: str) -> Any:
    if name == "evaluate":  # ``crashoverride eval`` from Python (README, "Choosing a model")
        from ._eval import evaluate

        return evaluate
    if name == "RedisCoordination":  # a description only: it never imports redis
        from ._redis_coordination import RedisCoordination

        return RedisCoordination
    if name in ("JsonLinesLedger", "RedisStreamLedger"):  # on_recovery sinks
        from . import _ledger

        return getattr(_ledger, name)
    # The report types pull in dataclasses; keep them off the import path until asked for.
    if name in _LAZY:
        from . import _report

        return getattr(_report, name)
    raise AttributeError(f"module 'crashoverride' has no attribute {name!r}")
