"""The one gate every tool call passes: approval, then execution, then the audit record.

Built-in tools (``_agent.sdk_tools``), application tools (``tools=``), MCP tools and the tools of a
follow-up's run all go through ``Gate.call``: ``approve=`` sees each call (its tool name and
arguments) before it runs, a denied call never runs, and every call, denied ones included, is
one ``ToolCallRecord`` in ``report.tool_calls`` and one ``*.tool_called`` event.

The SDK's objects that are not ours (application and MCP tools, handoffs, the agents they lead
to) are wrapped to call this gate in ``_security.handoffs``.

Agent code that is no tool call of a running agent (a recipe replayed on a new frame, a fleet
fix applied here) passes ``run_agent_code``: the mode first, then the same approval and audit.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import itertools
import linecache
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any, Final, NamedTuple, Protocol, TypeVar

from crashoverride._placement.bridge import Dispatch
from crashoverride._placement.watchdog import Preempted
from crashoverride._security.approvers import each
from crashoverride._security.audit import ApprovalRequest, Approver, ToolCallRecord
from crashoverride._security.redact import Redacted, clip
from crashoverride._security.text import format_tool_error, render_value
from crashoverride._security.verdict import judge, raised

T = TypeVar("T")

NOT_REQUIRED: Final = "not required (no approve= configured)"
_PLAIN_NO: Final = "denied"  # an approver's no without a reason of its own: "denied by <name>"

Execute = Callable[[], Awaitable[tuple[Any, bool]]]  # -> (output, ok)

# The modes in which agent code may change the process (``_config.settings.MODES``): diagnose is
# read-only. An allow-list, so a mode added later runs no such code until it is listed here.
CHANGING_MODES: Final = frozenset({"repair"})


def changes_allowed(mode: str) -> bool:
    """Whether agent code that changes the process (a snippet, a patch) may run in ``mode``."""
    return mode in CHANGING_MODES


class Ran(NamedTuple):
    """How one gated call went: approved, what it returned (unredacted), whether it succeeded."""

    allowed: bool
    output: Any
    ok: bool
    approved_by: str


class _Trail(Protocol):
    @property
    def records(self) -> list[ToolCallRecord]: ...

    # Whether agent code's exception ends the run (an exit, an interrupt), and the model's word.
    def ended_by(self, exc: Exception) -> str | None: ...


class Audited(Protocol):
    """What the gate needs of a run (``_agent.run.AgentJob`` is one): who approves, how text is
    redacted and fenced, where the audit trail goes. A Protocol, so the gate, which sits below
    the agent layer, never imports it."""

    @property
    def approve(self) -> Approver | None: ...
    @property
    def state(self) -> _Trail: ...

    # The model sees only redactor output: what is fenced is ``Redacted`` already.
    def redact(self, text: str) -> Redacted: ...
    def fence(self, text: Redacted, label: str) -> str: ...
    def on_tool(self, record: ToolCallRecord) -> None: ...


def approver_name(approve: Any) -> str:
    """How ``approved_by`` names an approver."""
    return str(getattr(approve, "__qualname__", None) or type(approve).__name__)


def tool_failure(_: Any, error: Exception) -> str:
    # The SDK hides tool errors from the model by default; the model needs the traceback.
    return format_tool_error(error)


class Gate:
    """The gate of one agent run: approval, the order of calls, the audit trail."""

    def __init__(self, job: Audited, dispatch: Dispatch, tools_at: Dispatch | None = None) -> None:
        self.job = job
        self.dispatch = dispatch
        self._tools_at = tools_at
        self.serial = asyncio.Lock()

    async def application(self, work: Callable[[], Awaitable[T]]) -> T:
        """Await the application's SDK-side code (a tool's invocation, an MCP listing, an
        ``on_handoff``) where it belongs: on the application's loop when the session runs off
        it (an exit or interrupt there ends the run: ``state.ended_by``), else here."""
        if self._tools_at is None:
            return await work()
        return await self._tools_at(work)  # type: ignore[return-value]

    async def approval(self, call: ApprovalRequest) -> tuple[bool, str]:
        """(allowed, who/why) for one call; runs ``approve`` in the owner's context.

        Several approvers (``AllOf``: a follow-up's, after the running process's own) are
        asked in turn; the first that does not approve decides, and the answer names it.
        """
        approve = self.job.approve
        if approve is None:
            return True, NOT_REQUIRED
        names: list[str] = []
        for one in each(approve):
            name = approver_name(one)
            ask = functools.partial(one, call)
            try:
                # Judged in the owner's context too: an answer's truth is the approver's code.
                said = await self.dispatch(
                    functools.partial(judge, ask, what="it", default=_PLAIN_NO)
                )
            except Exception as exc:  # the hop to the owner failed: nothing approved the call
                said = raised("it", exc)
            if said is not True:
                return False, f"denied by {name}" + ("" if said == _PLAIN_NO else f": {said}")
            names.append(name)
        return True, "approved by " + " and ".join(names)

    async def call(self, call: ApprovalRequest, execute: Execute, *, data: bool = True) -> Any:
        """Approve ``call``, run it, record it; what the model sees.

        ``data``: the output may carry text from outside (values, pages, messages), so the
        model gets it fenced as data. The audit record keeps it unfenced.
        """
        job = self.job
        allowed, output, _, _ = await self.run(call, execute)
        if allowed and data:
            label = f"result of {call.tool}"
            return _shielded(output, job.redact, lambda part: job.fence(part, label))
        return job.redact(output) if isinstance(output, str) else output

    async def run(self, call: ApprovalRequest, execute: Execute, *, refused: str = "") -> Ran:
        """Approve ``call`` (unless ``refused`` says why it may not run), run it, record it."""
        started = time.perf_counter()
        allowed, approved_by, output, ok = False, refused, None, False
        try:
            async with self.serial:  # one call at a time, in the order the model asked
                if not refused:
                    allowed, approved_by = await self.approval(call)
                if allowed:
                    output, ok = await execute()
                else:
                    output = f"Not run: {approved_by}. Do not retry it as it is; adapt or give up."
        except BaseException as exc:
            # Cleanup and re-raise (cancellation at the deadline included): the call started,
            # so the audit trail keeps it.
            cut = f"cut off: {type(exc).__name__}"
            self._record(call, cut, False, started, approved_by or "not decided")
            raise
        if output is None:
            output = ""
        self._record(call, _text_of(output), ok, started, approved_by)
        return Ran(allowed, output, ok, approved_by)

    def _record(
        self, call: ApprovalRequest, result: str, ok: bool, started: float, by: str
    ) -> None:
        job = self.job
        duration = round((time.perf_counter() - started) * 1000, 3)
        # Redacted before clipping: a cut must not split a secret the detector then misses.
        redact = job.redact
        record = ToolCallRecord(
            redact(call.tool), clip(redact(str(call)), 4_000), clip(redact(result), 4_000), ok,
            duration, redact(by), redact(call.source),
        )  # fmt: skip
        job.state.records.append(record)
        job.on_tool(record)


def _text_of(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping) and output.get("type") == "text":
        return str(output.get("text", ""))
    if isinstance(output, list):
        return "\n".join(_text_of(item) for item in output)
    # Rendered as eval_python's results are: secret-named keys and fields inside are masked
    # by name, whatever their values look like.
    return render_value(output)


def _shielded(
    output: Any, redact: Callable[[str], Redacted], fence: Callable[[Redacted], str]
) -> Any:
    """``output`` for the model: every text part redacted and fenced, images kept."""
    if isinstance(output, str):
        return fence(redact(output))
    if isinstance(output, Mapping) and output.get("type") in ("text", "image"):
        if output["type"] == "image":
            return output
        return {**output, "text": fence(redact(str(output.get("text", ""))))}
    if isinstance(output, list) and all(isinstance(item, Mapping) for item in output):
        return [_shielded(item, redact, fence) for item in output]
    return fence(redact(_text_of(output)))


# -- agent code outside an agent's tool calls: recipes replayed, fleet fixes applied ------------


@dataclass(frozen=True, slots=True)
class Owner:
    """Who answers for agent code run outside an agent's tool calls: the mode, the approver
    (the handler's, else the application's), how to reach the owner's context (``dispatch``),
    how to redact, and where the audit lines go (``audit``: a ``*.tool_called`` event;
    ``trail``: a report's ``tool_calls``, when there is a report)."""

    mode: str
    approve: Approver | None
    dispatch: Dispatch
    redact: Callable[[str], Redacted]
    audit: Callable[[ToolCallRecord], None]
    trail: list[ToolCallRecord] | None = None  # None: no report (an eager application)


class _Outside:
    """An ``Owner`` as the gate sees a run (``Audited``); its output goes to no model."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self.records = owner.trail if owner.trail is not None else []

    @property
    def approve(self) -> Approver | None:
        return self._owner.approve

    @property
    def state(self) -> _Trail:
        return self

    def redact(self, text: str) -> Redacted:
        return self._owner.redact(text)

    def fence(self, text: str, label: str) -> str:
        return text

    def ended_by(self, exc: Exception) -> str | None:
        return None  # no run to end: agent-derived code outside a run fails as it is

    def on_tool(self, record: ToolCallRecord) -> None:
        self._owner.audit(record)


async def run_agent_code(owner: Owner, call: ApprovalRequest, execute: Execute) -> Ran:
    """Run agent-derived code that is no tool call of a running agent, through the gate.

    The mode first (in a read-only mode nothing runs), then ``approve=``, then ``execute``;
    every call, refused ones included, leaves its ``ToolCallRecord``.
    """
    refused = ""
    if not changes_allowed(owner.mode):
        refused = (
            f"refused: {owner.mode} mode is read-only (agent code that changes the process "
            "never runs in it)"
        )
    return await Gate(_Outside(owner), owner.dispatch).run(call, execute, refused=refused)


# -- agent code: compiled and run here, and nowhere else ----------------------------------------
# ``tests/architecture/test_choke_points.py`` fails if ``exec``/``eval``/``compile`` appear in
# another module of the package, so every path that runs agent-derived code comes through here.

_COUNTER = itertools.count(1)
# Sources of agent code stay visible to tracebacks and ``inspect`` for patched functions, but
# their number is bounded so a long-running server does not grow without limit.
_MAX_SOURCES: Final = 2_000
_SOURCES: OrderedDict[str, None] = OrderedDict()


def register_source(source: str) -> str:
    """A file name under which ``source`` is known to ``linecache`` (tracebacks, ``inspect``)."""
    filename = f"<crashoverride-{next(_COUNTER)}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    _SOURCES[filename] = None
    while len(_SOURCES) > _MAX_SOURCES:
        old, _ = _SOURCES.popitem(last=False)
        linecache.cache.pop(old, None)
    return filename


def compile_agent(
    source: str | ast.Module, mode: str, *, filename: str | None = None, flags: int = 0
) -> CodeType:
    """Compile agent code (text or a parsed tree); text is registered unless ``filename``."""
    if filename is None:
        if not isinstance(source, str):
            raise TypeError("a parsed tree needs the file name its text was registered under")
        filename = register_source(source)
    code: CodeType = compile(source, filename, mode, flags=flags, dont_inherit=True)
    return code


def compile_source(source: str) -> CodeType:
    """Module-level agent source, compiled with its text registered."""
    return compile_agent(source, "exec")


class ForgedSignal(Exception):
    """Agent code raised a ``BaseException`` that only the runtime may raise."""


def forged(exc: BaseException) -> str:
    """Why a recovery whose agent code raised ``exc`` (a forged control-flow signal) is over."""
    return (
        f"agent code raised {type(exc).__module__}.{type(exc).__qualname__}, which only the "
        "runtime may raise (a cancellation, an interrupt, an exit); the recovery is over"
    )


def run_code(code: CodeType, globals_: dict[str, Any], names: Any = None) -> Any:
    """Run compiled agent code: an expression's value, or None for statements.

    Run synchronously, agent code cannot be cancelled or closed from outside: a
    ``CancelledError``, ``GeneratorExit`` or ``BaseException`` of its own that escapes it is
    forged, and would replace the application's exception (or fake the caller's cancellation)
    wherever the code runs (a snippet, a recipe, a fleet fix being defined). It leaves as
    ``ForgedSignal``. ``KeyboardInterrupt`` and ``SystemExit`` keep their own handling, and
    ``Preempted`` is the watchdog's stop.
    """
    try:
        return eval(code, globals_, names)
    except (Exception, KeyboardInterrupt, SystemExit, Preempted):
        raise
    except BaseException as exc:
        raise ForgedSignal(forged(exc)) from None
