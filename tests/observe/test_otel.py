"""OpenTelemetry: a span per recovery under the caller's span, a child per tool call, metrics.

The SDK's in-memory exporters stand behind the global providers (set once per process, as an
application does at start-up); each test looks only at the spans of its own trace and at the
metric points of its own handler name.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, output_items, script

SECRET = "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


class Telemetry:
    def __init__(self) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        trace.set_tracer_provider(tracer_provider)
        self.reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))
        self.tracer = trace.get_tracer("tests")

    def trace_of(self, trace_id: int) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.context.trace_id == trace_id]

    def points(self, name: str, handler: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [
                            p
                            for p in metric.data.data_points
                            if p.attributes.get("handler") == handler
                        ]
        return found


_telemetry: Telemetry | None = None


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    global _telemetry
    if _telemetry is None:  # the global providers can be set once per process
        _telemetry = Telemetry()
    yield _telemetry


def _only(spans: list[Any], name: str) -> Any:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _fix_with_secret() -> Any:
    # The snippet quotes the secret: its span must not.
    return script(
        exec_python(f"token = {SECRET!r}\ncaller['value'] = len(token)"),
        exec_python("1/0"),
        done("set value"),
    )


def test_recovery_span_is_a_child_of_the_callers_span_with_redacted_attributes(
    otel: Telemetry,
) -> None:
    co = CrashOverride(model=_fix_with_secret())
    handler = co.handler(name="otel-sync", postcondition=lambda state: True)
    api_key = SECRET  # a secret-named local: its value is masked wherever it appears
    with otel.tracer.start_as_current_span("request") as parent:
        value = None
        with handler:
            raise KeyError(f"no account for key {api_key}")
    assert handler.report is not None and handler.report.outcome == "recovered", handler.report
    assert value is not None
    spans = otel.trace_of(parent.get_span_context().trace_id)
    recovery = _only(spans, "crashoverride.recovery")
    assert recovery.parent.span_id == parent.get_span_context().span_id
    attributes = dict(recovery.attributes)
    assert attributes["exception.type"] == "builtins.KeyError"
    assert "no account for key" in attributes["exception.message"]
    assert attributes["code.function"].endswith(
        "test_recovery_span_is_a_child_of_the_callers_span_with_redacted_attributes"
    )
    assert attributes["code.filepath"] == __file__
    assert isinstance(attributes["code.lineno"], int)
    assert attributes["crashoverride.outcome"] == "recovered"
    assert attributes["crashoverride.handler"] == "otel-sync"
    assert attributes["crashoverride.fingerprint"] == handler.report.fingerprint
    assert attributes["crashoverride.turns"] == 3
    assert attributes["crashoverride.model"] == "ScriptedModel"
    assert attributes["crashoverride.recovery_id"] == handler.report.recovery_id
    assert recovery.status.status_code.name == "UNSET"
    [event] = [e for e in recovery.events if e.name == "exception"]
    assert event.attributes["exception.escaped"] is False
    tools = [s for s in spans if s.name == "crashoverride.tool_call"]
    assert [t.parent.span_id for t in tools] == [recovery.context.span_id] * 2
    assert [t.attributes["crashoverride.tool.ok"] for t in tools] == [True, False]
    assert tools[1].status.status_code.name == "ERROR"
    assert "caller['value']" in tools[0].attributes["crashoverride.tool.code"]
    assert all(t.start_time <= t.end_time for t in tools)
    assert recovery.start_time <= tools[0].start_time and tools[1].end_time <= recovery.end_time
    exported = repr([(s.attributes, [e.attributes for e in s.events], s.status) for s in spans])
    assert SECRET not in exported


def test_a_failed_recovery_span_has_error_status_and_is_counted(otel: Telemetry) -> None:
    co = CrashOverride(model=script(give_up("cannot")), breaker_threshold=1)
    handler = co.handler(name="otel-failed")

    def fail() -> None:
        with handler:
            raise ValueError("broken")

    with otel.tracer.start_as_current_span("task") as parent:
        with pytest.raises(ValueError):
            fail()
        with pytest.raises(ValueError):  # the breaker is open now: skipped, no agent
            fail()
    spans = otel.trace_of(parent.get_span_context().trace_id)
    failed, skipped = (s for s in spans if s.name == "crashoverride.recovery")
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes["crashoverride.outcome"] == "failed"
    assert "gave up" in failed.status.description
    assert skipped.attributes["crashoverride.outcome"] == "skipped"
    outcomes = {
        p.attributes["outcome"]: p.value
        for p in otel.points("crashoverride.recoveries", "otel-failed")
    }
    assert outcomes == {"failed": 1, "skipped": 1}
    [reason] = otel.points("crashoverride.recoveries.skipped", "otel-failed")
    assert (reason.attributes["reason"], reason.value) == ("breaker", 1)
    durations = otel.points("crashoverride.recovery.duration", "otel-failed")
    assert sum(p.count for p in durations) == 2


def test_tokens_are_counted_by_kind(otel: Telemetry) -> None:
    from agents.testing import ModelStep
    from agents.usage import Usage

    def step(turn: Any, tokens_in: int, tokens_out: int) -> Any:
        usage = Usage(requests=1, input_tokens=tokens_in, output_tokens=tokens_out)
        return ModelStep(output=output_items(turn), usage=usage)

    model = script()
    model.extend([step(exec_python("caller['v'] = 1"), 120, 7), step(done(), 200, 3)])
    handler = CrashOverride(model=model).handler(name="otel-tokens")
    with handler:
        raise KeyError("x")
    report = handler.report
    assert report is not None and report.recovered
    assert (report.usage.input_tokens, report.usage.output_tokens) == (320, 10)
    counted = {
        p.attributes["token.type"]: p.value
        for p in otel.points("crashoverride.tokens", "otel-tokens")
    }
    assert counted == {"input": 320, "output": 10}
    [recovery] = [
        s
        for s in otel.spans.get_finished_spans()
        if s.attributes.get("crashoverride.handler") == "otel-tokens"
    ]
    assert recovery.attributes["crashoverride.tokens.input"] == 320


@pytest.mark.anyio
async def test_async_recovery_span_parents_under_the_current_span(
    otel: Telemetry, anyio_backend: str
) -> None:
    co = CrashOverride(model=script(exec_python("caller['v'] = 2"), done()))
    handler = co.handler(name=f"otel-async-{anyio_backend}", postcondition=lambda state: True)
    with otel.tracer.start_as_current_span("job") as parent:
        async with handler:
            raise KeyError("y")
    spans = otel.trace_of(parent.get_span_context().trace_id)
    recovery = _only(spans, "crashoverride.recovery")
    assert recovery.parent.span_id == parent.get_span_context().span_id
    assert recovery.attributes["crashoverride.outcome"] == "recovered"
    tool = _only(spans, "crashoverride.tool_call")
    assert tool.parent.span_id == recovery.context.span_id


@pytest.mark.slow
def test_fastapi_request_trace_holds_the_recovery(otel: Telemetry) -> None:
    from fastapi import FastAPI
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    from crashoverride.integrations.asgi import CrashOverrideMiddleware
    from tests.integrations.asgi_support import serve

    prices: dict[str, int] = {}
    co = CrashOverride(
        model=script(
            exec_python("prices['apple'] = 3\nawait replay_request()"), done("stocked apple")
        )
    )
    app = FastAPI()

    @app.get("/price/{item}")
    async def price(item: str) -> dict[str, int]:
        return {"price": prices[item]}

    app.add_middleware(CrashOverrideMiddleware, crash_override=co, name="otel-asgi")
    app.add_middleware(OpenTelemetryMiddleware)
    with serve(app) as served:
        response = httpx.get(f"{served.url}/price/apple", timeout=30)
    assert response.status_code == 200 and response.json() == {"price": 3}
    spans = otel.spans.get_finished_spans()
    recovery = _only(
        [s for s in spans if s.attributes.get("crashoverride.handler") == "otel-asgi"],
        "crashoverride.recovery",
    )
    trace = otel.trace_of(recovery.context.trace_id)
    server = [s for s in trace if s.kind.name == "SERVER"]
    assert len(server) == 1 and server[0].name.startswith("GET /price")
    by_id = {s.context.span_id: s for s in trace}
    ancestor = recovery
    while ancestor.parent is not None and ancestor.parent.span_id in by_id:
        ancestor = by_id[ancestor.parent.span_id]
    assert ancestor is server[0]
    assert recovery.attributes["crashoverride.outcome"] == "recovered"


@pytest.mark.slow
def test_without_a_configured_provider_a_recovery_makes_no_telemetry() -> None:
    # A fresh process: importing crashoverride imports neither system; the SDK's dependencies
    # import the OpenTelemetry API, but with no provider set nothing is made.
    script = textwrap.dedent(
        """
        import sys
        import crashoverride
        assert "opentelemetry" not in sys.modules and "sentry_sdk" not in sys.modules
        from crashoverride.testing import done, exec_python, script
        steps = [exec_python("caller['v'] = 1"), done()] * 2
        co = crashoverride.CrashOverride(model=script(*steps))
        for _ in range(2):
            handler = co.handler()
            with handler:
                raise KeyError("x")
            assert handler.report.recovered, handler.report
        from crashoverride._observe import otel as _otel
        assert _otel._instruments is None
        assert "sentry_sdk" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stderr


