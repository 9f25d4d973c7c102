"""``caller`` writes through to the protected frame on 3.11, 3.12 and 3.13."""

from __future__ import annotations

import sys

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script


def _co(statements: str) -> CrashOverride:
    return CrashOverride(model=script(exec_python(statements), done()))


def test_write_through_to_a_bound_local() -> None:
    co = _co("caller['value'] = caller['value'] + 1")
    value = 41
    with co.handler():
        raise ValueError
    assert value == 42


def test_write_through_to_a_name_the_block_never_bound() -> None:
    co = _co("caller['article'] = 'from recovery'")
    with co.handler():
        raise ValueError
        article = "never reached"  # makes `article` a local of this function
    assert article == "from recovery"


def test_write_through_to_a_cell_variable() -> None:
    co = _co("caller['total'] = 10")
    total = 0

    def read() -> int:
        return total

    with co.handler():
        raise ValueError
    assert total == 10
    assert read() == 10  # the closure sees the new value too


def test_write_through_in_a_nested_function() -> None:
    def inner() -> str:
        co = _co("caller['status'] = 'fixed'")
        status = "broken"
        with co.handler():
            raise ValueError
        return status

    assert inner() == "fixed"


@pytest.mark.anyio
async def test_write_through_in_a_coroutine_frame(anyio_backend: str) -> None:
    co = _co("caller['payload'] = {'ok': True}")
    payload: dict[str, bool] = {}
    async with co.handler():
        raise ValueError
    assert payload == {"ok": True}


def test_write_through_at_module_level(tmp_path: pytest.TempPathFactory) -> None:
    import runpy

    script = tmp_path / "script.py"  # type: ignore[operator]
    script.write_text(
        "from crashoverride import CrashOverride\n"
        "from crashoverride.testing import done, exec_python, script\n"
        "co = CrashOverride(model=script(exec_python(\"caller['answer'] = 42\"), done()))\n"
        "with co.handler():\n"
        "    raise ValueError\n"
    )
    namespace = runpy.run_path(str(script))
    assert namespace["answer"] == 42


def test_reading_names_resolves_scratch_then_locals_then_globals_then_builtins() -> None:
    co = _co(
        "seen = (local_only, GLOBAL_NAME, len)\n"
        "local_only = 'scratch wins'\n"
        "caller['result'] = (seen, local_only)"
    )
    local_only = "local"
    result: object = None
    with co.handler():
        raise ValueError
    assert result == (("local", "global", len), "scratch wins")
    assert local_only == "local"  # plain assignment in tool code stays tool-local


GLOBAL_NAME = "global"


def test_caller_snapshot_reflects_changes_before_the_failure() -> None:
    co = _co("caller['seen'] = counter")
    counter = 0
    seen = None
    with co.handler():
        counter = 5
        raise ValueError
    assert (seen, counter) == (5, 5)


def test_interpreter_support_is_what_the_docs_say() -> None:
    from crashoverride._placement import frames

    assert frames._NATIVE_PROXY is (sys.version_info >= (3, 13))


def test_patching_a_function_reaches_later_calls() -> None:
    co = _co(
        "def normalize(text):\n    return text.strip().lower()\n"
        "globals()['normalize'] = normalize\n"
        "caller['out'] = normalize(raw)"
    )
    raw = "  Hello "
    out = None
    with co.handler():
        out = normalize(raw)
    assert out == "hello"
    assert normalize(" X ") == "x"


def normalize(text: str) -> str:
    raise NotImplementedError("normalize is not written yet")


def test_functions_defined_by_the_agent_can_use_modules_it_imported() -> None:
    co = _co(
        "import math\n"
        "def area(r):\n    return round(math.pi * r * r, 2)\n"
        "globals()['area'] = area\n"
        "caller['result'] = area(1)"
    )
    result = None
    try:
        with co.handler():
            raise ValueError
        assert result == 3.14
        assert area(2) == 12.57
    finally:
        globals().pop("area", None)
        globals().pop("math", None)


def area(r: float) -> float:
    raise NotImplementedError
