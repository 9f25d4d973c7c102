"""Polling for the tests: bounded waits on what another thread or process does.

Scripted models and steps come from the public kit, ``crashoverride.testing``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest

if TYPE_CHECKING:
    from agents.testing import ScriptedModel


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


def recurse_to_the_limit(forever: Callable[[int], Any], pads: range) -> list[BaseException]:
    """Run ``forever(0)`` (a protected function that recurses for ever) under ``pads`` extra
    frames each time, so its failure surfaces at every depth the limit can cut; assert each
    RecursionError was raised by the recursion itself (in ``forever``, or at the decorator's
    call of it), never by crashoverride's own code running out of stack. Returns them."""
    import traceback

    def padded(depth: int) -> int:
        return padded(depth - 1) if depth else forever(0)  # type: ignore[no-any-return]

    raised_all = []
    for pad in pads:
        with pytest.raises(RecursionError) as raised:
            padded(pad)
        innermost = traceback.extract_tb(raised.value.__traceback__)[-1]
        ours = innermost.name == "protected" and innermost.line == "return func(*args, **kwargs)"
        assert innermost.name == forever.__name__ or ours, (pad, innermost)
        raised_all.append(raised.value)
    return raised_all


def first_input(model: ScriptedModel) -> str:
    """The text the agent was first given (exception, traceback, brief)."""
    call = model.first_call
    assert call is not None
    items = call.input
    if isinstance(items, str):
        return items
    return "\n".join(str(item.get("content", "")) for item in items if isinstance(item, dict))
