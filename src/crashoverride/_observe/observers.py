"""Observers: the telemetry systems a recovery reports to (OpenTelemetry, Sentry).

A recovery calls three hooks: ``start`` where it begins (in the owner's context, so a span
parents under the request's or task's span), ``tool`` for each tool call and ``finish`` once,
with its report. An observer is loaded only when the application has already imported the
library it reports to: importing crashoverride never imports them, and a process that never
set them up pays one ``sys.modules`` lookup per recovery. Telemetry never disturbs a recovery:
an observer that raises is dropped for that recovery, with one event.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Protocol

from crashoverride._observe import events
from crashoverride._security.redact import Redacted, scanned

if TYPE_CHECKING:
    from crashoverride._observe.report import RecoveryReport
    from crashoverride._security.audit import ToolCallRecord


class Watch(Protocol):
    """One observer's view of one recovery."""

    def tool(self, record: ToolCallRecord) -> None: ...

    def finish(self, report: RecoveryReport | None, exc: BaseException | None) -> None:
        """The recovery ended (``report`` None: it ended without a decision)."""


def otel_configured() -> bool:
    """Whether the application set an OpenTelemetry tracer or meter provider.

    The Agents SDK's dependencies import the API in every process, so being imported says
    nothing; until the application sets a provider both are proxies, which make no-op spans.
    """
    trace, metrics = (
        sys.modules.get("opentelemetry.trace"),
        sys.modules.get("opentelemetry.metrics"),
    )
    providers = [
        getter()
        for module, name in ((trace, "get_tracer_provider"), (metrics, "get_meter_provider"))
        if module is not None and (getter := getattr(module, name, None)) is not None
    ]
    return any(not type(p).__name__.lstrip("_").startswith("Proxy") for p in providers)


def _loaded() -> list[Any]:
    """Our observer modules for the telemetry systems the application set up (imported then)."""
    modules: list[Any] = []
    if otel_configured():
        from crashoverride._observe import otel

        modules.append(otel)
    if "sentry_sdk" in sys.modules:  # the application imports it when it calls sentry_sdk.init
        from crashoverride._observe import sentry

        modules.append(sentry)
    return modules


class Watches:
    """The watches of one recovery; each hook reaches every one of them, whatever fails."""

    __slots__ = ("_fields", "_watches")

    def __init__(self, watches: list[Watch], fields: dict[str, Any]) -> None:
        self._watches = watches
        self._fields = fields

    def tool(self, record: ToolCallRecord) -> None:
        for watch in list(self._watches):
            self._guarded(watch, watch.tool, record)

    def finish(self, report: RecoveryReport | None, exc: BaseException | None) -> None:
        watches, self._watches = self._watches, []  # once: a later call finds none
        for watch in watches:
            self._guarded(watch, watch.finish, report, exc)

    def _guarded(self, watch: Watch, hook: Any, *args: Any) -> None:
        try:
            hook(*args)
        except Exception as problem:
            _dropped(self._fields, problem)
            if watch in self._watches:
                self._watches.remove(watch)


def _dropped(fields: dict[str, Any], problem: Exception) -> None:
    events.emit("error", events.OBSERVER_FAILED, error=scanned(repr(problem)), **fields)


def start(rec: Any) -> Watches:
    """The watches of recovery ``rec``, started in the owner's context."""
    watches: list[Watch] = []
    fields = rec.fields()
    try:
        modules = _loaded()
    except Exception as problem:  # an observer module that does not import: no telemetry
        _dropped(fields, problem)
        return Watches(watches, fields)
    for module in modules:
        try:
            watch = module.start(rec)
        except Exception as problem:
            _dropped(fields, problem)
            continue
        if watch is not None:
            watches.append(watch)
    return Watches(watches, fields)


def skipped(handler: Redacted, reason: Redacted) -> None:
    """A failure an entry point let pass without a recovery (see ``integration.skip``)."""
    try:
        for module in _loaded():
            module.skipped(handler, reason)
    except Exception as problem:
        _dropped({"handler": handler}, problem)
