"""The agent's tools and namespace helpers, each defined once.

Every built-in tool is one ``Tool`` entry below: its name, parameters, the description the model
sees, its class, the modes that offer it and its implementation. Everything else is derived:

- the SDK ``FunctionTool`` and its JSON schema (``_agent.sdk_tools``; the schema once per process),
- the tool list in the system prompt (``_agent.prompt``, via ``tool_lines``),
- what the approver sees and whether the result is fenced as data (``Kind``; ``_agent.sdk_tools``),
- the ``crashoverride.testing`` steps (``_steps``, via ``Tool.arguments``).

``Helper`` entries document the names the agent's Python code can use (``set_result``,
``replace_function``, ``caller``...); the prompt's text about them comes from here. They are
bound by ``_core.prepare``; ``tests/agent/test_toolbox.py`` checks the two agree.

This module imports neither the SDK nor the rest of the package: ``crashoverride.testing`` and
the prompt read it without paying for either.
"""

from __future__ import annotations

import enum
import inspect
import json
import textwrap
from collections.abc import Awaitable, Callable, Container, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

if TYPE_CHECKING:
    from crashoverride._agent.namespace import Workspace

REPAIR: Final = "repair"
DIAGNOSE: Final = "diagnose"
BOTH: Final = frozenset({REPAIR, DIAGNOSE})
ONLY_REPAIR: Final = frozenset({REPAIR})
ONLY_DIAGNOSE: Final = frozenset({DIAGNOSE})


class Kind(enum.Enum):
    """What calling a tool does, which decides how it is governed."""

    AGENT_CODE = "runs agent code"  # arbitrary Python in the live process
    INSPECTION = "inspects"  # a read-only expression (diagnose mode)
    CONTROL = "controls the run"  # ends it (give_up)
    FOLLOW_UP = "queues follow-up work"  # runs after the recovery, off the critical path

    @property
    def runs_code(self) -> bool:
        # The approver sees such a call as its code; its result echoes process data (fenced).
        return self in (Kind.AGENT_CODE, Kind.INSPECTION)


# Every call of every tool, of every kind, passes ``approve=`` (``_security.gate``): read-only
# snippets too (the reviewer decides what it trusts, not our read-only check), give_up and
# follow-ups too.

# The modes that offer tools the application brings (``tools=``, handler tools, MCP servers).
# Not diagnose: its guarantee is a property of how ``inspect_python`` runs, and a tool that
# runs in the live process is outside it whatever its author calls it (an MCP server's
# ``readOnlyHint`` included: a hint from the server, not a mechanism).
EXTERNAL_MODES: Final = ONLY_REPAIR

Outcome = tuple[str, bool]  # (text for the model, whether the call succeeded)


class ToolRun(Protocol):
    """What an implementation may use in one agent run (``_agent.sdk_tools`` provides it)."""

    async def snippet(self, work: Callable[[Workspace], Any]) -> Outcome:
        """Run ``work`` in the owner's context (the gate approved and records the call)."""
        ...

    def give_up(self, reason: str) -> str: ...

    def supplied(self) -> Callable[..., Any]:
        """This tool's callable from the job (``AgentJob.tools``), for ``from_job`` tools."""
        ...


_REQUIRED: Final[Any] = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    default: Any = _REQUIRED
    type: type = str


@dataclass(frozen=True)
class Tool:
    """One built-in agent tool.

    Attributes:
        run: The implementation, ``await run(tool_run, **arguments) -> (text, ok)``.
        from_job: The callable comes from the job (it belongs to one recovery's state, e.g.
            its follow-up session); the tool is offered only when the job supplies it.
        in_namespace: The modes in which it is also a function the agent's code can call.
    """

    name: str
    kind: Kind
    modes: frozenset[str]
    description: str
    params: tuple[Param, ...]
    run: Callable[..., Awaitable[Outcome]]
    from_job: bool = False
    in_namespace: frozenset[str] = frozenset()

    @property
    def signature(self) -> inspect.Signature:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [inspect.Parameter(p.name, kind, default=p.default, annotation=p.type)
             for p in self.params],
            return_annotation=str,
        )  # fmt: skip

    @property
    def call_text(self) -> str:
        """How the prompt writes a call: ``spawn_followup(objective, context="")``."""
        return _call_text(self.name, self.params)

    def arguments(self, *values: Any, **named: Any) -> dict[str, Any]:
        """The JSON arguments of a call, every parameter named (strict schemas require all)."""
        bound = self.signature.bind(*values, **named)
        bound.apply_defaults()
        return dict(bound.arguments)


