"""Cassettes: record a recovery through the proxy, replay it offline, refuse mismatches."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from crashoverride.testing import (
    Cassette,
    CassetteError,
    CassetteMismatch,
    MockServer,
    Script,
    done,
    eval_python,
    exec_python,
)

SECRET = "svc-secret-value-42"
UPSTREAM_KEY = "sk-upstream-SECRET-123"
CLIENT_KEY = "sk-client-SECRET-456"
READING = {"celsius": 21}


def current_reading() -> dict[str, int]:
    return dict(READING)


def rehearse(co: Any) -> tuple[Any, Any]:
    """The protected code under test: identical on every call, so its prompts are too."""
    handler = co.handler("Leave `fahrenheit` holding the converted reading.")
    with handler:
        # No local holds the reading: it reaches the model only through a tool result.
        fahrenheit = current_reading()["fahrenheit"]
    return fahrenheit, handler.report


def upstream_script() -> Script:
    return Script(
        eval_python("current_reading()"),
        exec_python("caller['fahrenheit'] = current_reading()['celsius'] * 9 / 5 + 32"),
        done(f"converted; token {SECRET} was not needed"),
    )


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WEATHER_API_TOKEN", SECRET)
    # The core's Redactor treats $PWD as a password and masks the working directory in
    # every prompt; without it the test sees what the cassette itself does to paths.
    monkeypatch.delenv("PWD", raising=False)
    monkeypatch.delenv("OLDPWD", raising=False)
    path = tmp_path / "cassettes" / "convert.json"
    with (
        MockServer(upstream_script()) as real,
        MockServer(upstream=real.base_url, upstream_api_key=UPSTREAM_KEY, record_to=path) as rec,
    ):
        value, report = rehearse(rec.crash_override(api_key=CLIENT_KEY, model="gpt-test"))
        real.assert_complete()
    assert value == 69.8 and report.recovered
    # The real endpoint got the recorder's key, never the client's.
    assert {r.headers["authorization"] for r in real.requests} == {f"Bearer {UPSTREAM_KEY}"}
    return path


def test_recording_stores_decisive_fields_without_credentials_or_secrets(recorded: Path) -> None:
    text = recorded.read_text()
    data = json.loads(text)
    assert data["format"] == "crashoverride-cassette/1"
    assert len(data["interactions"]) == 3
    assert set(data["interactions"][0]["request"]) == {"model", "messages", "tools", "tool_choice"}
    for secret in (SECRET, UPSTREAM_KEY, CLIENT_KEY, "Bearer", str(Path.cwd())):
        assert secret not in text
    assert "[REDACTED]" in text  # the secret in the model's answer was masked, not dropped
    assert "<cwd>/tests/testing/test_cassette.py" in text  # portable paths
    assert " at 0x?>" in text  # object addresses do not make replays miss


def test_replay_offline_reproduces_the_recovery(recorded: Path) -> None:
    with MockServer(cassette=recorded) as replay:
        co = replay.crash_override(api_key="anything")
        value, report = rehearse(co)
        replay.assert_complete()
    assert value == 69.8 and report.recovered and report.model == "gpt-test"
    assert [call.tool for call in report.tool_calls] == ["eval_python", "exec_python"]
    assert "[REDACTED]" in report.diagnosis


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # openai streams + trio: see test_server
@pytest.mark.anyio
async def test_a_cassette_serves_streaming_clients_too(recorded: Path) -> None:
    from openai import AsyncOpenAI

    first = Cassette.load(recorded).interactions[0]["request"]
    async with MockServer(cassette=recorded) as replay:
        client = AsyncOpenAI(base_url=replay.base_url, api_key="k", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model=first["model"], messages=first["messages"], tools=first["tools"],
                stream=True,
            )  # fmt: skip
            names = [
                call.function.name
                async for chunk in stream
                for call in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices
                if call.function is not None and call.function.name
            ]  # fmt: skip
        finally:
            await client.close()
    assert names == ["eval_python"]


def test_a_changed_prompt_misses_on_turn_one(recorded: Path) -> None:
    with MockServer(cassette=recorded) as replay:
        co = replay.crash_override(project_prompt="A different application.")
        with pytest.raises(KeyError) as info:
            rehearse(co)
    assert "turn 1 does not match" in replay.errors[0]
    assert "messages[0].content differs" in replay.errors[0]
    assert "About this application" in replay.errors[0]  # shows the received text
    assert any("turn 1 does not match" in note for note in info.value.__notes__)
    with pytest.raises(AssertionError, match="turn 1"):
        replay.assert_complete()


def test_a_changed_tool_result_misses_on_turn_two(
    recorded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(READING, "celsius", 30)
    with MockServer(cassette=recorded) as replay:
        with pytest.raises(KeyError):
            rehearse(replay.crash_override())
    assert len(replay.requests) == 2  # never a made-up completion after the miss
    (error,) = replay.errors
    assert "turn 2 does not match" in error and "messages[3].content differs" in error
    # The excerpts are reprs (a fenced result holds both kinds of quote, so they are escaped).
    assert re.search(r"celsius\\?': 21", error) and re.search(r"celsius\\?': 30", error)


def test_replaying_past_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    with (
        MockServer(Script(exec_python("pass"))) as real,
        MockServer(upstream=real.base_url, record_to=path) as rec,
    ):
        _, report = _fail(rec)
    assert "no turn left" in report.reason  # the upstream's own error passed through
    assert len(Cassette.load(path)) == 1  # errors are not recorded
    with MockServer(cassette=path) as replay:
        _, report = _fail(replay)
    assert "turn 2 was requested but only 1 were recorded" in report.reason


def _fail(server: MockServer) -> tuple[Any, Any]:
    handler = server.crash_override(model="m").handler()
    with pytest.raises(ZeroDivisionError), handler:
        _ = 1 / 0
    return None, handler.report


def test_cassette_files_are_checked(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match="no cassette at"):
        Cassette.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    with pytest.raises(CassetteError, match="is not a crashoverride-cassette/1 file"):
        MockServer(cassette=bad)
    with pytest.raises(CassetteError, match="no path"):
        Cassette().save()


def test_mismatch_details() -> None:
    cassette = Cassette([{"request": {"model": "a", "messages": [{"role": "user"}], "tools": None,
                                      "tool_choice": None}, "response": {}}])  # fmt: skip

    def miss(body: dict[str, Any]) -> CassetteMismatch:
        with pytest.raises(CassetteMismatch) as info:
            cassette.response_for(1, body, lambda value: value)
        return info.value

    short = miss({"model": "a", "messages": []})
    assert (short.turn, short.field) == (1, "messages")
    assert "recorded 1 items, received 0" in str(short)
    extra = miss({"model": "a", "messages": [{"role": "user", "name": "x"}]})
    assert extra.field == "messages[0].name" and "not in the recording" in str(extra)
    model = miss({"model": "b", "messages": [{"role": "user"}]})
    assert model.field == "model" and "recorded 'a'" in str(model)
    assert (
        cassette.response_for(1, {"model": "a", "messages": [{"role": "user"}]}, lambda v: v) == {}
    )
