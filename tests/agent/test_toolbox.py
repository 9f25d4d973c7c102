"""One definition per agent tool: the registry, the SDK tools, the prompt, the steps and the
namespace must agree, and a tool's schema is built once per process, not once per recovery."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import pytest

from crashoverride import CrashOverride, testing
from crashoverride._agent import run, sdk_tools, toolbox
from crashoverride._agent.prompt import CALL_BRIEF, build_instructions
from crashoverride._config.settings import Settings
from crashoverride._core.deferred import Followups
from crashoverride._diagnose.readonly import SAFE_FUNCTIONS
from crashoverride.testing import done, script, tool_outputs

MODES = ("repair", "diagnose")
EMPTY = inspect.Parameter.empty


async def _no_run(*_: object) -> None:
    raise AssertionError("no follow-up runs in this test")


def _flat(text: str) -> str:
    # The prompt wraps its items; compare words, not line breaks.
    return re.sub(r"\s+", " ", text)


def _spawn_callable() -> Any:
    (spawn,) = Followups(Settings.for_app(), "rec_test", str, _no_run).tools()
    return spawn


class _Job:
    """Just what ``agent_tools`` reads to build a run's tools."""

    def __init__(self, mode: str, tools: tuple[Any, ...] = ()) -> None:
        self.mode, self.tools = mode, tools
        self.workspace = self.state = self.approve = None


def _sdk_tools(mode: str, *, with_followups: bool = True) -> dict[str, Any]:
    tools = (_spawn_callable(),) if with_followups and mode == "repair" else ()
    built = sdk_tools.agent_tools(_Job(mode, tools), None)  # type: ignore[arg-type]
    return {tool.name: tool for tool in built}


# -- every tool is defined once and appears everywhere it must --------------------------------


def test_the_registry_covers_the_sdk_tools_of_both_modes() -> None:
    assert [t.name for t in toolbox.TOOLS] == [
        "eval_python", "exec_python", "inspect_python", "give_up", "spawn_followup",
    ]  # fmt: skip
    assert list(_sdk_tools("repair")) == ["eval_python", "exec_python", "give_up", "spawn_followup"]
    assert list(_sdk_tools("diagnose")) == ["inspect_python", "give_up"]
    # A follow-up's own run (mode repair, no follow-up session) gets no spawn_followup.
    assert "spawn_followup" not in _sdk_tools("repair", with_followups=False)


@pytest.mark.parametrize("mode", MODES)
def test_each_sdk_tool_is_made_from_its_definition(mode: str) -> None:
    for name, sdk in _sdk_tools(mode).items():
        tool = toolbox.BY_NAME[name]
        assert mode in tool.modes
        assert sdk.description == tool.description
        assert sdk.strict_json_schema is True
        schema = sdk.params_json_schema
        names = [param.name for param in tool.params]
        assert list(schema["properties"]) == names
        assert schema["required"] == names  # strict: every argument, defaults included
        assert schema["additionalProperties"] is False
        for param in tool.params:
            assert schema["properties"][param.name]["description"] == param.description


@pytest.mark.parametrize("mode", MODES)
def test_the_prompt_lists_exactly_the_tools_of_its_mode(mode: str) -> None:
    prompt = _flat(build_instructions(None, "", "", mode=mode))
    listed = re.findall(r"- (\w+)\([^)]*\): ", prompt)
    tools = [tool.name for tool in toolbox.TOOLS if mode in tool.modes]
    assert [name for name in listed if name in toolbox.BY_NAME] == tools
    for name in tools:
        tool = toolbox.BY_NAME[name]
        assert f"- {tool.call_text}: {_flat(tool.description)}" in prompt


