"""Sentry: a recovered exception is one handled warning event with the report and transcript; a
failed one is Sentry's own event plus the note and the report; never two events for one
exception; the client's scrubbing and options apply. sentry-sdk with an in-memory transport."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from crashoverride import CrashOverride
from crashoverride.testing import Script, done, exec_python, give_up, script

SECRET = "hunter2-Zq8vW3xK9pL2mN7b"
SENTRY_MAJOR = int(importlib.metadata.version("sentry-sdk").split(".")[0])


class Sent:
    """What the in-memory transport received."""

    def __init__(self) -> None:
        self.envelopes: list[Any] = []
        self.before_send: list[dict[str, Any]] = []

    def events(self) -> list[dict[str, Any]]:
        return [e.get_event() for e in self.envelopes if e.get_event() is not None]

    def attachments(self) -> list[Any]:
        return [i for e in self.envelopes for i in e.items if i.headers.get("type") == "attachment"]

    def raw(self) -> bytes:
        return b"".join(e.serialize() for e in self.envelopes)


def _init(sent: Sent, **options: Any) -> None:
    import sentry_sdk
    from sentry_sdk.transport import Transport

    class Memory(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            sent.envelopes.append(envelope)

    def before_send(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
        sent.before_send.append(event)
        return event

    # A release given: without one sentry_sdk runs `git rev-parse HEAD` to find it.
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1", transport=Memory(), before_send=before_send,
        release="crashoverride-tests", **options,
    )  # fmt: skip


@pytest.fixture
def sentry() -> Iterator[Sent]:
    import sentry_sdk

    sent = Sent()
    _init(sent, default_integrations=False)
    yield sent
    sentry_sdk.get_global_scope().set_client(None)


def test_a_recovered_exception_is_one_handled_warning_with_report_and_transcript(
    sentry: Sent,
) -> None:
    import sentry_sdk

    co = CrashOverride(model=script(exec_python("caller['total'] = 7"), done("set total")))
    handler = co.handler(name="sentry-recovered")
    password = SECRET  # a secret-named local in the failed frame
    with sentry_sdk.isolation_scope() as scope:
        scope.set_tag("request", "r-1")
        total = 0
        with handler:
            raise ZeroDivisionError(f"no rate for {password}")
    report = handler.report
    assert report is not None and report.recovered and total == 7
    [event] = sentry.events()
    assert event["level"] == "warning"
    [exception] = event["exception"]["values"]
    assert exception["type"] == "ZeroDivisionError"
    # (sentry-sdk 3 adds the exception's id to the mechanism)
    mechanism = exception["mechanism"]
    assert (mechanism["type"], mechanism["handled"]) == ("crashoverride", True)
    assert event["tags"]["request"] == "r-1"  # the scope the failure happened in
    context = event["contexts"]["crashoverride"]
    assert context["recovery_id"] == report.recovery_id and context["outcome"] == "recovered"
    assert context["schema"] == "crashoverride.recovery/1"
    assert [call["code"] for call in context["tool_calls"]] == ["caller['total'] = 7"]
    [attachment] = sentry.attachments()
    text = attachment.payload.bytes.decode()
    assert f"Recovery {report.recovery_id}" in text and "caller['total'] = 7" in text
    assert sentry.before_send == [event]  # before_send saw it, like every event
    # The frame's locals as the SDK's scrubber leaves them (2.x), else as our redactor does
    # (sentry-sdk 3 has no scrubber; its data_collection sends frame variables as they are).
    frame = exception["stacktrace"]["frames"][-1]
    assert frame["vars"]["password"] == ("[REDACTED]" if SENTRY_MAJOR >= 3 else "[Filtered]")
    assert SECRET.encode() not in sentry.raw()


def test_the_event_of_a_recovered_exception_passes_the_recoverys_redactor(sentry: Sent) -> None:
    # crashoverride sends this event itself: the exception's message, the frame's locals and
    # the scope's data go out as the recovery's redactor leaves them, whatever the SDK scrubs.
    import sentry_sdk

    co = CrashOverride(model=script(exec_python("caller['total'] = 7"), done("set total")))
    handler = co.handler(name="sentry-redacted")
    password = SECRET  # secret-named: the redactor masks its value wherever it recurs
    quota = SECRET  # an innocent name the SDK's scrubber lets through
    signing = "sk-proj-" + "Qw3rTy7uIo9pAs2dFg4hJk6l"  # a provider key, by its format
    with sentry_sdk.isolation_scope() as scope:
        scope.set_extra("upstream", f"rejected {signing}")
        total = 0
        with handler:
            raise ZeroDivisionError(f"no rate for {password} ({quota}, {signing})")
    assert handler.report is not None and handler.report.recovered and total == 7
    [event] = sentry.events()
    raw = sentry.raw()
    assert SECRET.encode() not in raw and signing.encode() not in raw
    [exception] = event["exception"]["values"]
    assert exception["value"].startswith("no rate for [REDACTED]")  # not blind: still there
    assert "[REDACTED]" in event["extra"]["upstream"]
    assert exception["stacktrace"]["frames"][-1]["vars"]["quota"] != repr(SECRET)
    assert sentry.before_send == [event]  # the application's before_send sees it redacted


def test_a_failed_recovery_leaves_sentrys_event_with_the_note_and_the_report(
    sentry: Sent,
) -> None:
    import sentry_sdk

    co = CrashOverride(model=script(give_up("the rate table is gone")))
    handler = co.handler(name="sentry-failed")
    try:
        with handler:
            raise LookupError("rate")
    except LookupError as exc:
        sentry_sdk.capture_exception(exc)  # what the application's error reporting does
    report = handler.report
    assert report is not None and report.outcome == "failed"
    [event] = sentry.events()
    [exception] = event["exception"]["values"]
    assert exception["mechanism"]["handled"] is True  # capture_exception's own, untouched
    assert event["level"] == "error"
    assert f"crashoverride: recovery {report.recovery_id} failed" in exception["value"]
    context = event["contexts"]["crashoverride"]
    assert context["outcome"] == "failed" and "rate table is gone" in context["reason"]
    assert sentry.attachments() == []


# sentry-sdk 3 replaced ``include_local_variables`` with ``data_collection``.
NO_LOCALS: dict[str, Any] = (
    {"data_collection": {"stack_frame_variables": False}}
    if SENTRY_MAJOR >= 3
    else {"include_local_variables": False}
)


def test_a_client_that_sends_no_local_variables_gets_no_transcript(sentry: Sent) -> None:
    import sentry_sdk

    sentry_sdk.get_global_scope().set_client(None)
    _init(sentry, default_integrations=False, **NO_LOCALS)
    co = CrashOverride(model=script(exec_python("caller['n'] = 1"), done("secretive")))
    with co.handler():
        raise KeyError("n")
    [event] = sentry.events()
    assert event["contexts"]["crashoverride"]["outcome"] == "recovered"
    assert "vars" not in event["exception"]["values"][-1]["stacktrace"]["frames"][-1]
    assert sentry.attachments() == []  # the transcript quotes values: no local variables, none


@pytest.mark.skipif(SENTRY_MAJOR >= 3, reason="sentry-sdk 3 has no event scrubber")
def test_the_clients_event_scrubber_applies_to_the_report(sentry: Sent) -> None:
    import sentry_sdk
    from sentry_sdk.scrubber import EventScrubber

    sentry_sdk.get_global_scope().set_client(None)
    _init(sentry, default_integrations=False, event_scrubber=EventScrubber(denylist=["diagnosis"]))
    co = CrashOverride(model=script(exec_python("caller['n'] = 1"), done("secretive")))
    with co.handler():
        raise KeyError("n")
    [event] = sentry.events()
    assert event["contexts"]["crashoverride"]["diagnosis"] == "[Filtered]"


@pytest.mark.slow
def test_fastapi_one_event_per_exception_recovered_or_not() -> None:
    import sentry_sdk
    from fastapi import FastAPI

    from crashoverride.integrations.asgi import CrashOverrideMiddleware
    from tests.integrations.asgi_support import serve

    sent = Sent()
    _init(sent)  # the default integrations: FastAPI and Starlette are found and enabled
    try:
        rates: dict[str, int] = {}
        co = CrashOverride(
            model=Script(exec_python("rates['eur'] = 2\nawait replay_request()"), done("added eur"))
            .run(give_up("no such currency"))
            .model()
        )  # fmt: skip
        app = FastAPI()

        @app.get("/rate/{currency}")
        async def rate(currency: str) -> dict[str, int]:
            return {"rate": rates[currency]}

        app.add_middleware(CrashOverrideMiddleware, crash_override=co, name="sentry-asgi")
        with serve(app) as served:
            recovered = httpx.get(f"{served.url}/rate/eur", timeout=30)
            failed = httpx.get(f"{served.url}/rate/xyz", timeout=30)
    finally:
        sentry_sdk.get_global_scope().set_client(None)
    assert recovered.status_code == 200 and failed.status_code == 500
    first, second = sent.events()
    assert first["level"] == "warning"
    assert first["exception"]["values"][-1]["mechanism"]["handled"] is True
    assert first["request"]["url"].endswith("/rate/eur")  # the request's scope
    assert first["contexts"]["crashoverride"]["outcome"] == "recovered"
    assert second["level"] == "error"
    [exception] = second["exception"]["values"]
    assert exception["mechanism"]["handled"] is False  # as the FastAPI integration sends it
    assert "crashoverride: recovery rec_" in exception["value"]
    assert second["contexts"]["crashoverride"]["outcome"] == "failed"
    assert len(sent.attachments()) == 1


# A fresh interpreter: Sentry's Celery integration must be initialised before the worker's
# modules are imported (as in a worker process), which this test process is past.
_CELERY_WORKER = """
import json, os, sys, time, warnings

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