@dataclass(frozen=True)
class Helper:
    """A name the agent's code can use. ``params`` None: a value, not a function."""

    name: str
    params: tuple[str, ...] | None
    description: str
    modes: frozenset[str] = ONLY_REPAIR
    # "always"; "returns": blocks that produce a value (calls, tasks); "persist": when
    # persisting fixes to files is allowed.
    when: Literal["always", "returns", "persist"] = "always"

    @property
    def call_text(self) -> str:
        if self.params is None:
            return self.name
        return f"{self.name}({', '.join(self.params)})"


def _call_text(name: str, params: Iterable[Param]) -> str:
    # Defaults as JSON (``context=""``): the model writes the arguments as JSON.
    shown = [p.name if p.default is _REQUIRED else f"{p.name}={json.dumps(p.default)}"
             for p in params]  # fmt: skip
    return f"{name}({', '.join(shown)})"


# -- implementations ------------------------------------------------------------------------


async def _eval_python(run: ToolRun, expression: str) -> Outcome:
    return await run.snippet(lambda ws: ws.evaluate(expression))


async def _exec_python(run: ToolRun, statements: str) -> Outcome:
    return await run.snippet(lambda ws: ws.execute(statements))


async def _inspect_python(run: ToolRun, expression: str) -> Outcome:
    return await run.snippet(lambda ws: ws.inspect(expression))


async def _give_up(run: ToolRun, reason: str) -> Outcome:
    return run.give_up(reason), True


async def _spawn_followup(run: ToolRun, objective: str, context: str = "") -> Outcome:
    return str(run.supplied()(objective, context)), True


# -- the registry ---------------------------------------------------------------------------

_EXPRESSION = "A Python expression; `await` is allowed."

TOOLS: Final = (
    Tool(
        "eval_python", Kind.AGENT_CODE, ONLY_REPAIR,
        "Evaluate one Python expression in the live process and return its value.",
        (Param("expression", _EXPRESSION),),
        _eval_python,
    ),
    Tool(
        "exec_python", Kind.AGENT_CODE, ONLY_REPAIR,
        "Execute Python statements in the live process. Returns what they printed and the "
        "value of a trailing expression, or a traceback. Top-level `await` works.",
        (Param("statements", "Python statements; top-level `await` is allowed."),),
        _exec_python,
    ),
    Tool(
        "inspect_python", Kind.INSPECTION, ONLY_DIAGNOSE,
        "Evaluate a Python expression in a throwaway snapshot of the live process: it sees "
        "every value, and nothing it does (writes, calls, I/O) reaches the process; writes, "
        "files, sockets and subprocesses are refused. Where no snapshot can be taken, only "
        "plain data, attributes, indexing and inspection functions work (len, type, repr, "
        "isinstance, sorted, getattr, vars, dir, show_source and similar).",
        (Param("expression", "A Python expression that only looks at values and source."),),
        _inspect_python,
    ),
    Tool(
        "give_up", Kind.CONTROL, BOTH,
        "Stop the recovery: the original exception is re-raised with your reason attached.",
        (Param("reason", "Why the postcondition cannot be established, in one sentence."),),
        _give_up,
        in_namespace=ONLY_REPAIR,  # diagnose code may call inspection functions only
    ),
    Tool(
        "spawn_followup", Kind.FOLLOW_UP, ONLY_REPAIR,
        "Queue a background follow-up agent run that starts when this recovery ends and "
        "receives its report (traceback, what you executed, your final message). Use it for "
        "work that must not block the application: a permanent fix written as a patch file, "
        "a ticket with the diagnosis, an alert, a deeper investigation. Do not wait for it. "
        "It may change code or files only if the prompts authorise that.",
        (
            Param("objective", "What the follow-up must achieve, as a concrete end state."),
            Param("context", "What you found that the follow-up needs, beyond the report.", ""),
        ),
        _spawn_followup,
        from_job=True,
        in_namespace=ONLY_REPAIR,
    ),
)  # fmt: skip

