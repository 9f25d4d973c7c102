"""MockServer with the real openai client and the SDK's chat-completions model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from crashoverride.testing import MockServer, Script, done, eval_python, exec_python, give_up


@pytest.mark.parametrize("keep_alive", [False, True])
@pytest.mark.anyio
async def test_non_streaming_completion_with_the_openai_client(keep_alive: bool) -> None:
    from openai import AsyncOpenAI

    steps = Script([exec_python("x = 1"), eval_python("x")], done("bye"))
    async with MockServer(steps, keep_alive=keep_alive) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        try:
            messages = [{"role": "user", "content": "hi"}]
            first = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            second = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        finally:
            await client.close()
    calls = first.choices[0].message.tool_calls
    assert calls is not None and first.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.function.name) for c in calls] == [  # type: ignore[union-attr]
        ("call_1", "exec_python"),
        ("call_2", "eval_python"),
    ]
    assert json.loads(calls[0].function.arguments) == {"statements": "x = 1"}  # type: ignore[union-attr]
    assert second.choices[0].message.content == "bye"
    assert second.usage is not None and second.usage.total_tokens > 0
    assert [r.stream for r in srv.requests] == [False, False]
    assert srv.requests[0].headers["authorization"] == "Bearer sk-test"
    srv.assert_complete()


# openai's stream leaves inner async generators unexhausted after [DONE]; trio's finalizer
# reports that as a ResourceWarning (an openai trait, not the server's), so asyncio only.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_streaming_completion_with_the_openai_client() -> None:
    from openai import AsyncOpenAI

    long_code = "caller['x'] = " + "1 + " * 40 + "1"
    async with MockServer(
        Script(exec_python(long_code), done("a longer final message " * 3))
    ) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        try:
            messages = [{"role": "user", "content": "hi"}]
            stream = await client.chat.completions.create(
                model="m", messages=messages, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            stream = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        finally:
            await client.close()
    pieces = [
        call.function.arguments
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
        if call.function is not None and call.function.arguments
    ]
    assert len(pieces) > 1  # the arguments really arrive in several deltas
    assert json.loads("".join(pieces)) == {"statements": long_code}
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert text == "a longer final message " * 3
    assert all(r.stream for r in srv.requests)


def test_recovery_through_the_server() -> None:
    with MockServer(
        Script(eval_python("data"), exec_python("caller['n'] = len(data)"), done("counted"))
    ) as srv:
        co = srv.crash_override()
        handler = co.handler("Leave `n` holding the number of items.")
        data = [1, 2, 3]
        with handler:
            n = data.count()  # type: ignore[call-arg]
        srv.assert_complete()
    assert n == 3
    report = handler.report
    assert report is not None and report.recovered and report.model == "scripted"
    assert report.usage.requests == 3 and report.usage.input_tokens > 0
    first, last = srv.requests[0].body, srv.requests[-1].body
    assert first["model"] == "scripted"
    assert {tool["function"]["name"] for tool in first["tools"]} >= {
        "eval_python",
        "exec_python",
        "give_up",
    }
    # The tool result the model saw on the last turn came from the live process.
    assert any(
        m.get("role") == "tool" and "[1, 2, 3]" in str(m.get("content")) for m in last["messages"]
    )


@pytest.mark.anyio
async def test_async_recovery_through_the_server() -> None:
    # Under trio the core runs the SDK on an asyncio loop in a worker thread: the server
    # lives in its own thread, so both backends reach it alike.
    async with MockServer(Script(exec_python("caller['n'] = await count()"), done())) as srv:

        async def count() -> int:
            return 4

        handler = srv.crash_override().handler()
        async with handler:
            n = int("four")
        srv.assert_complete()
    assert n == 4 and count is not None
    assert handler.report is not None and handler.report.recovered


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the Agents SDK is asyncio-only
@pytest.mark.anyio
async def test_sdk_streamed_run_through_the_server() -> None:
    # The core runs non-streamed; an agent run with streaming must work against the mock too.
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    seen: list[str] = []

    def exec_python(statements: str) -> str:
        """Run statements."""
        seen.append(statements)
        return "OK"

    async with MockServer(Script(exec_python_step("print(1)"), done("finished"))) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        try:
            model = OpenAIChatCompletionsModel(model="scripted", openai_client=client)
            agent = Agent(name="t", model=model, tools=[function_tool(exec_python)])
            result = Runner.run_streamed(agent, "go", run_config=RunConfig(tracing_disabled=True))
            async for _ in result.stream_events():
                pass
        finally:
            await client.close()
    assert seen == ["print(1)"] and result.final_output == "finished"
    assert [r.stream for r in srv.requests] == [True, True]


exec_python_step = exec_python


def test_script_exhaustion_and_wrong_paths_are_errors_not_answers() -> None:
    with MockServer(Script(give_up("x"))) as srv:
        url = srv.base_url
        bodies = [json.dumps({"model": "m", "messages": []}).encode()] * 2
        statuses = []
        for body in bodies:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/chat/completions", body))
                statuses.append(200)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
                exc.close()
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(urllib.request.Request(f"{url}/responses", bodies[0]))
        info.value.close()
    assert statuses == [200, 400]
    assert info.value.code == 404
    assert srv.errors == ["request 2: the script has no turn left"]
    with pytest.raises(AssertionError, match="no turn left"):
        srv.assert_complete()


def test_loopback_only_and_one_mode() -> None:
    with pytest.raises(ValueError, match="loopback"):
        MockServer(host="0.0.0.0")
    with pytest.raises(ValueError, match="one of"):
        MockServer(Script(done()), upstream="http://127.0.0.1:1/v1")
    with pytest.raises(RuntimeError, match="not running"):
        _ = MockServer().base_url


def test_unused_turns_fail_assert_complete() -> None:
    with (
        MockServer(Script(done("never asked"))) as srv,
        pytest.raises(AssertionError, match="never requested"),
    ):
        srv.assert_complete()
