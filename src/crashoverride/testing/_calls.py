"""What a scripted model was sent: the tool results the agent saw, in the order it saw them."""

from __future__ import annotations

import re
from typing import Any

# The fence ``crashoverride._agent.prompt.Fence`` puts around text an attacker may control
# (every tool result): a test asks about the data inside it, not the random fence id.
_FENCED = re.compile(
    r'<untrusted-data id="(?P<id>[0-9a-f]+)" source="[^"]*">\n(?P<data>.*)\n'
    r'</untrusted-data id="(?P=id)">',
    re.DOTALL,
)


def unfenced(text: str) -> str:
    """``text`` without the untrusted-data fence around it (unchanged if it has none)."""
    match = _FENCED.fullmatch(text)
    return match["data"] if match else text


def tool_outputs(model: Any) -> list[str]:
    """The tool results a ``ScriptedModel`` was sent, in order, each once, unfenced.

    Read from the calls the model recorded (every call carries the whole conversation so far),
    so after a recovery a test can check what the agent saw::

        model = script(eval_python("caller['order']"), done())
        ...
        assert tool_outputs(model) == ["{'id': 7}"]
    """
    outputs: list[str] = []
    seen: set[str] = set()
    for call in model.calls:
        items = call.input if isinstance(call.input, list) else []
        for item in items:
            is_output = isinstance(item, dict) and item.get("type") == "function_call_output"
            if is_output and item["call_id"] not in seen:
                seen.add(item["call_id"])
                outputs.append(unfenced(str(item["output"])))
    return outputs
