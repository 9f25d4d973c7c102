"""Every injected endpoint fault ends in a failed recovery that re-raises the ORIGINAL exception."""

from __future__ import annotations

import time
from typing import Any

import pytest

from crashoverride.testing import (
    MockServer,
    Script,
    StepLike,
    done,
    exec_python,
    hang,
    http_error,
    junk_arguments,
    malformed,
    rate_limited,
    unknown_tool,
)


class Original(Exception):
    """The user's failure; a recovery must hand back this very object."""


def fail_through(srv: MockServer, **settings: Any) -> tuple[Original, Any]:
    handler = srv.crash_override(**settings).handler("Leave `value` set.")
    original = Original("the block failed")
    with pytest.raises(Original) as info, handler:
        raise original
    assert info.value is original
    report = handler.report
    assert report is not None and report.outcome == "failed"
    notes = getattr(original, "__notes__", [])
    assert notes == [f"crashoverride: recovery {report.recovery_id} failed: {report.reason}"]
    return original, report


def serve(*steps: StepLike) -> MockServer:
    return MockServer(Script(*steps))


def test_http_500() -> None:
    with serve(http_error(500, times=None)) as srv:
        _, report = fail_through(srv)
    assert "InternalServerError" in report.reason and "500" in report.reason
    assert len(srv.requests) == 2  # one retry by the openai client (max_retries=1), then it fails


def test_429_retry_after_is_honoured_then_the_run_continues() -> None:
    with serve(rate_limited(retry_after=1), exec_python("caller['value'] = 5"), done()) as srv:
        handler = srv.crash_override().handler()
        started = time.monotonic()
        with handler:
            value = int("x")
        elapsed = time.monotonic() - started
        srv.assert_complete()
    assert value == 5 and handler.report is not None and handler.report.recovered
    assert elapsed >= 0.9  # the client waited for Retry-After before asking again
    assert len(srv.requests) == 3


def test_429_that_persists() -> None:
    with serve(rate_limited(retry_after=0.05, times=None)) as srv:
        _, report = fail_through(srv)
    assert "RateLimitError" in report.reason and "429" in report.reason


def test_hang_is_cut_by_the_recovery_timeout() -> None:
    with serve(hang()) as srv:
        started = time.monotonic()
        _, report = fail_through(srv, timeout=1.0)
        elapsed = time.monotonic() - started
    assert report.reason == "timed out after 1s"
    assert elapsed < 10


def test_malformed_body() -> None:
    with serve(malformed(times=None)) as srv:
        _, report = fail_through(srv)
    assert report.turns == 0 and report.tool_calls == ()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the Agents SDK is asyncio-only
@pytest.mark.anyio
async def test_malformed_stream_fails_a_streamed_run() -> None:
    # The core asks for whole completions; a streaming client must also fail, not hang.
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
    from openai import AsyncOpenAI

    async with MockServer(Script(malformed())) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        try:
            model = OpenAIChatCompletionsModel(model="scripted", openai_client=client)
            result = Runner.run_streamed(
                Agent(name="t", model=model), "go", run_config=RunConfig(tracing_disabled=True)
            )
            with pytest.raises(Exception) as info:
                async for _ in result.stream_events():
                    pass
        finally:
            await client.close()
    assert "Expecting" in str(info.value) or "JSON" in type(info.value).__name__
    assert srv.requests[0].stream


def test_tool_call_with_junk_arguments_until_the_turns_run_out() -> None:
    with serve(junk_arguments(), junk_arguments()) as srv:
        _, report = fail_through(srv, max_turns=2)
        srv.assert_complete()
    assert report.reason == "max_turns (2) exceeded"
    assert report.tool_calls == ()  # the junk never ran
    # The model was told why, so a real one could correct itself.
    told = [m["content"] for m in srv.requests[1].messages if m["role"] == "tool"]
    assert len(told) == 1 and "Invalid JSON input for tool exec_python" in told[0]


def test_junk_arguments_corrected_on_the_next_turn() -> None:
    with serve(junk_arguments(), exec_python("caller['value'] = 2"), done()) as srv:
        handler = srv.crash_override().handler()
        with handler:
            value = int("x")
        srv.assert_complete()
    assert value == 2 and handler.report is not None and handler.report.recovered


def test_unknown_tool() -> None:
    with serve(unknown_tool("format_hard_drive"), done("should not get here")) as srv:
        _, report = fail_through(srv)
    assert "format_hard_drive" in report.reason
    assert report.tool_calls == ()
