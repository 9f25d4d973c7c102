"""The registry's tools (``_toolbox``) as Agents SDK tools for one run: approval and audit.

With an ``approve=`` callable, every snippet is shown to it first; a denial is what the model
sees. Every call is recorded (``ToolCallRecord``) and reported through ``job.on_tool``.

The SDK's ``function_tool`` derives a tool's JSON schema and argument model from a function
(pydantic model creation, docstring parsing: milliseconds per tool, on the event loop). A run's
tools differ only in the job they act on, so the schema is built once per process per tool
(``schema_of``) and each run makes cheap ``FunctionTool`` objects around it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._bridge import Dispatch
from ._namespace import AgentExit, AgentInterrupted, Workspace, describe_result, format_tool_error
from ._report import ToolCallRecord
from ._text import clip
from ._toolbox import Tool, offered

if TYPE_CHECKING:
    from ._agent import AgentJob

NOT_REQUIRED = "not required (no approve= configured)"

_schemas: dict[str, Any] = {}  # tool name -> the SDK's FuncSchema, built once per process
_schemas_lock = threading.Lock()  # recoveries on several loops/threads may build the first


def _approver_name(approve: Any) -> str:
    return str(getattr(approve, "__qualname__", None) or type(approve).__name__)


def tool_failure(_: Any, error: Exception) -> str:
    # The SDK hides tool errors from the model by default; the model needs the traceback.
    return format_tool_error(error)


def agent_tools(job: AgentJob, dispatch: Dispatch) -> list[Any]:
    """The SDK tools ``job.mode`` offers, bound to this run."""
    supplied = {getattr(tool, "__name__", ""): tool for tool in job.tools}
    run = _Run(job, dispatch)
    tools = offered(job.mode, supplied)
    return [_sdk_tool(tool, _Bound(run, tool, supplied.get(tool.name))) for tool in tools]


class _Run:
    """What the tools of one agent run share: the snippet order, approval, the audit trail."""

    def __init__(self, job: AgentJob, dispatch: Dispatch) -> None:
        self.job = job
        self.dispatch = dispatch
        self.serial = asyncio.Lock()

    async def approval(self, code: str) -> tuple[bool, str]:
        """(allowed, who/why) for one snippet; runs ``approve`` in the owner's context."""
        approve = self.job.approve
        if approve is None:
            return True, NOT_REQUIRED
        name = _approver_name(approve)
        try:
            verdict = await self.dispatch(lambda: approve(code))
        except Exception as exc:
            return False, f"denied: {name} raised {type(exc).__name__}: {exc}"
        if isinstance(verdict, str):
            return False, f"denied by {name}: {verdict}"
        return (True, f"approved by {name}") if verdict else (False, f"denied by {name}")

    async def snippet(self, tool: Tool, code: str, work: Callable[[Workspace], Any]) -> str:
        job, ws, state = self.job, self.job.workspace, self.job.state
        started = time.perf_counter()
        async with self.serial:  # one snippet at a time, in the order the model asked
            ok = False
            if tool.kind.needs_approval:
                allowed, approved_by = await self.approval(code)
            else:
                allowed, approved_by = True, "not required"
            if not allowed:
                text = f"Not run: {approved_by}. Do not retry the same code; adapt or give up."
            else:
                try:
                    value = await self.dispatch(lambda: work(ws))
                    text, ok = describe_result(value, ws.take_output()), True
                except AgentExit as exc:
                    state.aborted = str(exc)
                    if isinstance(exc, AgentInterrupted):
                        state.interrupted = exc.interrupt
                    text = f"{exc}; the recovery is over (a recovery never exits the process)."
                except Exception as exc:
                    printed = ws.take_output()
                    error = format_tool_error(exc, ws.error)
                    text = (clip(printed, 2_000) + "\n" if printed else "") + error
        text = job.redact(text)
        duration = round((time.perf_counter() - started) * 1000, 3)
        self.record(ToolCallRecord(
            tool.name, job.redact(clip(code, 4_000)), text, ok, duration, approved_by
        ))  # fmt: skip
        return text

    def give_up(self, tool: Tool, reason: str) -> str:
        message = self.job.state.give_up(reason)
        redacted = self.job.redact(clip(reason, 2_000))
        self.record(ToolCallRecord(tool.name, redacted, message, True, 0.0, "not required"))
        return message

    def record(self, record: ToolCallRecord) -> None:
        self.job.state.records.append(record)
        self.job.on_tool(record)


class _Bound:
    """One tool of one run: the ``ToolRun`` its implementation receives."""

    __slots__ = ("_run", "_supplied", "tool")

    def __init__(self, run: _Run, tool: Tool, supplied: Callable[..., Any] | None) -> None:
        self._run, self.tool, self._supplied = run, tool, supplied

    async def snippet(self, code: str, work: Callable[[Workspace], Any]) -> str:
        return await self._run.snippet(self.tool, code, work)

    def give_up(self, reason: str) -> str:
        return self._run.give_up(self.tool, reason)

    def supplied(self) -> Callable[..., Any]:
        if self._supplied is None:
            raise RuntimeError(f"{self.tool.name} is not available in this run")
        return self._supplied


# -- the SDK side ---------------------------------------------------------------------------


def schema_of(tool: Tool) -> Any:
    """The SDK's ``FuncSchema`` for ``tool`` (JSON schema + argument model), once per process."""
    schema = _schemas.get(tool.name)
    if schema is None:
        with _schemas_lock:
            schema = _schemas.get(tool.name)
            if schema is None:
                schema = _schemas[tool.name] = _build_schema(tool)
    return schema


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


def _sdk_tool(tool: Tool, bound: _Bound) -> Any:
    from agents import FunctionTool
    from agents.tool import set_function_tool_failure_error_function

    schema = schema_of(tool)

    async def invoke(ctx: Any, text: str) -> str:
        try:
            return await tool.run(bound, **_arguments(tool, schema, text))
        except Exception as exc:
            # What ``function_tool(failure_error_function=...)`` does: the model sees the error.
            return tool_failure(ctx, exc)

    made = FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=schema.params_json_schema,  # copied by FunctionTool: stays cached
        on_invoke_tool=invoke,
        strict_json_schema=True,
    )
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
