"""Polling for the tests: bounded waits on what another thread or process does.

Scripted models and steps come from the public kit, ``crashoverride.testing``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest


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
