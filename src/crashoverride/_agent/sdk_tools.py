"""The registry's tools (``_agent.toolbox``) as Agents SDK tools for one run, behind the gate.

Every call goes through ``_security.gate.Gate``: ``approve=`` sees it first (a snippet as its code,
any other tool as ``name(arg=value)``), a denial is what the model sees, and every call is recorded
(``ToolCallRecord``) and reported through ``job.on_tool``.

The SDK's ``function_tool`` derives a tool's JSON schema and argument model from a function
(pydantic model creation, docstring parsing: milliseconds per tool, on the event loop). A run's
tools differ only in the job they act on, so the schema is built once per process per tool
(``schema_of``) and each run makes cheap ``FunctionTool`` objects around it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crashoverride._agent.namespace import Workspace
from crashoverride._agent.toolbox import Outcome, Tool, offered
from crashoverride._security.audit import ApprovalRequest
from crashoverride._security.gate import Gate, tool_failure
from crashoverride._security.text import clip, describe_result, format_tool_error

if TYPE_CHECKING:
    from crashoverride._agent.run import AgentJob

__all__ = ["agent_tools", "schema_of", "tool_failure"]  # tool_failure: _agent, tests

# tool name -> (the SDK's FuncSchema, a FunctionTool template), built once per process: the
# SDK's FunctionTool makes its schema strict on construction (a deep walk, ~0.3 ms a tool), so
# each recovery's tools reuse the template's strict schema.
_built: dict[str, tuple[Any, Any]] = {}
_built_lock = threading.Lock()  # recoveries on several loops/threads may build the first


def agent_tools(job: AgentJob, gate: Gate) -> list[Any]:
    """The SDK tools ``job.mode`` offers, bound to this run's gate."""
    supplied = {getattr(tool, "__name__", ""): tool for tool in job.tools}
    tools = offered(job.mode, supplied)
    return [
        _sdk_tool(tool, gate, _Bound(job, gate, tool, supplied.get(tool.name))) for tool in tools
    ]


class _Bound:
    """One tool of one run: the ``ToolRun`` its implementation receives."""

    __slots__ = ("_gate", "_job", "_supplied", "tool")

    def __init__(
        self, job: AgentJob, gate: Gate, tool: Tool, supplied: Callable[..., Any] | None
    ) -> None:
        self._job, self._gate, self.tool, self._supplied = job, gate, tool, supplied

    async def snippet(self, work: Callable[[Workspace], Any]) -> Outcome:
        job = self._job
        ws, state = job.workspace, job.state
        try:
            value = await self._gate.dispatch(lambda: work(ws))
            return describe_result(value, ws.take_output()), True
        except Exception as exc:
            ended = state.ended_by(exc)
            if ended is not None:
                return ended, False
            printed = ws.take_output()
            error = format_tool_error(exc, ws.error)
            return (clip(printed, 2_000) + "\n" if printed else "") + error, False

    def give_up(self, reason: str) -> str:
        return self._job.state.give_up(reason)

    def supplied(self) -> Callable[..., Any]:
        if self._supplied is None:
            raise RuntimeError(f"{self.tool.name} is not available in this run")
        return self._supplied


def _call(tool: Tool, arguments: dict[str, Any]) -> ApprovalRequest:
    if tool.kind.runs_code:
        (code,) = arguments.values()  # the registry's code tools take exactly one argument
        return ApprovalRequest(str(code), tool=tool.name, arguments=arguments, is_code=True)
    return ApprovalRequest.of(tool.name, arguments)


# -- the SDK side ---------------------------------------------------------------------------


def schema_of(tool: Tool) -> Any:
    """The SDK's ``FuncSchema`` for ``tool`` (JSON schema + argument model), once per process."""
    return _built_for(tool)[0]


def _built_for(tool: Tool) -> tuple[Any, Any]:
    built = _built.get(tool.name)
    if built is None:
        with _built_lock:
            built = _built.get(tool.name)
            if built is None:
                schema = _build_schema(tool)
                built = _built[tool.name] = (schema, _template(tool, schema))
    return built


def _template(tool: Tool, schema: Any) -> Any:
    from agents import FunctionTool

    async def unbound(ctx: Any, text: str) -> Any:
        raise RuntimeError(f"the {tool.name} template is never run: recoveries make their own")

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=schema.params_json_schema,  # copied by FunctionTool: stays cached
        on_invoke_tool=unbound,
        strict_json_schema=True,
    )


def _build_schema(tool: Tool) -> Any:
    from agents.function_schema import function_schema

    # The SDK reads a signature and a docstring; give it the registry's, so the schema the
    # model sees is the one ``function_tool`` would make (strict, with per-argument text).
    def stand_in(*args: Any, **kwargs: Any) -> str:
        raise NotImplementedError  # never called: only its signature and docstring are read

    stand_in.__name__ = stand_in.__qualname__ = tool.name
    stand_in.__doc__ = "\n".join(
        [f"{tool.name}.", "", "Args:"] + [f"    {p.name}: {p.description}" for p in tool.params]
    )
    stand_in.__annotations__ = {p.name: p.type for p in tool.params} | {"return": str}
    setattr(stand_in, "__signature__", tool.signature)  # noqa: B010 (mypy: not a known attr)
    return function_schema(
        stand_in,
        docstring_style="google",
        description_override=tool.description,
        strict_json_schema=True,
    )


def _sdk_tool(tool: Tool, gate: Gate, bound: _Bound) -> Any:
    schema, template = _built_for(tool)

    async def invoke(ctx: Any, text: str) -> Any:
        try:
            arguments = _arguments(tool, schema, text)
        except Exception as exc:
            # Malformed arguments never reach the tool (nor the gate): the model sees why.
            return tool_failure(ctx, exc)

        async def execute() -> Outcome:
            try:
                return await tool.run(bound, **arguments)
            except Exception as exc:
                # What ``function_tool(failure_error_function=...)`` does: the model sees it.
                return tool_failure(ctx, exc), False

        # Code tools' results echo the process's data (values, pages, messages): fenced.
        return await gate.call(_call(tool, arguments), execute, data=tool.kind.runs_code)

    from agents import FunctionTool
    from agents.tool import set_function_tool_failure_error_function

    # Built with the template's schema, already strict: constructing with strict=False skips
    # the SDK's walk of it (``copy.copy`` would not: FunctionTool's ``__copy__`` re-runs it).
    made = FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=template.params_json_schema,  # shared: nothing mutates it
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
    made.strict_json_schema = True  # what the model is told: the schema is strict
    # Failures the SDK produces itself (e.g. a tool call cancelled mid-turn) use it too.
    return set_function_tool_failure_error_function(made, tool_failure)


def _arguments(tool: Tool, schema: Any, text: str) -> dict[str, Any]:
    """The validated arguments of one call; errors worded as ``function_tool``'s are."""
    from agents.exceptions import ModelBehaviorError
    from pydantic import ValidationError

    invalid = f"Invalid JSON input for tool {tool.name}"
    try:
        data = json.loads(text) if text else {}
    except ValueError as exc:
        raise ModelBehaviorError(f"{invalid}: {text}") from exc
    if not isinstance(data, dict):
        raise ModelBehaviorError(f"{invalid}: expected a JSON object")
    try:
        parsed = schema.params_pydantic_model(**data)
    except ValidationError as exc:
        raise ModelBehaviorError(f"{invalid}: {exc}") from exc
    return {param.name: getattr(parsed, param.name) for param in tool.params}
