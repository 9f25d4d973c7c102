"""Outcome rules of a recovery: suppress, re-raise the original (with a note), raise instead."""

from __future__ import annotations

import asyncio
import sys
import traceback
from typing import Any

import pytest
from agents.testing import ModelStep
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride.testing import done, eval_python, exec_python, give_up, script, tool_outputs


def fail() -> None:
    raise KeyError("article_text")


def test_recovered_block_continues_after_it() -> None:
    model = script(exec_python("caller['article'] = 'recovered'"), done("set article"))
    co = CrashOverride(model=model)
    article = None
    handler = co.handler(prompt="Leave `article` set.")
    with handler:
        fail()
        article = "unreachable"
    assert article == "recovered"
    report = handler.report
    assert report is not None and report.outcome == "recovered"
    assert report.diagnosis == "set article"
    assert [c.code for c in report.tool_calls] == ["caller['article'] = 'recovered'"]
    assert report.exc_type == "builtins.KeyError"


def test_give_up_reraises_the_original_object_with_traceback_and_note() -> None:
    co = CrashOverride(model=script(give_up("the source is gone")))
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    exc = info.value
    frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
    assert frames[-1] == "fail"  # the original traceback, down to the raising function
    assert any("gave up: the source is gone" in note for note in exc.__notes__)
    assert exc.__cause__ is None


def test_original_exception_identity_is_preserved() -> None:
    co = CrashOverride(model=script(give_up("no")))
    original = ValueError("mine")
    with pytest.raises(ValueError) as info, co.handler():
        raise original
    assert info.value is original


def test_replacement_exception_chains_the_original() -> None:
    model = script(exec_python("raise_instead(RuntimeError('upstream is down'))"))
    co = CrashOverride(model=model)
    with pytest.raises(RuntimeError, match="upstream is down") as info, co.handler():
        fail()
    assert isinstance(info.value.__cause__, KeyError)


def test_postcondition_false_reraises() -> None:
    model = script(exec_python("pass"), done())
    co = CrashOverride(model=model)
    with pytest.raises(KeyError) as info:
        with co.handler(postcondition=lambda local: local.get("article") is not None):
            article = None
            fail()
    assert article is None
    assert any("postcondition does not hold" in n for n in info.value.__notes__)


def test_postcondition_true_suppresses() -> None:
    model = script(exec_python("caller['article'] = 'x'"), done())
    co = CrashOverride(model=model)
    article = None
    with co.handler(postcondition=lambda local: local["article"] == "x"):
        fail()
    assert article == "x"


def test_max_turns_reraises() -> None:
    model = script(eval_python("1"), eval_python("2"), eval_python("3"), done())
    co = CrashOverride(model=model, max_turns=2)
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("max_turns (2) exceeded" in n for n in info.value.__notes__)


def test_model_error_reraises() -> None:
    model = script()
    model.enqueue(RuntimeError("model exploded"))
    co = CrashOverride(model=model)
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("model exploded" in n for n in info.value.__notes__)


def test_exhausted_script_reraises() -> None:
    co = CrashOverride(model=script(eval_python("1")))
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("no scripted steps remain" in n for n in info.value.__notes__)


def test_timeout_while_model_hangs() -> None:
    async def hang(_: Any) -> Any:
        await asyncio.sleep(3600)

    model = script()
    model.enqueue(ModelStep.respond(hang))
    co = CrashOverride(model=model, timeout=0.3)
    with capture_logs() as logs, pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("timed out after 0.3s" in n for n in info.value.__notes__)
    assert [e["event"] for e in logs if e["event"].startswith("recovery.")][-1] == (
        "recovery.failed"
    )


def test_missing_credentials_reraise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    co = CrashOverride(model="gpt-test")
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("no API key" in n for n in info.value.__notes__)


def test_unreachable_endpoint_reraises() -> None:
    # Port 9 (discard) on loopback is closed here: the connection is refused at once.
    co = CrashOverride(model="m", base_url="http://127.0.0.1:9/v1", api_key="k", timeout=20)
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("Connection" in n or "connect" in n for n in info.value.__notes__)


def test_tool_errors_reach_the_model_as_tracebacks() -> None:
    model = script(exec_python("1 / 0"), give_up("cannot"))
    co = CrashOverride(model=model)
    with pytest.raises(KeyError), co.handler():
        fail()
    (output,) = tool_outputs(model)
    assert "ZeroDivisionError: division by zero" in output
    assert "<crashoverride-" in output  # the agent's own code, with its line
    assert "_placement/bridge.py" not in output  # our plumbing is not shown
    assert "During handling" not in output  # the original, already in the prompt, not repeated


def test_agent_sys_exit_ends_the_recovery_not_the_process() -> None:
    model = script(exec_python("import sys; sys.exit(3)"), done())
    co = CrashOverride(model=model)
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("sys.exit(3)" in n for n in info.value.__notes__)
    assert model.remaining_steps == 1  # the run stopped at the exit


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_control_flow_is_never_caught(exc_type: type[BaseException]) -> None:
    model = script(done())
    co = CrashOverride(model=model)
    with pytest.raises(exc_type), co.handler():
        raise exc_type()
    assert model.calls == ()


def test_non_matching_exception_passes_untouched() -> None:
    model = script(done())
    co = CrashOverride(model=model, catch=ValueError)
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert not getattr(info.value, "__notes__", None)
    assert model.calls == ()


def test_handler_catch_overrides_app_catch() -> None:
    model = script(exec_python("caller['fixed'] = True"), done())
    co = CrashOverride(model=model, catch=ValueError)
    with co.handler(catch=KeyError):
        fail()
    assert len(model.calls) == 2


def test_internal_failure_never_replaces_the_users_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashoverride._core import recovery

    def broken(self: Any) -> Any:
        raise RuntimeError("bug in crashoverride")

    monkeypatch.setattr(recovery.Recovery, "prepare", broken)
    co = CrashOverride(model=script(done()))
    with pytest.raises(KeyError) as info, co.handler():
        fail()
    assert any("internal error" in n and "bug in crashoverride" in n for n in info.value.__notes__)


def test_broken_logging_never_replaces_the_users_exception() -> None:
    import structlog

    def explode(*_: Any) -> Any:
        raise RuntimeError("log pipeline down")

    structlog.configure(processors=[explode])
    try:
        co = CrashOverride(model=script(give_up("no")))
        with pytest.raises(KeyError) as info, co.handler():
            fail()
        assert any("gave up" in n for n in info.value.__notes__)
    finally:
        structlog.reset_defaults()


def test_on_recovery_callback_gets_the_report_and_its_errors_are_contained() -> None:
    seen: list[Any] = []

    def callback(report: Any) -> None:
        seen.append(report)
        raise RuntimeError("callback bug")

    co = CrashOverride(model=script(give_up("no")), on_recovery=callback)
    with pytest.raises(KeyError), co.handler():
        fail()
    assert [r.outcome for r in seen] == ["failed"]


@pytest.mark.slow
def test_sdk_not_installed_reraises(tmp_path: Any) -> None:
    import subprocess

    code = (
        "import sys\n"
        "sys.modules['agents'] = None\n"  # makes `import agents` raise ImportError
        "from crashoverride import CrashOverride\n"
        "co = CrashOverride(model='m', api_key='k')\n"
        "try:\n"
        "    with co.handler():\n"
        "        raise KeyError('x')\n"
        "except KeyError as e:\n"
        "    print('|'.join(e.__notes__))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Agents SDK is not importable" in out.stdout
