"""Bad configuration fails at construction with a message naming the argument."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crashoverride import ConfigurationError, CrashOverride
from crashoverride._config.settings import Settings
from crashoverride.testing import done, script

# Values of the wrong type for each argument, generated.
junk = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.text(min_size=1), st.binary(), st.booleans()
)

APP_TYPES: dict[str, Any] = {
    "project_prompt": st.one_of(st.integers(), st.binary(), st.lists(st.text())),
    "system_prompt": st.one_of(st.integers(), st.binary()),
    "catch": st.one_of(st.integers(), st.text(min_size=1), st.just(KeyboardInterrupt)),
    "tools": st.one_of(st.integers(), st.text(min_size=1), st.lists(st.integers(), min_size=1)),
    "mcp_servers": st.one_of(st.integers(), st.lists(st.text(), min_size=1)),
    "openai_client_factory": st.one_of(st.integers(), st.text(min_size=1)),
    "agent_factory": st.one_of(st.integers(), st.text(min_size=1)),
    "api_key": st.one_of(st.integers(), st.binary()),
    "base_url": st.one_of(st.integers(), st.binary()),
    "timeout": st.one_of(st.text(), st.booleans(), st.floats(max_value=0)),
    "max_turns": st.one_of(st.text(), st.booleans(), st.integers(max_value=0), st.floats()),
    "max_concurrent_recoveries": st.one_of(st.text(), st.integers(max_value=0)),
    "concurrency_wait": st.one_of(st.text(), st.floats(max_value=-0.01)),
    "single_flight": st.one_of(st.integers(), st.text()),
    "breaker_threshold": st.one_of(st.text(), st.integers(max_value=0)),
    "breaker_window": st.one_of(st.text(), st.floats(max_value=0)),
    "breaker_cooldown": st.one_of(st.text(), st.floats(max_value=-0.01)),
    "patch_watch": st.one_of(st.text(), st.booleans(), st.floats(max_value=-0.01)),
    "tracing": st.one_of(st.integers(), st.text()),
    "on_recovery": st.one_of(st.integers(), st.text(min_size=1)),
    "model": st.one_of(st.integers(), st.just(""), st.lists(st.integers())),
}


@pytest.mark.parametrize("argument", sorted(APP_TYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_app_arguments_are_validated_at_construction(argument: str, data: st.DataObject) -> None:
    value = data.draw(APP_TYPES[argument])
    with pytest.raises(ConfigurationError) as info:
        CrashOverride(**{argument: value})
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}:")


HANDLER_TYPES = {
    key: APP_TYPES[key]
    for key in ("model", "catch", "tools", "mcp_servers", "system_prompt", "timeout", "max_turns")
} | {
    "prompt": st.one_of(st.integers(), st.binary(), st.none()),
    "postcondition": st.one_of(st.integers(), st.text(min_size=1)),
    "name": st.one_of(st.integers(), st.binary()),
}


@pytest.mark.parametrize("argument", sorted(HANDLER_TYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_handler_arguments_are_validated_at_construction(
    argument: str, data: st.DataObject
) -> None:
    co = CrashOverride()
    value = data.draw(HANDLER_TYPES[argument])
    with pytest.raises(ConfigurationError) as info:
        co.handler(**{argument: value})
    assert info.value.argument == argument


@pytest.mark.parametrize(
    "catch", [KeyboardInterrupt, SystemExit, GeneratorExit, BaseException, asyncio.CancelledError]
)
def test_control_flow_exceptions_cannot_be_caught(catch: type[BaseException]) -> None:
    with pytest.raises(ConfigurationError, match="never caught"):
        CrashOverride(catch=catch)


def test_trio_cancellation_cannot_be_caught() -> None:
    import trio

    with pytest.raises(ConfigurationError, match="catch"):
        CrashOverride(catch=trio.Cancelled)


def test_handler_tools_are_added_without_duplicates_and_the_rest_overrides() -> None:
    def app_tool() -> str:
        return "a"

    def handler_tool() -> str:
        return "h"

    co = CrashOverride(tools=[app_tool], model="app-model", timeout=10, project_prompt="P")
    handler = co.handler("do it", tools=[app_tool, handler_tool], model="h-model", timeout=3)
    s: Settings = handler.settings
    assert s.tools == (app_tool, handler_tool)
    assert (s.model, s.timeout, s.project_prompt, s.prompt) == ("h-model", 3.0, "P", "do it")
    plain = co.handler("x").settings
    assert (plain.model, plain.timeout, plain.tools) == ("app-model", 10.0, (app_tool,))


def test_a_model_instance_is_accepted() -> None:
    model = script(done())
    assert CrashOverride(model=model).handler().settings.model is model


def test_decorating_a_non_callable_fails() -> None:
    with pytest.raises(ConfigurationError, match="func"):
        CrashOverride().handler()(42)  # type: ignore[arg-type]


def test_unknown_handler_argument_fails() -> None:
    with pytest.raises(ConfigurationError, match="promt"):
        CrashOverride().handler(promt="typo")  # type: ignore[call-arg]


NUMBER_FIELDS = (
    "timeout",
    "concurrency_wait",
    "breaker_window",
    "breaker_cooldown",
    "patch_watch",
    "followup_timeout",
)


@pytest.mark.parametrize("argument", NUMBER_FIELDS)
@pytest.mark.parametrize(
    "value",
    [float("inf"), float("-inf"), float("nan"), 10**400],
    ids=["inf", "-inf", "nan", "1e400"],
)
def test_non_finite_numbers_are_rejected(argument: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match="finite") as info:
        CrashOverride(**{argument: value})
    assert info.value.argument == argument


@pytest.mark.parametrize("argument", ["timeout", "followup_timeout"])
def test_non_finite_handler_overrides_are_rejected(argument: str) -> None:
    with pytest.raises(ConfigurationError, match="finite") as info:
        CrashOverride().handler(**{argument: float("inf")})
    assert info.value.argument == argument


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "",
        "localhost:11434/v1",
        "ftp://example.com/v1",
        "http://",
        "https:///v1",
        "http://exa mple.com/v1",
        "http://example.com:99999/v1",
        "http://[::1/v1",
    ],
)
def test_base_url_must_be_an_http_url_with_a_host(url: str) -> None:
    with pytest.raises(ConfigurationError, match="http") as info:
        CrashOverride(base_url=url)
    assert info.value.argument == "base_url"
    with pytest.raises(ConfigurationError, match="http"):
        CrashOverride().handler(base_url=url)


def test_a_rejected_base_url_does_not_echo_credentials() -> None:
    with pytest.raises(ConfigurationError) as info:
        CrashOverride(base_url="ftp://user:hunter2@example.com/v1")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "url", ["http://localhost:11434/v1", "https://api.example.com/v1", "http://[::1]:8000/v1"]
)
def test_http_urls_are_accepted(url: str) -> None:
    assert CrashOverride(base_url=url).handler().settings.base_url == url


def test_finite_boundaries_are_accepted() -> None:
    co = CrashOverride(concurrency_wait=0, breaker_cooldown=0.0, timeout=1e-3, breaker_window=10**6)
    s = co.handler().settings
    assert (s.concurrency_wait, s.breaker_cooldown, s.timeout) == (0.0, 0.0, 1e-3)
    assert type(s.breaker_window) is float
