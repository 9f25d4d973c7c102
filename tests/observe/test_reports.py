"""Reports per task, and SDK tracing off unless asked for."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from agents.testing import ModelStep

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, output_items, script


@pytest.mark.anyio
async def test_one_handler_shared_by_concurrent_tasks_keeps_reports_apart(
    anyio_backend: str,
) -> None:
    # Two different failures (two fingerprints) so both recover independently. Each model turn
    # answers the run that asks (the runs reach the model in either order).
    def answer(call: Any) -> list[Any]:
        items = call.input if isinstance(call.input, list) else []
        text = str(call.input)
        if "ValueError" in text:
            return output_items(give_up("b cannot be recovered"))
        if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items):
            return output_items(done("set a"))
        return output_items(
            exec_python("import anyio\nawait anyio.sleep(0.1)\ncaller['value'] = 'a'")
        )

    model = script()
    for _ in range(3):
        model.enqueue(ModelStep.respond(answer))
    co = CrashOverride(model=model)
    handler = co.handler()
    seen: dict[str, Any] = {}

    async def task_a() -> None:
        value = None
        async with handler:
            raise KeyError("a")
        seen["a"] = (value, handler.report)

    async def task_b() -> None:
        await anyio.sleep(0.02)  # starts while a is recovering
        try:
            async with handler:
                raise ValueError("b")
        except ValueError:
            seen["b"] = handler.report

    async with anyio.create_task_group() as tg:
        tg.start_soon(task_a)
        tg.start_soon(task_b)
    value, report_a = seen["a"]
    assert (
        value == "a" and report_a.outcome == "recovered" and report_a.exc_type.endswith("KeyError")
    )
    assert seen["b"].outcome == "failed" and seen["b"].exc_type.endswith("ValueError")
    assert handler.report is None  # this (parent) task ran no recovery itself


class Spans:
    def __init__(self) -> None:
        self.traces: list[Any] = []

    def on_trace_start(self, trace: Any) -> None:
        self.traces.append(trace)

    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...
    def on_span_end(self, span: Any) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@pytest.mark.parametrize("tracing", [False, True])
def test_sdk_tracing_is_off_unless_asked_for(tracing: bool) -> None:
    from agents.tracing import set_trace_processors

    spans = Spans()
    set_trace_processors([spans])  # type: ignore[list-item]
    try:
        co = CrashOverride(
            model=script(exec_python("caller['fixed'] = True"), done()), tracing=tracing
        )
        with co.handler():
            raise ValueError
    finally:
        set_trace_processors([])
    assert bool(spans.traces) is tracing
