"""Model turns written in crashoverride's tool contract, independent of how they are served.

A step is one model turn. The same steps drive the in-process ``ScriptedModel`` (see
``scripted_model``) and the wire-level ``MockServer`` (rendered as chat completions), so a test can
move between the two levels without rewriting its script. Faults only exist on the wire.

Extension point: integrations add helpers that *return steps* (usually ``exec_python`` with
the code a request or task recovery would run, or ``tool_call`` for their own tools), put them
in ``crashoverride/testing/<integration>.py`` (e.g. ``crashoverride.testing.asgi``), and users
import them from there next to these. Nothing here needs to change for that.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from crashoverride._agent.toolbox import BY_NAME


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The model calls a tool. ``arguments`` is the raw JSON text the model sends."""

    name: str
    arguments: str
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """The model answers with text; with no tool call in the same turn this ends the run."""

    text: str


@dataclass(frozen=True, slots=True)
class Fault:
    """A failure of the endpoint itself (``MockServer`` only).

    Attributes:
        kind: ``"status"``, ``"hang"`` or ``"malformed"``.
        status: HTTP status for ``"status"`` faults.
        headers: Extra response headers (e.g. ``Retry-After``).
        body: Response body for ``"status"`` faults.
        seconds: How long a ``"hang"`` lasts (None: until the server closes).
        times: How many consecutive requests this fault answers (None: every remaining one).
    """

    kind: str
    status: int = 500
    headers: tuple[tuple[str, str], ...] = ()
    body: str = ""
    seconds: float | None = None
    times: int | None = 1


Item: TypeAlias = ToolCall | Message
# What a user writes for one turn: an item, several items at once, or a fault.
StepLike: TypeAlias = Item | Sequence[Item] | Fault


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted model turn with call ids assigned."""

    items: tuple[Item, ...] = ()
    fault: Fault | None = None
    run: int = 0


def tool_call(
    name: str, arguments: str | Mapping[str, Any], *, call_id: str | None = None
) -> ToolCall:
    """A call of any tool, e.g. an application tool. A str is sent verbatim (may be junk)."""
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return ToolCall(name, text, call_id)


def _registered(name: str, *values: Any, call_id: str | None) -> ToolCall:
    # Argument names come from the tool's one definition (``crashoverride._agent.toolbox``), the
    # same one the agent's SDK tool is made from, so a step always fits the tool's schema.
    return tool_call(name, BY_NAME[name].arguments(*values), call_id=call_id)


def exec_python(statements: str, *, call_id: str | None = None) -> ToolCall:
    """The agent runs Python statements in the live process."""
    return _registered("exec_python", statements, call_id=call_id)


def eval_python(expression: str, *, call_id: str | None = None) -> ToolCall:
    """The agent evaluates one Python expression in the live process."""
    return _registered("eval_python", expression, call_id=call_id)


def inspect_python(expression: str, *, call_id: str | None = None) -> ToolCall:
    """Diagnose mode: the agent evaluates a read-only expression."""
    return _registered("inspect_python", expression, call_id=call_id)


def give_up(reason: str, *, call_id: str | None = None) -> ToolCall:
    """The agent gives up: the run ends and the original exception is re-raised."""
    return _registered("give_up", reason, call_id=call_id)


def spawn_followup(objective: str, context: str = "", *, call_id: str | None = None) -> ToolCall:
    """The agent queues a follow-up that starts in the background when the recovery ends."""
    return _registered("spawn_followup", objective, context, call_id=call_id)


def done(summary: str = "Recovered.") -> Message:
    """The agent's final one-line answer: the run ends normally."""
    return Message(summary)


# -- faults (wire level) ---------------------------------------------------------------------


def http_error(status: int = 500, body: str | None = None, *, times: int | None = 1) -> Fault:
    """The endpoint answers with an HTTP error and an OpenAI-style error body."""
    if body is None:
        body = json.dumps({"error": {"message": f"mock error {status}", "type": "server_error"}})
    return Fault("status", status=status, body=body, times=times)


def rate_limited(retry_after: float = 1, *, times: int | None = 1) -> Fault:
    """HTTP 429 with ``Retry-After`` (seconds): the openai client waits that long and retries."""
    seconds = f"{retry_after:g}"
    body = json.dumps({"error": {"message": "rate limited", "type": "rate_limit_exceeded"}})
    return Fault("status", status=429, headers=(("Retry-After", seconds),), body=body, times=times)


def hang(seconds: float | None = None, *, times: int | None = 1) -> Fault:
    """The endpoint accepts the request and never answers (or only after ``seconds``)."""
    return Fault("hang", seconds=seconds, times=times)


def malformed(*, times: int | None = 1) -> Fault:
    """HTTP 200 whose body is not valid JSON (a truncated completion, or a broken SSE event)."""
    return Fault("malformed", times=times)


def junk_arguments(name: str = "exec_python", *, call_id: str | None = None) -> ToolCall:
    """A tool call whose arguments are not JSON: the SDK must cope without crashing."""
    return tool_call(name, '{"statements": "x = ', call_id=call_id)


