"""Small builders for scripted-model recoveries used by the core tests."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from agents.testing import ScriptedModel, assistant_message, function_call

_ids = itertools.count(1)


def exec_step(statements: str) -> list[Any]:
    return [function_call("exec_python", {"statements": statements}, call_id=f"x{next(_ids)}")]


def eval_step(expression: str) -> list[Any]:
    return [function_call("eval_python", {"expression": expression}, call_id=f"v{next(_ids)}")]


def give_up_step(reason: str) -> list[Any]:
    return [function_call("give_up", {"reason": reason}, call_id=f"g{next(_ids)}")]


def done_step(text: str = "done") -> list[Any]:
    return [assistant_message(text)]


def scripted(*steps: list[Any]) -> ScriptedModel:
    return ScriptedModel(list(steps))


# A result fenced as untrusted data (``crashoverride._agent.prompt.Fence``): the data inside it.
_FENCED = re.compile(
    r'<untrusted-data id="(?P<id>[0-9a-f]+)" source="[^"]*">\n(?P<data>.*)\n'
    r'</untrusted-data id="(?P=id)">',
    re.DOTALL,
)


def unfenced(text: str) -> str:
    match = _FENCED.fullmatch(text)
    return match["data"] if match else text


def tool_outputs(model: ScriptedModel) -> list[str]:
    """The tool results the model was sent, in order (from the recorded calls), unfenced."""
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


# ------------------------------------------------------------------------------------ polling


def wait_for(condition: Callable[[], Any], seconds: float = 20, what: str = "") -> None:
    """Poll ``condition`` (another thread's or process's doing) until it holds. ``seconds`` is
    a bound against hanging, not a measurement: figures belong in benchmarks/."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what or 'the condition'} did not hold within {seconds} s")
        time.sleep(0.01)


async def await_for(condition: Callable[[], Any], seconds: float = 20) -> None:
    """``wait_for`` for async tests: the loop goes on meanwhile."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled: conditions change in other threads)
            await anyio.sleep(0.01)
