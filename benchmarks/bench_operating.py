"""Operating it: the happy path and one recovery with OpenTelemetry and Sentry configured.

Measured in a fresh interpreter that sets up what a production process does (the OpenTelemetry
SDK's tracer and meter providers, an active Sentry client, a ledger sink), so the global
providers never leak into the other benchmarks. The happy path must not notice any of it: a
block that does not raise never reaches the observers. A recovery pays for its spans, metric
points, the Sentry event and the ledger line: compared with the same scripted recovery in a
process with none of them configured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from benchmarks._common import Row, row

_CHILD = textwrap.dedent(
    """
    import contextlib, json, statistics, sys, tempfile, time

    from benchmarks._common import interleaved
    from crashoverride import CrashOverride, JsonLinesLedger
    from crashoverride.testing import done, exec_python, script

    configured = sys.argv[1] == "configured"
    ledger = None
    if configured:
        import sentry_sdk
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from sentry_sdk.transport import Transport

        class Discard(Transport):
            def capture_envelope(self, envelope):
                pass

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=Discard())
        ledger = JsonLinesLedger(tempfile.mktemp(suffix=".jsonl"))

    co = CrashOverride(project_prompt="benchmark", model="unused", on_recovery=ledger)
    suppress = contextlib.suppress

    def with_handler(n):
        for _ in range(n):
            with co.handler(prompt="Leave `x` set."):
                pass

    def with_suppress(n):
        for _ in range(n):
            with suppress(Exception):
                pass

    t = interleaved({"handler": with_handler, "suppress": with_suppress}, 200_000)

    def recover():
        model = script(exec_python("caller['x'] = 1"), done("set x"))
        handler = CrashOverride(model=model, on_recovery=ledger).handler(name="bench")
        x = 0
        with handler:
            raise KeyError("x")
        assert x == 1

    recover()  # the SDK import and first-use costs, paid once in both processes
    samples = []
    for _ in range(25):
        start = time.perf_counter()
        recover()
        samples.append((time.perf_counter() - start) * 1000)
    print(json.dumps({**t, "recovery_ms": statistics.median(samples)}))
    """
)


def _measure(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def run() -> list[Row]:
    plain = _measure("plain")
    configured = _measure("configured")
    return [
        row("with co.handler(...) vs contextlib.suppress, OTel SDK + Sentry + ledger set up",
            configured["handler"], "ns", baseline=configured["suppress"], target="<= 1.25",
            note="no failure: the observers are never reached"),
        row("one scripted recovery, OTel SDK + Sentry + ledger vs none configured",
            configured["recovery_ms"], "ms", baseline=plain["recovery_ms"],
            note="spans, metric points, a Sentry event, a ledger line"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