HELPERS: Final = (
    Helper("caller", None,
           'the failed block\'s local variables by name, `caller["name"]`; in repair mode '
           '`caller["name"] = value` sets one for the code after the block.', BOTH),
    Helper("error", None, "the exception the block raised.", BOTH),
    Helper("effects", (),
           "the declared side effects (charges, mails, calls to partners) this unit of work "
           "already made, as dicts (`effect`, `state`: done, failed or started, `result`). "
           "Calling one of them again, from your code or a replay, returns its recorded "
           "result without doing it twice."),
    Helper("show_source", ("obj",),
           "the source a live object runs now, also after a patch.", BOTH),
    Helper("replace_function", ("func", "new_func_or_source"),
           "swaps the code of `func` in place so every existing reference sees it (plain "
           "`module.func = new` misses `from module import func` copies)."),
    Helper("rebind_everywhere", ("old", "new"),
           "rebinds every module global and class attribute that is `old` to `new`; for "
           "builtins and cases replace_function refuses."),
    Helper("raise_instead", ("exc",),
           "ends the recovery by raising the exception `exc` (chained to the original) "
           "instead of the original one."),
    Helper("set_result", ("value",),
           "ends the call: it returns `value` to its caller.", when="returns"),
    Helper("rerun", (),
           "after you repaired the code, has the call made once more with the same "
           "arguments when you finish. The whole call runs again: its declared effects "
           "(`effects()`) already done return their recorded result, but anything else it did "
           "before it failed (a charge, a message, a write not declared) is done again, so if "
           "it did such a thing, finish the remaining work yourself and use set_result "
           "instead.", when="returns"),
    Helper("persist_function", ("func", "new_source=None"),
           "persists what `func` runs now (or `new_source`) over its definition in its "
           "source file.", when="persist"),
    Helper("persist_file_edit", ("path", "old", "new"),
           "persists replacing the one occurrence of `old` in the file at `path` with "
           "`new`.", when="persist"),
)  # fmt: skip

BY_NAME: Final = {tool.name: tool for tool in TOOLS}


def offered(mode: str, supplied: Container[str] | None = None) -> tuple[Tool, ...]:
    """The tools of ``mode``; ``from_job`` ones only if in ``supplied`` (None: all of them)."""
    return tuple(
        tool
        for tool in TOOLS
        if mode in tool.modes and (not tool.from_job or supplied is None or tool.name in supplied)
    )


# -- prompt text ----------------------------------------------------------------------------


def _item(head: str, text: str) -> str:
    return textwrap.fill(
        f"- {head}: {text}", width=96, subsequent_indent="  ",
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip


def tool_lines(mode: str, supplied: Container[str] | None = None) -> str:
    """The prompt's list of the tools ``mode`` offers (as ``offered``), one item per tool."""
    tools = offered(mode, supplied)
    return "\n".join(_item(tool.call_text, tool.description) for tool in tools)


def helper_lines(mode: str, *, when: Container[str] = ("always",)) -> str:
    """The prompt's list of the namespace names ``mode`` offers under the ``when`` conditions.

    The tools that are also functions in ``mode`` close the unconditional list.
    """
    items = [
        _item(helper.call_text, helper.description)
        for helper in HELPERS
        if mode in helper.modes and helper.when in when
    ]
    also = [tool.call_text for tool in offered(mode) if mode in tool.in_namespace]
    if "always" in when and also:
        items.append(_item(" and ".join(also), "the tools of the same names, as functions."))
    return "\n".join(items)