def test_a_failure_an_entry_point_lets_pass_is_counted_as_skipped(otel: Telemetry) -> None:
    from crashoverride import integration

    handler = CrashOverride(model="unused").handler(name="otel-entry-skip")
    integration.skip(handler, KeyError("late"), "the response had already started; ...")
    [reason] = otel.points("crashoverride.recoveries.skipped", "otel-entry-skip")
    assert (reason.attributes["reason"], reason.value) == ("response_started", 1)
    [counted] = otel.points("crashoverride.recoveries", "otel-entry-skip")
    assert (counted.attributes["outcome"], counted.value) == ("skipped", 1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_celery_task_trace_holds_the_recovery_in_a_real_worker(otel: Telemetry) -> None:
    import gc
    import os
    import warnings

    from celery import Celery
    from celery.contrib.testing.worker import start_worker
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from crashoverride.integrations.celery import CrashOverrideTask, install
    from tests.integrations.celery_support import redis_url

    queue = f"co-otel-{os.urandom(4).hex()}"
    co = CrashOverride(model=script(exec_python("set_result(4200)"), done("read amount")))
    CeleryInstrumentor().instrument()
    try:
        with redis_url() as url:
            app = Celery("co_otel", broker=url, backend=url, task_cls=CrashOverrideTask)
            app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                            worker_hijack_root_logger=False)  # fmt: skip
            install(app, co)

            @app.task(shared=False, name="otel.total", recovery_prompt="Return the total.")
            def total() -> int:
                return int({"amount_cents": 4200}["total"])

            with start_worker(app, pool="solo", perform_ping_check=False, queues=[queue],
                              loglevel="WARNING", shutdown_timeout=30):  # fmt: skip
                with otel.tracer.start_as_current_span("enqueue") as parent:
                    assert total.delay().get(timeout=60) == 4200
            app.backend.client.connection_pool.disconnect()
            app.close()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
    finally:
        CeleryInstrumentor().uninstrument()
    # The worker's task span continues the sender's trace; the recovery sits in the task span.
    spans = otel.trace_of(parent.get_span_context().trace_id)
    recovery = _only(spans, "crashoverride.recovery")
    run = _only(spans, "run/otel.total")
    assert run.kind.name == "CONSUMER" and recovery.parent.span_id == run.context.span_id
    assert recovery.attributes["crashoverride.outcome"] == "recovered"
    assert recovery.attributes["crashoverride.handler"] == "otel.total"


@pytest.mark.anyio
async def test_concurrent_recoveries_each_sit_in_their_own_callers_span(
    otel: Telemetry, anyio_backend: str
) -> None:
    import anyio

    parents: dict[int, Any] = {}

    async def job(number: int) -> None:
        model = script(
            exec_python(f"import anyio\nawait anyio.sleep(0.05)\ncaller['v'] = {number}"),
            done(),
        )
        handler = CrashOverride(model=model).handler(name=f"otel-many-{anyio_backend}")
        with otel.tracer.start_as_current_span(f"job-{number}") as parent:
            parents[number] = parent
            v = 0
            async with handler:
                raise KeyError(number)
            assert v == number

    async with anyio.create_task_group() as group:
        for number in (1, 2, 3):
            group.start_soon(job, number)
    for parent in parents.values():
        spans = otel.trace_of(parent.get_span_context().trace_id)
        recovery = _only(spans, "crashoverride.recovery")
        assert recovery.parent.span_id == parent.get_span_context().span_id
        assert _only(spans, "crashoverride.tool_call").parent.span_id == recovery.context.span_id