def unknown_tool(name: str = "format_hard_drive", *, call_id: str | None = None) -> ToolCall:
    """A call of a tool the agent does not have."""
    return tool_call(name, {"really": True}, call_id=call_id)


# -- scripts ---------------------------------------------------------------------------------


class Script:
    """Model turns for one or more recoveries, in the order the model will be asked.

    ``Script(step, ...)`` is one run (one recovery); ``.run(step, ...)`` appends another. Every
    argument is one model turn: an item, a list of items (several tool calls in one turn) or a
    fault. Tool calls without a ``call_id`` get ``call_1``, ``call_2``... unique over the script.
    """

    def __init__(self, *steps: StepLike) -> None:
        self._runs: list[list[StepLike]] = []
        if steps:
            self.run(*steps)

    def run(self, *steps: StepLike) -> Script:
        """Append the turns of one more recovery; returns the script for chaining."""
        if not steps:
            raise ValueError("a run needs at least one step")
        for step in steps:
            _check_step(step)
        self._runs.append(list(steps))
        return self

    @property
    def runs(self) -> int:
        return len(self._runs)

    def turns(self) -> list[Turn]:
        """The turns with call ids assigned (deterministic: the same every time)."""
        counter = itertools.count(1)
        turns: list[Turn] = []
        for run_index, steps in enumerate(self._runs):
            for step in steps:
                if isinstance(step, Fault):
                    turns.append(Turn(fault=step, run=run_index))
                    continue
                items = (step,) if isinstance(step, ToolCall | Message) else tuple(step)
                turns.append(Turn(tuple(_with_id(item, counter) for item in items), run=run_index))
        return turns

    def model(self) -> Any:
        """An Agents SDK ``ScriptedModel`` playing these turns (imports the SDK)."""
        return scripted_model(self.turns())

    def __repr__(self) -> str:
        return f"Script(runs={len(self._runs)}, turns={sum(map(len, self._runs))})"


def script(*steps: StepLike) -> Any:
    """A ``ScriptedModel`` for one recovery: ``CrashOverride(model=script(...))``."""
    return Script(*steps).model()


def as_script(value: Script | Iterable[StepLike] | None) -> Script:
    """Accept a ``Script`` or the steps of one run."""
    if value is None:
        return Script()
    if isinstance(value, Script):
        return value
    steps = list(value)
    return Script(*steps) if steps else Script()


def _check_step(step: object) -> None:
    if isinstance(step, ToolCall | Message | Fault):
        return
    items = step if isinstance(step, list | tuple) else ()
    if items and all(isinstance(item, ToolCall | Message) for item in items):
        return
    raise TypeError(
        "a step is a ToolCall/Message (exec_python(), done()...), a non-empty list of them, "
        f"or a Fault; got {step!r}"
    )


def _with_id(item: Item, counter: Iterator[int]) -> Item:
    if isinstance(item, ToolCall):
        number = next(counter)
        if item.call_id is None:
            return replace(item, call_id=f"call_{number}")
    return item


def scripted_model(turns: list[Turn]) -> Any:
    """Build a ``ScriptedModel`` whose calls return ``turns`` in order."""
    from agents.testing import ScriptedModel

    steps: list[list[Any]] = []
    for index, turn in enumerate(turns, 1):
        if turn.fault is not None:
            # A fault is an HTTP-level event; in process there is no HTTP to fail.
            raise TypeError(
                f"turn {index}: faults ({turn.fault.kind}) need the wire: serve the script "
                "with MockServer instead of a ScriptedModel"
            )
        steps.append(_sdk_items(turn.items, str(index)))
    return ScriptedModel(steps)


_fresh = itertools.count(1)


def output_items(step: Item | Sequence[Item]) -> list[Any]:
    """One turn as the Agents SDK's output items, for the SDK's own ``ModelStep`` features.

    For what a ``Script`` does not cover: a turn chosen from the call (``ModelStep.respond``)
    or one reporting token usage (``ModelStep(output=..., usage=...)``)::

        model = script()
        model.enqueue(ModelStep(output=output_items(done("ok")), usage=Usage(input_tokens=9)))

    Tool calls without a ``call_id`` get a fresh one (``turn_1``, ``turn_2``... over the
    process), which cannot collide with a ``Script``'s ``call_N`` ids in the same model.
    """
    _check_step(step)
    if isinstance(step, Fault):
        raise TypeError(f"faults ({step.kind}) need the wire: serve them with MockServer")
    items = (step,) if isinstance(step, ToolCall | Message) else tuple(step)
    number = next(_fresh)
    fresh = (
        replace(item, call_id=f"turn_{number}_{position}")
        if isinstance(item, ToolCall) and item.call_id is None
        else item
        for position, item in enumerate(items)
    )
    return _sdk_items(tuple(fresh), f"turn_{number}")


def _sdk_items(items: tuple[Item, ...], tag: str) -> list[Any]:
    from agents.testing import assistant_message, function_call

    output: list[Any] = []
    for position, item in enumerate(items):
        if isinstance(item, ToolCall):
            assert item.call_id is not None
            output.append(function_call(item.name, item.arguments, call_id=item.call_id))
        else:
            output.append(assistant_message(item.text, item_id=f"msg_{tag}_{position}"))
    return output
