"""The SDK's objects that are not ours, wrapped so that every call they make passes the gate.

Application, handler and MCP tools become function tools that call ``Gate.call``. Handoffs
(``Agent`` or ``Handoff``, at any depth) are gated the same way: each transfer is a call
``approve=`` sees (``source == "handoff"``) before the application's ``on_handoff`` runs, and the
agent it leads to has every tool gated. SDK tools that do not run through a function we can wrap
(hosted tools such as web search, a computer or shell tool), an agent offered as a tool whose
agent can call tools of its own, and an agent that chooses its tools at run time (a class
redefining what the SDK asks, a sandbox agent's capabilities) cannot pass the gate, so a run
that is offered one refuses to start.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from crashoverride._security.audit import ApprovalRequest
from crashoverride._security.gate import Gate, _text_of, tool_failure
from crashoverride._security.redact import clip
from crashoverride._security.text import format_tool_error


def gated(tool: Any, gate: Gate, source: str) -> Any:
    """An SDK function tool that runs ``tool`` through ``gate``; refuses tools it cannot wrap."""
    from agents import Agent, FunctionTool
    from agents.tool import set_function_tool_failure_error_function

    if not isinstance(tool, FunctionTool):
        name = getattr(tool, "name", type(tool).__name__)
        raise TypeError(
            f"the {source} tool {name!r} ({type(tool).__name__}) does not run through a "
            "function crashoverride can wrap, so it cannot pass approve= and the audit "
            "trail; offer it as a function tool instead"
        )
    if getattr(tool, "_is_agent_tool", False):  # ``Agent.as_tool()``: a run of another agent
        runs = getattr(tool, "_agent_instance", None)
        # Its run is one tool call to us: only an agent that can call no tool of its own may
        # run inside it (its tools would never pass the gate).
        if not isinstance(runs, Agent) or runs.tools or runs.handoffs or runs.mcp_servers \
                or _offers_unlisted(runs):  # fmt: skip
            raise TypeError(
                f"the {source} tool {tool.name!r} runs the agent "
                f"{getattr(runs, 'name', '?')!r}, whose own tools would run inside that "
                "tool, so they cannot pass approve= and the audit trail; offer that agent "
                "as a handoff instead (its tools are gated)"
            )
    # The tool itself raises its errors to us (we record them as failed, then format them)...
    inner = set_function_tool_failure_error_function(copy.copy(tool), None)
    invoke = inner.on_invoke_tool
    name = tool.name

    async def on_invoke(ctx: Any, text: str) -> Any:
        async def execute() -> tuple[Any, bool]:
            try:
                return await gate.application(lambda: invoke(ctx, text)), True
            except Exception as exc:
                ended = gate.job.state.ended_by(exc)  # the tool exited or was interrupted
                return (ended, False) if ended is not None else (tool_failure(ctx, exc), False)

        return await gate.call(ApprovalRequest.of_json(name, text, source), execute)

    outer = copy.copy(tool)
    outer.on_invoke_tool = on_invoke
    # ... and failures the SDK produces itself (a call cancelled mid-turn) read as ours do.
    return set_function_tool_failure_error_function(outer, tool_failure)


# The SDK asks these what an agent offers: a class redefining one could offer tools never gated.
_OFFERS: Final = ("get_all_tools", "get_mcp_tools", "clone")


def _offers_unlisted(agent: Any) -> str:
    """How ``agent`` would offer tools that are not listed on it ("" when it cannot)."""
    from agents import Agent

    if not isinstance(agent, Agent):
        return "it is no Agent"
    redefined = [name for name in _OFFERS if getattr(type(agent), name) is not getattr(Agent, name)]
    if redefined:
        return f"its class redefines {', '.join(redefined)}"
    if getattr(agent, "capabilities", None):  # a sandbox agent's shell, files, patches
        return "its capabilities add tools"
    return ""


async def gate_agent(agent: Any, builtin: list[Any], gate: Gate, *, external: bool) -> Any:
    """``agent`` with every tool gated: the built-in ones as they are, the others wrapped.

    MCP servers' tools are listed once, here, and offered as gated function tools (the SDK
    would otherwise call the servers directly). The agents it hands off to are gated the same
    way, at any depth (their own tools as ``"handoff"``), and each transfer is itself a gated
    call (``"handoff"``). ``external`` False (diagnose mode): only the built-in tools are
    offered, and no handoff, whatever the factory added.
    """
    ours = {id(tool) for tool in builtin}
    return await _gated_agent(agent, ours, gate, external, "application", {})


async def _gated_agent(
    agent: Any, ours: set[int], gate: Gate, external: bool, source: str, made: dict[int, Any]
) -> Any:
    done = made.get(id(agent))
    if done is not None:  # handoffs may lead back to an agent already gated (a cycle)
        return done
    if unlisted := _offers_unlisted(agent):
        name = getattr(agent, "name", "?")
        raise TypeError(f"the agent {name!r} chooses its tools at run time ({unlisted}), so "
                        "they cannot pass approve= and the audit trail")  # fmt: skip
    tools = [tool for tool in agent.tools if id(tool) in ours]
    if external:
        others = [(tool, source) for tool in agent.tools if id(tool) not in ours]
        if agent.mcp_servers:
            from agents import RunContextWrapper

            # Asked where the application connected them (its loop), like their calls.
            listing = agent.get_mcp_tools
            listed: Any = await gate.application(lambda: listing(RunContextWrapper(context=None)))
            others += [(tool, "mcp") for tool in listed]
        tools += [gated(tool, gate, origin) for tool, origin in others]
    clone = made[id(agent)] = agent.clone(tools=tools, mcp_servers=[], handoffs=[])
    if external:
        clone.handoffs = [await _handed(target, ours, gate, made) for target in agent.handoffs]
    return clone


class HandoffRefused(Exception):
    """A transfer not made (denied, or its agent refused): the run ends, as the SDK cannot stay
    with the agent that asked; the recovery's reason says why."""


