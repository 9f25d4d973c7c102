"""Scripted turns as an Agents SDK ``ScriptedModel`` (the in-process, no-network level)."""

from __future__ import annotations

from typing import Any

from ._steps import Message, ToolCall, Turn


def scripted_model(turns: list[Turn]) -> Any:
    """Build a ``ScriptedModel`` whose calls return ``turns`` in order."""
    from agents.testing import ScriptedModel, assistant_message, function_call

    steps: list[list[Any]] = []
    for index, turn in enumerate(turns, 1):
        if turn.fault is not None:
            # A fault is an HTTP-level event; in process there is no HTTP to fail.
            raise TypeError(
                f"turn {index}: faults ({turn.fault.kind}) need the wire: serve the script "
                "with MockServer instead of a ScriptedModel"
            )
        output: list[Any] = []
        for position, item in enumerate(turn.items):
            if isinstance(item, ToolCall):
                assert item.call_id is not None
                output.append(function_call(item.name, item.arguments, call_id=item.call_id))
            elif isinstance(item, Message):
                output.append(assistant_message(item.text, item_id=f"msg_{index}_{position}"))
        steps.append(output)
    return ScriptedModel(steps)