def test_every_tool_has_a_step_builder_with_its_argument_names() -> None:
    for tool in toolbox.TOOLS:
        builder = getattr(testing, tool.name)
        params = inspect.signature(builder).parameters
        assert "call_id" in params and params["call_id"].kind is inspect.Parameter.KEYWORD_ONLY
        positional = [p for p in params.values() if p.name != "call_id"]
        assert [p.name for p in positional] == [p.name for p in tool.params]
        assert [p.default for p in positional] == [p.default for p in tool.params]
        step = builder(*(f"value of {p.name}" for p in tool.params if p.default is EMPTY))
        assert step.name == tool.name
        schema = sdk_tools.schema_of(tool).params_json_schema
        assert list(json.loads(step.arguments)) == list(schema["properties"])


def test_the_job_supplied_spawn_followup_has_the_registered_signature() -> None:
    tool = toolbox.BY_NAME["spawn_followup"]
    params = inspect.signature(_spawn_callable()).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == [
        (p.name, p.kind, p.default) for p in tool.signature.parameters.values()
    ]
    # The registry makes its SDK tool; the job's wrapper must not offer it a second time.
    job = _Job("repair", (_spawn_callable(),))
    assert run._job_tools(job) == []  # type: ignore[arg-type]


# -- the namespace helpers --------------------------------------------------------------------


@pytest.mark.parametrize("persistence", [None, "write", "patch"])
def test_the_prompt_describes_the_helpers_of_its_mode(persistence: str | None) -> None:
    for mode in MODES:
        prompt = _flat(build_instructions(None, "", "", mode=mode, persistence=persistence))
        for helper in toolbox.HELPERS:
            item = f"- {helper.call_text}: {_flat(helper.description)}"
            shown = mode in helper.modes and (
                helper.when == "always" or (helper.when == "persist" and persistence is not None)
            )
            assert (item in prompt) is shown, (mode, helper.name)


def test_the_call_brief_describes_set_result_and_rerun() -> None:
    brief = _flat(CALL_BRIEF)
    returns = [helper for helper in toolbox.HELPERS if helper.when == "returns"]
    assert {helper.name for helper in returns} == {"set_result", "rerun"}
    for helper in returns:
        assert f"- {helper.call_text}: {_flat(helper.description)}" in brief


def test_diagnose_code_may_call_every_function_its_prompt_offers() -> None:
    for helper in toolbox.HELPERS:
        if "diagnose" in helper.modes and helper.params is not None:
            assert helper.name in SAFE_FUNCTIONS
    named = re.search(r"\((len, .*?)\)", toolbox.BY_NAME["inspect_python"].description)
    assert named is not None
    assert {name.split(" ")[0] for name in named.group(1).split(", ")} <= SAFE_FUNCTIONS


# Agent code that collects every name its namespace resolves, except the block's locals.
_COLLECT = """\
_found = {}
for _name in set(dir()) - set(caller):
    _found[_name] = eval(_name)
"""


def _documented(when: set[str]) -> set[str]:
    helpers = {h.name for h in toolbox.HELPERS if "repair" in h.modes and h.when in when}
    return helpers | {t.name for t in toolbox.TOOLS if "repair" in t.in_namespace}


def test_a_with_block_namespace_holds_exactly_the_documented_names() -> None:
    co = CrashOverride(model=script(testing.exec_python(_COLLECT + "caller['found'] = _found"),
                                    done()))  # fmt: skip
    found: dict[str, Any] = {}
    with co.handler():
        local_value = 1
        raise KeyError("boom")
    names = {name for name in found if not name.startswith("_")}
    # ``print`` is the namespace's own (captures output); everything else must be documented.
    assert names - {"print"} == _documented({"always", "persist"})
    assert local_value == 1


def test_a_call_namespace_adds_set_result_and_rerun() -> None:
    co = CrashOverride(model=script(testing.exec_python(_COLLECT + "set_result(_found)"), done()))

    @co.handler()
    def charge(amount: int) -> Any:
        raise ValueError(amount)

    names = {name for name in charge(5) if not name.startswith("_")}
    block = {"args", "kwargs", "function"}  # the call's own, described by its brief
    assert names - block - {"print"} == _documented({"always", "persist", "returns"})