async def _handed(target: Any, ours: set[int], gate: Gate, made: dict[int, Any]) -> Any:
    """A handoff whose transfer is a gated call and whose agent is gated: an ``Agent`` here, the
    agent a ``Handoff`` picks when called (after its ``on_handoff`` ran) then."""
    from agents import Agent, Handoff, handoff

    if isinstance(target, Agent):
        clone = await _gated_agent(target, ours, gate, True, "handoff", made)
        transfer = handoff(clone)  # the SDK's own transfer to it; nothing else runs

        async def pick(ctx: Any, text: str) -> Any:
            return clone

    elif isinstance(target, Handoff):
        transfer = copy.copy(target)
        transfer._agent_ref = None  # it names an agent that is not gated; ours is returned
        choose = target.on_invoke_handoff

        async def pick(ctx: Any, text: str) -> Any:
            # ``on_handoff`` is the application's code: it runs where its tools run.
            chosen = await gate.application(lambda: choose(ctx, text))
            return await _gated_agent(chosen, ours, gate, True, "handoff", made)

    else:
        raise TypeError(f"the handoff {target!r} is neither an Agent nor a Handoff")
    name = transfer.tool_name

    async def on_invoke(ctx: Any, text: str) -> Any:
        picked: list[Any] = []

        async def execute() -> tuple[Any, bool]:
            try:
                picked.append(await pick(ctx, text))
            except Exception as exc:
                return format_tool_error(exc), False
            return f"handed off to {picked[0].name}", True

        ran = await gate.run(ApprovalRequest.of_json(name, text, "handoff"), execute)
        if not picked:
            why = ran.approved_by if not ran.allowed else _text_of(ran.output)
            raise HandoffRefused(
                f"the handoff {name} was not made: {clip(gate.job.redact(why), 500)}"
            )
        return picked[0]

    transfer.on_invoke_handoff = on_invoke
    return transfer
