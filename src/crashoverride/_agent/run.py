"""One Agents SDK run: build the agent and its tools, run it under the deadline, classify the end.

This is the only module that imports ``agents`` / ``openai``, and only when a recovery starts.
It runs on whichever asyncio loop the bridge chose; tool code goes back through ``dispatch``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from crashoverride._agent import clients
from crashoverride._agent.clients import Lease
from crashoverride._agent.namespace import Workspace
from crashoverride._agent.prompt import Fence
from crashoverride._agent.sdk_tools import agent_tools, tool_failure
from crashoverride._agent.state import AgentExit, AgentRun, RunState
from crashoverride._agent.toolbox import BY_NAME, EXTERNAL_MODES
from crashoverride._config.settings import Settings
from crashoverride._observe.report import Usage
from crashoverride._placement.bridge import Dispatch
from crashoverride._security.audit import Approver, ToolCallRecord
from crashoverride._security.gate import Gate
from crashoverride._security.handoffs import gate_agent
from crashoverride._security.redact import Redacted
from crashoverride._security.text import clip

Check = Callable[[], Any]  # returns None/True when recovered, or a reason string / False


class AgentJob:
    """Everything ``run_agent`` needs, prepared in the owner thread."""

    def __init__(
        self,
        *,
        settings: Settings,
        instructions: Redacted,
        input_text: Redacted,
        workspace: Workspace,
        state: RunState,
        check: Check | None,
        deadline: float,
        redact: Callable[[str], Redacted],
        on_tool: Callable[[ToolCallRecord], None],
        tools: Sequence[Callable[..., Any]] = (),
        mode: str = "repair",
        approve: Approver | None = None,
        fence: Fence | None = None,
    ) -> None:
        self.settings = settings
        # What the model is sent: redactor output only (``Redacted``), tool results too.
        self.instructions = instructions
        self.input_text = input_text
        self.workspace = workspace
        self.state = state
        self.check = check
        self.deadline = deadline
        self.redact = redact
        self.on_tool = on_tool
        self.tools = tuple(tools)  # per-recovery tools (e.g. spawn_followup)
        self.mode = mode
        self.approve = approve
        # Marks untrusted text as data; the instructions name its id, so use the same one.
        self.fence = fence if fence is not None else Fence()


def import_sdk() -> None:
    """Import the SDK (2-3 s the first time). Async callers use ``import_sdk_async``."""
    import agents  # noqa: F401

    # What the first run would otherwise build on its loop (the SDK's trace exporter, our SSL
    # context, openai's API modules), so ``awarm_up()`` leaves nothing heavy for the first failure.
    clients.prepare()
    # And the built-in tools' JSON schemas (a few ms, once per process).
    from crashoverride._agent.sdk_tools import schema_of
    from crashoverride._agent.toolbox import TOOLS

    for tool in TOOLS:
        schema_of(tool)


def _sdk_ready() -> bool:
    module = sys.modules.get("agents")
    # ``_initializing`` is set by importlib while another thread is still importing it.
    return module is not None and not getattr(module.__spec__, "_initializing", False)


_IMPORT_LOCK = threading.Lock()
_importing: concurrent.futures.Future[None] | None = None


async def import_sdk_async() -> None:
    """Import the SDK off the event loop, once; later calls cost nothing.

    Concurrent first failures share one import thread (a burst must not start hundreds).
    Skipping the thread when the SDK is loaded also matters at interpreter shutdown, when
    Python refuses to start new threads (a follow-up finishing during exit).
    """
    global _importing
    if _sdk_ready():
        return
    with _IMPORT_LOCK:
        future = _importing
        if future is None or (future.done() and future.exception() is not None):
            future = _importing = concurrent.futures.Future()
            threading.Thread(
                target=_import_into, args=(future,), name="crashoverride-import", daemon=True
            ).start()
    from crashoverride._placement.waiting import wait_future

    await wait_future(future)
    future.result()


def _import_into(future: concurrent.futures.Future[None]) -> None:
    try:
        import_sdk()
    except Exception as exc:  # handed to every waiter, which re-raises it
        future.set_exception(exc)
    else:
        future.set_result(None)
    finally:
        if not future.done():  # an interrupt in this thread: never leave the waiters hanging
            future.set_exception(RuntimeError("the SDK import was interrupted"))


async def _build_model(settings: Settings, leases: list[Lease]) -> Any:
    """The model for this run; cached clients it uses are appended to ``leases`` (to release)."""
    model = settings.model
    if model is not None and not isinstance(model, str):
        return model  # an SDK Model instance, e.g. agents.testing.ScriptedModel
    no_client = settings.openai_client_factory is None and settings.base_url is None
    if no_client and settings.api_key is None:
        return model  # the SDK's default provider reads the key ``missing_credentials`` found
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel
    from agents.models.default_models import get_default_model

    if settings.openai_client_factory is not None:
        # The user's client: called as before, and never closed by us.
        client = settings.openai_client_factory()
    else:
        # Local OpenAI-compatible servers usually ignore the key but the client requires one.
        key = settings.api_key or os.environ.get("OPENAI_API_KEY") or "unused"
        # Built off the loop and shared by the loop's recoveries: building one costs 100-600 ms.
        lease = await clients.lease(settings.base_url, key)
        leases.append(lease)
        client = lease.client
    name = model or get_default_model()
    if settings.base_url is not None:
        # Local servers (Ollama, vLLM, test mocks) speak chat completions, not Responses.
        return OpenAIChatCompletionsModel(model=name, openai_client=client)
    return OpenAIResponsesModel(model=name, openai_client=client)


def _user_tools(settings: Settings) -> list[Any]:
    # Settings are immutable and shared by their handler's recoveries: the SDK tools made
    # from its callables are too (an SDK tool object keeps no per-run state).
    built = _USER_TOOLS.get(settings)
    if built is None:
        from agents import function_tool

        built = _USER_TOOLS[settings] = tuple(
            # An SDK tool object (it has a ``name``) as it is; ``_security.gate`` wraps or refuses
            # it.
            tool
            if isinstance(getattr(tool, "name", None), str)
            else function_tool(tool, failure_error_function=tool_failure)
            for tool in settings.tools
        )
    return list(built)


# Weak: settings derived per follow-up or per handler must not be kept alive by this cache.
_USER_TOOLS: weakref.WeakKeyDictionary[Settings, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def _job_tools(job: AgentJob) -> list[Any]:
    # Tools the registry defines (spawn_followup) are made by ``agent_tools`` from the job's
    # callable; anything else a job brings is wrapped as it is.
    from agents import function_tool

    return [
        function_tool(tool, failure_error_function=tool_failure)
        for tool in job.tools
        if getattr(tool, "__name__", None) not in BY_NAME
    ]


async def run_agent(
    job: AgentJob, dispatch: Dispatch, tools_at: Dispatch | None = None
) -> AgentRun:
    """Run the agent to its end; never raises except for cancellation.

    ``dispatch`` runs agent code as the owner of the failed frame; ``tools_at`` runs the
    application's tools and MCP calls where they belong (the application's loop, when the
    session runs off it), None: on this loop."""
    run = AgentRun()
    try:
        from agents import ToolsToFinalOutputResult
    except ImportError as exc:
        run.failure = f"the Agents SDK is not importable: {exc}"
        return run
    state = job.state

    def stop_when_ended(_: Any, __: Any) -> Any:
        return ToolsToFinalOutputResult(is_final_output=state.stopped, final_output=None)

    leases: list[Lease] = []
    try:
        return await _run(job, dispatch, tools_at, run, leases, stop_when_ended)
    finally:
        # Whatever ended the run (cancellation included): cached clients go back to their
        # loop's cache, and a client this run owns is closed before its loop can end.
        await _close(leases)


async def _run(
    job: AgentJob,
    dispatch: Dispatch,
    tools_at: Dispatch | None,
    run: AgentRun,
    leases: list[Lease],
    stop: Any,
) -> AgentRun:
    from agents import Agent, MaxTurnsExceeded, RunConfig, Runner

    settings = job.settings
    await clients.prepare_async()  # at once when the warm-up or the import did it
    try:
        gate = Gate(job, dispatch, tools_at)
        builtin = agent_tools(job, gate)
        # Diagnose mode: no tool the application brings (see ``_agent.toolbox.EXTERNAL_MODES``).
        external = job.mode in EXTERNAL_MODES
        agent_kwargs: dict[str, Any] = {
            "name": "crashoverride",
            "instructions": job.instructions,
            "tools": builtin + (_job_tools(job) + _user_tools(settings) if external else []),
            "mcp_servers": list(settings.mcp_servers) if external else [],
            "tool_use_behavior": stop,
        }
        model = await _build_model(settings, leases)
        if model is not None:
            agent_kwargs["model"] = model
        factory = settings.agent_factory
        agent = factory(**agent_kwargs) if factory is not None else Agent(**agent_kwargs)
        # Every tool the agent ended up with, the factory's and the MCP servers' included,
        # runs through the gate: one approval hook, one audit trail.
        agent = await gate_agent(agent, builtin, gate, external=external)
        config = RunConfig(
            tracing_disabled=not settings.tracing, workflow_name="crashoverride recovery"
        )
    except Exception as exc:
        run.failure = f"could not set up the agent: {type(exc).__name__}: {clip(str(exc), 300)}"
        return run

    result: Any = None
    try:
        # No deadline of its own: the pipeline's one cancel scope ends the run at the deadline,
        # and the pipeline judges the block's evidence afterwards.
        result = await Runner.run(
            agent,
            job.input_text,
            max_turns=settings.max_turns,
            run_config=config,
            hooks=_counting_hooks()(run),
        )
    except MaxTurnsExceeded:
        run.failure = f"max_turns ({settings.max_turns}) exceeded"
    except AgentExit as exc:
        run.failure = str(exc)
    except Exception as exc:
        run.failure = f"{type(exc).__name__}: {clip(job.redact(str(exc)), 500)}"
        where = _endpoint_of(exc)
        if where:  # "Connection error." alone does not say which endpoint could not be reached
            run.failure += f" ({job.redact(f'endpoint {where}')})"
        details = getattr(exc, "run_data", None)
        result = details if details is not None else None
    if result is not None:
        _collect(run, result)
    return run


async def _close(leases: list[Lease]) -> None:
    for lease in leases:
        await lease.release()  # never raises: closing is best effort


def _collect(run: AgentRun, result: Any) -> None:
    final = getattr(result, "final_output", None)
    run.final_output = "" if final is None else clip(str(final), 2_000)


def _endpoint_of(exc: BaseException) -> str:
    """The base URL a connection error (or timeout) of the ``openai`` client was trying to reach,
    without credentials or query: its scheme, host, port and path up to the API's operation."""
    from openai import APIConnectionError

    if not isinstance(exc, APIConnectionError):
        return ""
    url = getattr(getattr(exc, "request", None), "url", None)
    host, scheme = getattr(url, "host", ""), getattr(url, "scheme", "")
    if not (host and scheme):
        return ""
    port = getattr(url, "port", None)
    path = str(getattr(url, "path", "") or "")
    for operation in ("/chat/completions", "/responses"):  # what the SDK appends to the base
        if path.endswith(operation):
            path = path[: -len(operation)]
            break
    netloc = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc}{f':{port}' if port else ''}{path.rstrip('/')}"


@functools.cache
def _counting_hooks() -> type:
    """The SDK run hooks that count turns and tokens as each model answer arrives, not read
    off the run's result: a run that ends without one (max_turns, an endpoint error on a later
    turn, the deadline, agent code that exits) still reports the turns it took. One class,
    made once (a class made per run is a reference cycle holding the run until a collection)."""
    from agents import RunHooks

    class Counting(RunHooks[Any]):
        def __init__(self, run: AgentRun) -> None:
            self.run = run

        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            _count(self.run, response)

    return Counting


def _count(run: AgentRun, response: Any) -> None:
    """One model answer: a turn, and the tokens it used."""
    usage = getattr(response, "usage", None)
    run.turns += 1
    run.usage = Usage(
        requests=run.usage.requests + int(getattr(usage, "requests", 0) or 0),
        input_tokens=run.usage.input_tokens + int(getattr(usage, "input_tokens", 0) or 0),
        output_tokens=run.usage.output_tokens + int(getattr(usage, "output_tokens", 0) or 0),
    )
