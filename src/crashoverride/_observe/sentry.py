"""Sentry observer: a recovered exception becomes one handled warning event; a failed one keeps
the event Sentry sends anyway, with the report added to it.

Loaded by ``_observe.observers`` only when the application imported ``sentry_sdk``, and active only
with an initialised client. Never two events for one exception: a recovered exception is suppressed,
so nothing else reports it and this module sends it once; a failed one propagates and is reported by
whatever reports the application's errors (the ASGI and Celery integrations, the excepthook), so
this module only adds the report to that event, found by the recovery id in the note the exception
carries. Events go through ``capture_event``: ``before_send``, the event scrubber and the client's
options apply to them as to any other.

Written for sentry-sdk 2.x and 3.x: 3.0 reads the client's options itself in
``event_from_exception``, replaced ``include_local_variables`` with the ``data_collection``
option, and has no event scrubber (``_sends_locals``, ``_event_from``, ``_scrubbed``).

The event this module sends passes the recovery's redactor as a whole, once the scopes have
added their data and serialised as the SDK would send it: every exception's message in the
chain, every frame's local variables (the SDK's scrubber knows only names), the scope's extras,
contexts and breadcrumbs, bytes and objects by their repr. The report it adds is redacted
already.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

import sentry_sdk
from sentry_sdk.scope import add_global_event_processor, use_isolation_scope, use_scope
from sentry_sdk.serializer import serialize
from sentry_sdk.utils import event_from_exception

from crashoverride._observe.record import to_record
from crashoverride._observe.transcript import render
from crashoverride._security.redact import Redacted, RedactedData

if TYPE_CHECKING:
    from sentry_sdk._types import Event

    from crashoverride._observe.report import RecoveryReport
    from crashoverride._security.audit import ToolCallRecord

CONTEXT: Final = "crashoverride"
MECHANISM: Final = "crashoverride"
# The reports of failed recoveries whose exceptions are still on their way to Sentry; bounded,
# since an exception may never reach it (caught and dropped by the application).
_KEPT: Final = 256
# The note ``_core.recovery`` adds to an exception a recovery did not recover.
_NOTE: Final = re.compile(r"crashoverride: recovery (rec_[0-9a-f]+) ")
_pending: OrderedDict[str, RedactedData] = OrderedDict()
_lock = threading.Lock()
_installed = False


def _scrubbed(record: RedactedData) -> dict[str, Any]:
    """The client's event scrubber applied to (a copy of) the report: it scrubs no context by
    itself. (sentry-sdk 3 has none: the report is redacted by the recovery's redactor.)"""
    copy = dict(record)
    scrubber = sentry_sdk.get_client().options.get("event_scrubber")
    if scrubber is not None:
        scrubber.scrub_dict(copy)
    return copy


def _sends_locals(options: Mapping[str, Any]) -> bool:
    """Whether the client sends the frames' local variables (as the SDK itself decides)."""
    collection = options.get("data_collection")
    # sentry-sdk 3 has only ``data_collection``; in 2.x it wins when the application set it.
    governs = "include_local_variables" not in options or (
        isinstance(collection, Mapping) and bool(collection.get("provided_by_user"))
    )
    if isinstance(collection, Mapping) and governs:
        frames = collection.get("stack_frame_variables", True)
        if isinstance(frames, Mapping):  # a key/value behaviour: some locals are sent
            return bool(frames.get("mode", "denylist") != "off")
        return bool(frames)
    return bool(options.get("include_local_variables", True))


def _event_from(exc: BaseException, options: Mapping[str, Any], mechanism: dict[str, Any]) -> Any:
    # sentry-sdk 2 takes the client's options as an argument; 3 reads the current client's.
    build: Any = event_from_exception  # typed for the installed major version only
    if _TAKES_OPTIONS:
        return build(exc, client_options=options, mechanism=mechanism)
    return build(exc, mechanism=mechanism)


_TAKES_OPTIONS: Final = "client_options" in inspect.signature(event_from_exception).parameters


def _chain(exc: BaseException | None) -> list[BaseException]:
    found: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in found):  # by identity
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def _add_report(event: Event, hint: dict[str, Any]) -> Event:
    """Global event processor: the report of the recovery a reported exception went through."""
    exc_info = hint.get("exc_info") if hint else None
    exc = exc_info[1] if isinstance(exc_info, tuple) and len(exc_info) > 1 else None
    for item in _chain(exc):
        for note in getattr(item, "__notes__", None) or ():
            match = _NOTE.match(note) if isinstance(note, str) else None
            if match is None:
                continue
            with _lock:
                record = _pending.get(match[1])
            if record is not None:
                event.setdefault("contexts", {})[CONTEXT] = _scrubbed(record)
                return event
    return event


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    add_global_event_processor(_add_report)


Redact = Callable[[Mapping[str, Any]], RedactedData]


class SentryWatch:
    """One recovery, seen from the scopes it started in (the request's or task's).

    ``redact``: the recovery's redactor for documents (``Redactor.data``); every event this
    watch sends is what it returns.
    """

    def __init__(self, redact: Redact) -> None:
        self.scope = sentry_sdk.get_current_scope()
        self.isolation = sentry_sdk.get_isolation_scope()
        self.redact = redact

    def tool(self, record: ToolCallRecord) -> None:
        pass

    def finish(self, report: RecoveryReport | None, exc: BaseException | None) -> None:
        if report is None or exc is None:
            return
        record = to_record(report)
        if not report.recovered:
            with _lock:
                _pending[report.recovery_id] = record
                while len(_pending) > _KEPT:
                    _pending.popitem(last=False)
            return
        client = sentry_sdk.get_client()
        if not client.is_active():
            return
        mechanism = {"type": MECHANISM, "handled": True}
        event, hint = _event_from(exc, client.options, mechanism)
        event["level"] = "warning"
        with (
            use_isolation_scope(self.isolation),
            use_scope(self.scope),
            sentry_sdk.new_scope() as scope,
        ):
            scope.set_context(CONTEXT, _scrubbed(record))
            # The last processor to run (the current scope's come last), so it sees what every
            # scope and integration added; before_send then sees the redacted event.
            scope.add_event_processor(self._redacted)
            scope.set_tag("crashoverride.outcome", report.outcome)
            scope.set_tag("crashoverride.recovery_id", report.recovery_id)
            # The transcript quotes live values (what the agent read): sent only where the
            # client sends local variables at all.
            if _sends_locals(client.options):
                scope.add_attachment(
                    bytes=render(report).encode(),
                    filename=f"{report.recovery_id}.txt",
                    content_type="text/plain",
                )
            sentry_sdk.capture_event(event, hint=hint)

    def _redacted(self, event: Event, hint: dict[str, Any]) -> Event:
        # The SDK serialises the event after every processor: bytes, objects (by their repr,
        # the client's ``custom_repr`` first) and trimmed values. Serialised here, by the
        # SDK's own serialiser under the client's options, what is redacted is what is sent.
        options = sentry_sdk.get_client().options
        document = serialize(
            cast("dict[str, Any]", event),
            max_request_body_size=options.get("max_request_body_size"),
            max_value_length=options.get("max_value_length"),
            custom_repr=options.get("custom_repr"),
        )
        return cast("Event", self.redact(document))


def start(rec: Any) -> SentryWatch | None:
    if not sentry_sdk.get_client().is_active():
        return None
    _install()
    return SentryWatch(rec.redact.data)


def skipped(handler: Redacted, reason: Redacted) -> None:
    pass  # the exception propagates: Sentry reports it with the note that says why
