"""Step helpers: the ScriptedModel steps they produce, and real recoveries driven by them."""

from __future__ import annotations

import json
import sys

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import (
    Message,
    Script,
    ToolCall,
    done,
    eval_python,
    exec_python,
    give_up,
    http_error,
    output_items,
    script,
    tool_call,
    tool_outputs,
)


def test_helpers_speak_the_tool_contract() -> None:
    assert exec_python("x = 1") == ToolCall("exec_python", '{"statements": "x = 1"}')
    assert eval_python("x") == ToolCall("eval_python", '{"expression": "x"}')
    assert give_up("no source") == ToolCall("give_up", '{"reason": "no source"}')
    assert done("fixed") == Message("fixed")
    assert tool_call("audit", {"id": 3}, call_id="c9") == ToolCall("audit", '{"id": 3}', "c9")
    assert tool_call("audit", "{broken").arguments == "{broken"


def test_script_assigns_unique_call_ids_across_runs() -> None:
    plan = Script(exec_python("a"), [eval_python("b"), eval_python("c")], done()).run(
        exec_python("d", call_id="mine"), give_up("no")
    )
    turns = plan.turns()
    ids = [item.call_id for turn in turns for item in turn.items if isinstance(item, ToolCall)]
    assert ids == ["call_1", "call_2", "call_3", "mine", "call_5"]
    assert [turn.run for turn in turns] == [0, 0, 0, 1, 1]
    assert plan.runs == 2
    assert plan.turns() == turns  # deterministic


def test_script_builds_the_sdk_steps() -> None:
    from agents.testing import ScriptedModel
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

    model = script(exec_python("caller['x'] = 1"), [eval_python("x"), done("ok")], done("end"))
    assert isinstance(model, ScriptedModel)
    assert model.remaining_steps == 3
    first = model._steps[0].output
    assert len(first) == 1 and isinstance(first[0], ResponseFunctionToolCall)
    assert (first[0].name, first[0].call_id) == ("exec_python", "call_1")
    assert json.loads(first[0].arguments) == {"statements": "caller['x'] = 1"}
    second = model._steps[1].output
    assert [type(item) for item in second] == [ResponseFunctionToolCall, ResponseOutputMessage]
    assert second[1].content[0].text == "ok"


def test_output_items_are_one_turn_for_the_sdks_own_model_steps() -> None:
    from agents.testing import ModelStep
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

    first, second = output_items([eval_python("x"), done("ok")]), output_items(eval_python("y"))
    assert [type(item) for item in first] == [ResponseFunctionToolCall, ResponseOutputMessage]
    assert first[0].name == "eval_python" and first[1].content[0].text == "ok"
    ids = {first[0].call_id, second[0].call_id}
    assert len(ids) == 2 and not ids & {"call_1", "call_2"}  # never a Script's ids
    assert output_items(exec_python("z", call_id="mine"))[0].call_id == "mine"
    with pytest.raises(TypeError, match="need the wire"):
        output_items(http_error(500))  # type: ignore[arg-type]

    # A turn reporting its token usage; the others as a Script would play them.
    model = script()
    usage = Usage(requests=1, input_tokens=50)
    model.enqueue(ModelStep(output=output_items(eval_python("'x' in caller")), usage=usage))
    model.extend(output_items(step) for step in (exec_python("caller['x'] = 1"), done("set x")))
    handler = CrashOverride(model=model).handler("Leave `x` set.")
    with handler:
        x = 1 // 0
    assert x == 1 and handler.report is not None and handler.report.usage.input_tokens == 50
    assert tool_outputs(model) == ["False", "OK (no output, no value)"]


def test_bad_steps_are_refused() -> None:
    with pytest.raises(TypeError, match="a step is"):
        Script("exec_python('x')")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a step is"):
        Script([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"faults \(status\) need the wire"):
        script(http_error(500))
    with pytest.raises(ValueError, match="at least one step"):
        Script().run()


def test_scripted_recovery_recovers() -> None:
    model = script(
        eval_python("payload"),
        exec_python("caller['article'] = payload['body']"),
        done("read the renamed field"),
    )
    co = CrashOverride(model=model)
    handler = co.handler("Leave `article` holding the text.")
    payload = {"body": "hello"}
    with handler:
        article = payload["article_text"]
    assert article == "hello"
    report = handler.report
    assert report is not None and report.recovered
    assert report.diagnosis == "read the renamed field"
    assert [call.tool for call in report.tool_calls] == ["eval_python", "exec_python"]
    assert "'body': 'hello'" in report.tool_calls[0].result
    assert model.remaining_steps == 0


def test_scripted_give_up_reraises_the_original() -> None:
    co = CrashOverride(model=script(give_up("the source has no article")))
    handler = co.handler()
    with pytest.raises(KeyError) as info, handler:
        {}["article_text"]
    assert any("the source has no article" in note for note in info.value.__notes__)
    assert handler.report is not None and handler.report.outcome == "failed"


def test_one_script_serves_several_recoveries() -> None:
    plan = Script(exec_python("caller['n'] = 1"), done("first")).run(give_up("second fails"))
    co = CrashOverride(model=plan.model(), breaker_threshold=5)
    handler = co.handler()
    with handler:
        n = int("x")
    assert n == 1 and handler.report is not None and handler.report.diagnosis == "first"
    with pytest.raises(ValueError), handler:
        int("y")
    assert handler.report is not None and handler.report.diagnosis == "second fails"


@pytest.mark.anyio
async def test_scripted_recovery_in_async_code() -> None:
    co = CrashOverride(model=script(exec_python("caller['value'] = await make()"), done("ok")))

    async def make() -> int:
        return 7

    handler = co.handler()
    async with handler:
        value = 1 // 0
    assert value == 7 and make is not None
    assert handler.report is not None and handler.report.recovered


@pytest.mark.slow
def test_importing_the_kit_does_not_import_the_sdk() -> None:
    import subprocess

    code = (
        "import sys, crashoverride.testing, crashoverride.testing.plugin;"
        "print('agents' in sys.modules, 'openai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
