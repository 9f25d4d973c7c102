"""OpenTelemetry observer: a span per recovery, a child span per tool call, and metrics.

Uses only ``opentelemetry-api`` (the ``[otel]`` extra) and the global providers the
application configured; with none configured every call here is the API's no-op. Loaded by
``_observe.observers`` only when the application has imported OpenTelemetry.

The recovery span starts where the recovery starts, in the owner's context (the request's or
task's span is its parent); the pipeline may finish on another thread, so the parent context
is captured then and every later span names its parent explicitly. Every text exported passes
the recovery's redactor.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from crashoverride._security.redact import Redacted, clip, fixed

# What OpenTelemetry is handed (span and event attributes, metric labels, statuses): redactor
# output, numbers and flags only; a plain ``str`` is a type error.
Attribute = Redacted | bool | int | float
Attributes = dict[str, Attribute]

if TYPE_CHECKING:
    from crashoverride._observe.report import RecoveryReport
    from crashoverride._security.audit import ToolCallRecord

SCOPE: Final = "crashoverride"
SPAN_NAME: Final = "crashoverride.recovery"
TOOL_SPAN_NAME: Final = "crashoverride.tool_call"
CODE_LIMIT: Final = 1_000  # characters of a snippet on its span
TEXT_LIMIT: Final = 4_000

# Why a recovery was skipped, as a metric attribute: a few stable words, not the reason's
# text (which carries durations and ids). Matched on the phrases the reasons are written in.
_SKIP_KINDS: Final = (
    ("circuit breaker", "breaker"),
    ("too many recoveries", "overload"),
    ("budget", "budget"),
    ("raised by agent code", "inside_recovery"),
    ("concurrent recovery", "leader_failed"),
    ("response had already started", "response_started"),
    ("disconnected", "client_gone"),
)


def skip_kind(reason: str) -> Redacted:
    for phrase, kind in _SKIP_KINDS:
        if phrase in reason:
            return fixed(kind)
    return fixed("other")


def _version() -> str:
    from crashoverride._version import __version__

    return __version__


class _Instruments:
    """The metric instruments, made once from the global meter (a proxy until the SDK's)."""

    def __init__(self) -> None:
        meter = metrics.get_meter(SCOPE, _version())
        self.recoveries = meter.create_counter(
            "crashoverride.recoveries", unit="{recovery}",
            description="Recoveries by outcome (recovered, repaired, failed, skipped)",
        )  # fmt: skip
        self.duration = meter.create_histogram(
            "crashoverride.recovery.duration", unit="s",
            description="Wall-clock time of a recovery, waits included",
        )  # fmt: skip
        self.tokens = meter.create_counter(
            "crashoverride.tokens", unit="{token}", description="Model tokens used by recoveries"
        )
        self.skipped = meter.create_counter(
            "crashoverride.recoveries.skipped", unit="{recovery}",
            description="Failures let pass without an agent run, by reason",
        )  # fmt: skip


_instruments: tuple[Any, _Instruments] | None = None
_making = threading.Lock()  # recoveries end on many threads: the instruments are made once


def instruments() -> _Instruments:
    """The instruments of the current meter provider (made again if it was replaced)."""
    global _instruments
    provider = metrics.get_meter_provider()
    with _making:
        if _instruments is None or _instruments[0] is not provider:
            _instruments = (provider, _Instruments())
        return _instruments[1]


def _innermost(exc: BaseException | None) -> tuple[str, str, int] | None:
    tb = exc.__traceback__ if exc is not None else None
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return code.co_qualname, code.co_filename, tb.tb_lineno


class OtelWatch:
    """The spans of one recovery."""

    def __init__(self, rec: Any) -> None:
        # Every text exported passes the recovery's redactor, names from the settings too.
        self.redact = redact = rec.redact
        self.handler: Redacted = redact(rec.handler)
        self.model: Redacted = redact(rec.settings.model_label)
        self.exc_type: Redacted = redact(rec.exc_type)
        self.message: Redacted = redact(
            clip(rec.exception_text.removeprefix(self.exc_type + ": "), TEXT_LIMIT)
        )
        self.traceback: Redacted = rec.traceback_text  # redacted by the recovery
        self.tracer = trace.get_tracer(SCOPE, _version())
        attributes: Attributes = {
            "exception.type": self.exc_type,
            "exception.message": self.message,
            "crashoverride.recovery_id": redact(rec.id),
            "crashoverride.fingerprint": redact(rec.fingerprint),
            "crashoverride.handler": self.handler,
            "crashoverride.model": self.model,
            "crashoverride.mode": redact(rec.settings.mode),
        }
        where = _innermost(rec.exc)
        if where is not None:
            function, path, line = where
            attributes["code.function"] = self.redact(function)
            attributes["code.filepath"] = self.redact(path)
            attributes["code.lineno"] = line
        # The owner's context, now: the span's parent wherever the recovery goes on.
        self.span: Span = self.tracer.start_span(
            SPAN_NAME, context=otel_context.get_current(), kind=SpanKind.INTERNAL,
            attributes=attributes,
        )  # fmt: skip
        self.inside = trace.set_span_in_context(self.span)

    def tool(self, record: ToolCallRecord) -> None:
        # The record is made when the call ends: the span is placed at its measured interval.
        end = time.time_ns()
        start = end - int(record.duration_ms * 1_000_000)
        child = self.tracer.start_span(
            TOOL_SPAN_NAME, context=self.inside, start_time=start,
            attributes=_attributes({
                "crashoverride.tool.name": record.tool,
                "crashoverride.tool.source": record.source,
                "crashoverride.tool.code": clip(self.redact(record.code), CODE_LIMIT),
                "crashoverride.tool.ok": record.ok,
                "crashoverride.tool.duration_ms": record.duration_ms,
                "crashoverride.tool.approved_by": record.approved_by,
            }),
        )  # fmt: skip
        if not record.ok:
            child.set_status(_error(clip(record.result, 200)))
        child.end(end_time=end)

    def finish(self, report: RecoveryReport | None, exc: BaseException | None) -> None:
        span = self.span
        if report is None:
            span.set_attributes(_attributes({"crashoverride.outcome": fixed("abandoned")}))
            span.set_status(_error(fixed("the recovery ended without a decision")))
            span.end()
            return
        usage = report.usage
        attributes: Attributes = {
            "crashoverride.outcome": fixed(report.outcome),
            "crashoverride.via": report.via,
            "crashoverride.reason": clip(report.reason, TEXT_LIMIT),
            "crashoverride.turns": report.turns,
            "crashoverride.tool_calls": len(report.tool_calls),
            "crashoverride.tokens.input": usage.input_tokens,
            "crashoverride.tokens.output": usage.output_tokens,
            "crashoverride.duration_ms": report.duration_ms,
        }
        if report.fleet_role:
            attributes["crashoverride.fleet_role"] = report.fleet_role
        span.set_attributes(_attributes(attributes))
        # The exception happened whatever the outcome; the semantic conventions' event.
        span.add_event("exception", _attributes({
            "exception.type": self.exc_type, "exception.message": self.message,
            "exception.stacktrace": self.traceback,
            "exception.escaped": not report.recovered,
        }))  # fmt: skip
        if not report.recovered:
            span.set_status(_error(clip(report.reason, 200)))
        span.end()
        _count(report, self.handler, self.model)


def _count(report: RecoveryReport, handler: Redacted, model: Redacted) -> None:
    made = instruments()
    labels = _attributes({"outcome": fixed(report.outcome), "handler": handler})
    made.recoveries.add(1, labels)
    made.duration.record(report.duration_ms / 1000, labels)
    usage = report.usage
    for kind, count in ((INPUT, usage.input_tokens), (OUTPUT, usage.output_tokens)):
        if count:
            made.tokens.add(
                count, _attributes({"handler": handler, "model": model, "token.type": kind})
            )
    if report.outcome == "skipped":
        made.skipped.add(1, _attributes({"reason": skip_kind(report.reason), "handler": handler}))


def start(rec: Any) -> OtelWatch | None:
    # ``observers`` calls this only once a provider is set (``observers.otel_configured``).
    return OtelWatch(rec)


def skipped(handler: Redacted, reason: Redacted) -> None:
    made = instruments()
    made.recoveries.add(1, _attributes({"outcome": fixed("skipped"), "handler": handler}))
    made.skipped.add(1, _attributes({"reason": skip_kind(reason), "handler": handler}))


def _attributes(values: Attributes) -> Attributes:
    """What every attribute mapping handed to OpenTelemetry passes: typed redacted."""
    return values


def _error(description: Redacted) -> Status:
    """An error status; its description is exported like any attribute."""
    return Status(StatusCode.ERROR, description)


INPUT, OUTPUT = fixed("input"), fixed("output")
