"""The decorator form: the agent sets the return value or has the call re-run once."""

from __future__ import annotations

from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, script


def test_sync_function_result_set_by_the_agent() -> None:
    co = CrashOverride(model=script(exec_python("set_result(args[0] * 2)"), done()))

    @co.handler(prompt="Return twice the input.")
    def double(x: int) -> int:
        raise NotImplementedError

    assert double(21) == 42
    assert double.__name__ == "double"


def test_rerun_after_repairing_the_code() -> None:
    model = script(
        exec_python(
            "def parse(text):\n    return int(text.strip())\nglobals()['parse'] = parse\nrerun()"
        ),
        done("patched parse"),
    )
    co = CrashOverride(model=model)
    calls: list[str] = []

    @co.handler()
    def load(text: str) -> int:
        calls.append(text)
        return parse(text)

    assert load(" 7 ") == 7
    assert calls == [" 7 ", " 7 "]  # the failed call, then exactly one re-run
    assert load("8") == 8  # later calls use the patched code without a recovery
    assert model.remaining_steps == 0


def parse(text: str) -> int:
    raise NotImplementedError("parse")


def test_rerun_that_fails_again_reraises_the_original() -> None:
    co = CrashOverride(model=script(exec_python("rerun()"), done()))

    @co.handler()
    def always_fails() -> None:
        raise ValueError("still broken")

    with pytest.raises(ValueError, match="still broken") as info:
        always_fails()
    assert any("re-run after repair raised ValueError" in n for n in info.value.__notes__)


def test_finishing_without_a_result_is_not_a_recovery() -> None:
    co = CrashOverride(model=script(done("I looked around")))

    @co.handler()
    def broken() -> int:
        raise ValueError("x")

    with pytest.raises(ValueError) as info:
        broken()
    assert any("without set_result() or rerun()" in n for n in info.value.__notes__)


def test_decorator_postcondition_sees_the_result() -> None:
    co = CrashOverride(model=script(exec_python("set_result(-1)"), done()))

    @co.handler(postcondition=lambda view: view["result"] >= 0)
    def count() -> int:
        raise ValueError

    with pytest.raises(ValueError) as info:
        count()
    assert any("postcondition does not hold" in n for n in info.value.__notes__)


def test_the_agent_sees_the_call_arguments_and_the_failed_frame_locals() -> None:
    co = CrashOverride(
        model=script(exec_python("set_result((args, kwargs, caller['step']))"), done())
    )

    @co.handler()
    def work(a: int, *, b: str) -> Any:
        step = "parsing"
        raise ValueError(step)

    assert work(1, b="x") == ((1,), {"b": "x"}, "parsing")


@pytest.mark.anyio
async def test_async_function_result_and_rerun(anyio_backend: str) -> None:
    model = script(exec_python("set_result(await helper())"), done())
    co = CrashOverride(model=model)

    @co.handler()
    async def fetch() -> str:
        raise ConnectionError("flaky")

    assert await fetch() == "fetched"


async def helper() -> str:
    return "fetched"


@pytest.mark.anyio
async def test_async_give_up_reraises(anyio_backend: str) -> None:
    co = CrashOverride(model=script(give_up("no data")))

    @co.handler()
    async def fetch() -> str:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError) as info:
        await fetch()
    assert any("gave up: no data" in n for n in info.value.__notes__)


def test_generator_functions_are_refused_at_decoration_time() -> None:
    from crashoverride import ConfigurationError

    co = CrashOverride(model="m", api_key="k")

    def numbers() -> Any:
        yield 1

    async def stream() -> Any:
        yield 1

    for func, kind in ((numbers, "is a generator function"), (stream, "is an async generator")):
        with pytest.raises(ConfigurationError, match=kind) as info:
            co.handler()(func)
        # Says what to do instead, in the form that fits.
        assert ("`async with co.handler(...)`" in str(info.value)) is (func is stream)
