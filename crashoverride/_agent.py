"""One Agents SDK run: build the agent and its tools, run it under the deadline, classify the end.

This is the only module that imports ``agents`` / ``openai``, and only when a recovery starts.
It runs on whichever asyncio loop the bridge chose; tool code goes back through ``dispatch``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._bridge import Dispatch, Job
from ._report import ToolCallRecord, Usage
from ._settings import Settings
from ._state import RunState
from ._text import clip
from ._tools import AgentExit, Workspace, describe_result, format_tool_error

Check = Callable[[], Any]  # returns None/True when recovered, or a reason string / False


class AgentRun:
    """What the SDK run produced."""

    def __init__(self) -> None:
        self.final_output = ""
        self.turns = 0
        self.usage = Usage()
        self.failure: str | None = None


class AgentJob:
    """Everything ``run_agent`` needs, prepared in the owner thread."""

    def __init__(
        self,
        *,
        settings: Settings,
        instructions: str,
        input_text: str,
        workspace: Workspace,
        state: RunState,
        check: Check | None,
        deadline: float,
        redact: Callable[[str], str],
        on_tool: Callable[[ToolCallRecord], None],
        tools: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.settings = settings
        self.instructions = instructions
        self.input_text = input_text
        self.workspace = workspace
        self.state = state
        self.check = check
        self.deadline = deadline
        self.redact = redact
        self.on_tool = on_tool
        self.tools = tuple(tools)  # per-recovery tools (e.g. spawn_followup)


def import_sdk() -> None:
    """Import the SDK (2-3 s the first time). Async callers run this in a worker thread."""
    import agents  # noqa: F401


def _build_model(settings: Settings) -> Any:
    model = settings.model
    if model is not None and not isinstance(model, str):
        return model  # an SDK Model instance, e.g. agents.testing.ScriptedModel
    if settings.openai_client_factory is None and settings.base_url is None:
        if settings.api_key is None and not os.environ.get("OPENAI_API_KEY"):
            raise RuntimeError("no API key: set OPENAI_API_KEY or pass api_key= (or base_url=)")
        if settings.api_key is None:
            return model  # the SDK's default provider reads the environment
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel
    from agents.models.default_models import get_default_model

    if settings.openai_client_factory is not None:
        client = settings.openai_client_factory()
    else:
        from openai import AsyncOpenAI

        # Local OpenAI-compatible servers usually ignore the key but the client requires one.
        key = settings.api_key or os.environ.get("OPENAI_API_KEY") or "unused"
        client = AsyncOpenAI(api_key=key, base_url=settings.base_url)
    name = model or get_default_model()
    if settings.base_url is not None:
        # Local servers (Ollama, vLLM, test mocks) speak chat completions, not Responses.
        return OpenAIChatCompletionsModel(model=name, openai_client=client)
    return OpenAIResponsesModel(model=name, openai_client=client)


def _user_tools(settings: Settings) -> list[Any]:
    from agents import function_tool

    tools = []
    for tool in settings.tools:
        if isinstance(getattr(tool, "name", None), str) and hasattr(tool, "params_json_schema"):
            tools.append(tool)
        else:
            tools.append(function_tool(tool, failure_error_function=_tool_failure))
    return tools


def _job_tools(job: AgentJob) -> list[Any]:
    from agents import function_tool

    return [function_tool(tool, failure_error_function=_tool_failure) for tool in job.tools]


def _tool_failure(_: Any, error: Exception) -> str:
    # The SDK hides tool errors from the model by default; the model needs the traceback.
    return format_tool_error(error)


def _tools(job: AgentJob, dispatch: Dispatch) -> list[Any]:
    from agents import function_tool

    serial = asyncio.Lock()
    ws, state = job.workspace, job.state

    async def call(tool: str, code: str, work: Job) -> str:
        started = time.perf_counter()
        async with serial:  # one snippet at a time, in the order the model asked
            ok = False
            try:
                value = await dispatch(work)
                text, ok = describe_result(value, ws.take_output()), True
            except AgentExit as exc:
                state.aborted = str(exc)
                text = f"{exc}. A recovery never exits the process; the recovery is over."
            except Exception as exc:
                printed = ws.take_output()
                error = format_tool_error(exc, ws.error)
                text = (clip(printed, 2_000) + "\n" if printed else "") + error
        text = job.redact(text)
        record = ToolCallRecord(
            tool=tool,
            code=job.redact(clip(code, 4_000)),
            result=text,
            ok=ok,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        state.records.append(record)
        job.on_tool(record)
        return text

    async def eval_python(expression: str) -> str:
        """Evaluate one Python expression in the live process and return its value.

        Args:
            expression: A Python expression; `await` is allowed.
        """
        return await call("eval_python", expression, lambda: ws.evaluate(expression))

    async def exec_python(statements: str) -> str:
        """Execute Python statements in the live process.

        Returns what they printed and the value of a trailing expression, or a traceback.

        Args:
            statements: Python statements; top-level `await` is allowed.
        """
        return await call("exec_python", statements, lambda: ws.execute(statements))

    def give_up(reason: str) -> str:
        """Stop the recovery: the original exception is re-raised with your reason attached.

        Args:
            reason: Why the postcondition cannot be established, in one sentence.
        """
        message = state.give_up(reason)
        state.records.append(
            ToolCallRecord("give_up", job.redact(clip(reason, 2_000)), message, True, 0.0)
        )
        job.on_tool(state.records[-1])
        return message

    return [
        function_tool(eval_python, failure_error_function=_tool_failure),
        function_tool(exec_python, failure_error_function=_tool_failure),
        function_tool(give_up, failure_error_function=_tool_failure),
    ]


async def run_agent(job: AgentJob, dispatch: Dispatch) -> AgentRun:
    """Run the agent to its end; never raises except for cancellation."""
    run = AgentRun()
    try:
        from agents import (
            Agent,
            MaxTurnsExceeded,
            RunConfig,
            Runner,
            ToolsToFinalOutputResult,
        )
    except ImportError as exc:
        run.failure = f"the Agents SDK is not importable: {exc}"
        return run
    state, settings = job.state, job.settings

    def stop_when_ended(_: Any, __: Any) -> Any:
        return ToolsToFinalOutputResult(is_final_output=state.stopped, final_output=None)

    try:
        agent_kwargs: dict[str, Any] = {
            "name": "crashoverride",
            "instructions": job.instructions,
            "tools": _tools(job, dispatch) + _job_tools(job) + _user_tools(settings),
            "mcp_servers": list(settings.mcp_servers),
            "tool_use_behavior": stop_when_ended,
        }
        model = _build_model(settings)
        if model is not None:
            agent_kwargs["model"] = model
        factory = settings.agent_factory
        agent = factory(**agent_kwargs) if factory is not None else Agent(**agent_kwargs)
        config = RunConfig(
            tracing_disabled=not settings.tracing, workflow_name="crashoverride recovery"
        )
    except Exception as exc:
        run.failure = f"could not set up the agent: {type(exc).__name__}: {clip(str(exc), 300)}"
        return run

    result: Any = None
    try:
        async with asyncio.timeout(max(0.0, job.deadline - time.monotonic())):
            result = await Runner.run(
                agent, job.input_text, max_turns=settings.max_turns, run_config=config
            )
            if not state.stopped and job.check is not None:
                verdict = await dispatch(job.check)
                if verdict is False or isinstance(verdict, str):
                    run.failure = verdict or "the postcondition does not hold"
    except TimeoutError:
        run.failure = f"timed out after {settings.timeout:g}s"
    except MaxTurnsExceeded:
        run.failure = f"max_turns ({settings.max_turns}) exceeded"
    except AgentExit as exc:
        run.failure = str(exc)
    except Exception as exc:
        run.failure = f"{type(exc).__name__}: {clip(job.redact(str(exc)), 500)}"
        details = getattr(exc, "run_data", None)
        result = details if details is not None else None
    if result is not None:
        _collect(run, result)
    return run


def _collect(run: AgentRun, result: Any) -> None:
    final = getattr(result, "final_output", None)
    run.final_output = "" if final is None else clip(str(final), 2_000)
    run.turns = len(getattr(result, "raw_responses", ()) or ())
    usage = getattr(getattr(result, "context_wrapper", None), "usage", None)
    if usage is not None:
        run.usage = Usage(
            requests=int(getattr(usage, "requests", 0) or 0),
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        )