events = []


class Memory(Transport):
    def capture_envelope(self, envelope):
        event = envelope.get_event()
        if event is not None:
            events.append(event)


sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=Memory(),
                integrations=[CeleryIntegration()])
warnings.simplefilter("ignore", DeprecationWarning)  # celery's Redis backend, not ours

from celery import Celery
from celery.contrib.testing.worker import start_worker

from crashoverride import CrashOverride
from crashoverride.integrations.celery import CrashOverrideTask, install
from crashoverride.testing import done, exec_python, give_up, script

url, queue = sys.argv[1], sys.argv[2]
app = Celery("co_sentry", broker=url, backend=url, task_cls=CrashOverrideTask)
app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)
steps = [exec_python("set_result(4200)"), done("read amount"), give_up("no such rate")]
install(app, CrashOverride(model=script(*steps)))


@app.task(shared=False, name="sentry.total", recovery_prompt="Return the total.")
def total():
    return int({"amount_cents": 4200}["total"])


@app.task(shared=False, name="sentry.rate", recovery_prompt="Return the rate.")
def rate():
    raise LookupError("rate for XYZ")


with start_worker(app, pool="solo", perform_ping_check=False, queues=[queue],
                  loglevel="WARNING", shutdown_timeout=30):
    assert total.delay().get(timeout=60) == 4200
    try:
        rate.delay().get(timeout=60)
    except LookupError:
        pass
    # The result reaches the caller before the worker's failure handling sends its event.
    waited = 0
    while len(events) < 2 and waited < 600:
        time.sleep(0.05)
        waited += 1
print(json.dumps(events, default=str))
"""


@pytest.mark.slow
def test_celery_worker_one_event_per_exception_recovered_or_not() -> None:
    import json
    import os
    import subprocess
    import sys

    from tests.integrations.celery_support import redis_url

    with redis_url() as url:
        done = subprocess.run(
            [sys.executable, "-c", _CELERY_WORKER, url, f"co-sentry-{os.urandom(4).hex()}"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    recovered, failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert recovered["level"] == "warning"
    assert recovered["exception"]["values"][-1]["mechanism"]["handled"] is True
    assert recovered["contexts"]["crashoverride"]["outcome"] == "recovered"
    assert failed["level"] == "error"
    [exception] = failed["exception"]["values"]
    mechanism = exception["mechanism"]
    assert (mechanism["type"], mechanism["handled"]) == ("celery", False)  # Sentry's own
    assert "crashoverride: recovery rec_" in exception["value"]
    assert failed["contexts"]["crashoverride"]["reason"] == "the agent gave up: no such rate"