# -- tool errors reach the model as traceback text ---------------------------------------------


def test_tool_errors_reach_the_model_as_text() -> None:
    model = script(
        testing.tool_call("give_up", {"why": "wrong argument name"}),
        testing.exec_python("x = "),
        testing.spawn_followup("   "),
        testing.give_up("cannot"),
    )
    co = CrashOverride(model=model)
    handler = co.handler()
    with pytest.raises(KeyError), handler:
        raise KeyError("boom")
    missing, syntax, empty = tool_outputs(model)  # give_up ends the run: no turn sees its text
    assert missing.startswith("Traceback") and "Invalid JSON input for tool give_up" in missing
    assert "reason" in missing and "Field required" in missing
    assert "SyntaxError" in syntax
    assert "ValueError: spawn_followup() needs a non-empty objective string" in empty
    assert handler.report is not None
    # Malformed arguments never reach a tool; every call that did is audited, failed ones too.
    trail = [(c.tool, c.ok) for c in handler.report.tool_calls]
    assert trail == [("exec_python", False), ("spawn_followup", False), ("give_up", True)]


def test_the_sdk_keeps_the_traceback_formatter_for_failures_it_makes_itself() -> None:
    from agents.tool import resolve_function_tool_failure_error_function

    for sdk in _sdk_tools("repair").values():
        assert resolve_function_tool_failure_error_function(sdk, None) is sdk_tools.tool_failure


# -- performance: a schema per tool per process, not per recovery -------------------------------


def test_many_recoveries_build_each_schema_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import agents.function_schema
    import agents.tool

    built: list[str] = []
    real = agents.function_schema.function_schema

    def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(func.__name__)
        return real(func, *args, **kwargs)

    # ``function_tool`` (application tools) calls the name it imported into ``agents.tool``.
    monkeypatch.setattr(agents.function_schema, "function_schema", counting)
    monkeypatch.setattr(agents.tool, "function_schema", counting)
    monkeypatch.setattr(sdk_tools, "_built", {})  # as in a fresh process

    def lookup_rate(currency: str) -> float:
        """The exchange rate of ``currency``."""
        return 0.92

    recoveries = 6
    steps = [(testing.exec_python(f"set_result({n})"), done()) for n in range(recoveries)]
    co = CrashOverride(model=script(*(step for pair in steps for step in pair)),
                       tools=[lookup_rate], single_flight=False)  # fmt: skip

    @co.handler()
    def convert(n: int) -> int:
        raise KeyError(n)

    assert [convert(n) for n in range(recoveries)] == list(range(recoveries))
    tools = ["eval_python", "exec_python", "give_up", "spawn_followup"]
    assert sorted(built) == sorted([*tools, "lookup_rate"])


def test_built_in_tools_are_made_strict_once_not_per_recovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK's FunctionTool makes its schema strict when constructed (a deep walk of it); a
    # burst of recoveries must not pay that for every tool of every run.
    import agents.tool

    walked: list[int] = []
    real = agents.tool.ensure_strict_json_schema

    def counting(schema: Any) -> Any:
        walked.append(1)
        return real(schema)

    monkeypatch.setattr(agents.tool, "ensure_strict_json_schema", counting)
    monkeypatch.setattr(sdk_tools, "_built", {})  # as in a fresh process
    recoveries = 4
    steps = [(testing.exec_python(f"set_result({n})"), done()) for n in range(recoveries)]
    co = CrashOverride(model=script(*(step for pair in steps for step in pair)),
                       single_flight=False)  # fmt: skip

    @co.handler()
    def convert(n: int) -> int:
        raise KeyError(n)

    assert convert(0) == 0
    after_first = len(walked)
    assert [convert(n) for n in range(1, recoveries)] == list(range(1, recoveries))
    assert after_first > 0 and len(walked) == after_first
