"""``Block``: how an integration describes what it protects to the recovery core."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from ._state import RunState


class Block:
    """What an integration protects.

    Args:
        kind: ``"with"``, ``"call"``, ``"request"``, ``"task"``... (for events and reports).
        frame: The frame whose locals become ``caller`` (write-through), or None.
        globals_: The globals agent code runs in.
        bindings: Extra names in the agent's namespace.
        brief: Extra text for the agent: what this block is and how to finish it.
        check: Called in the owner context after the agent finished normally; returns None or
            True when recovered, else False or a reason. May return an awaitable.
        replay: For single-flight waiters: re-run the block once after another recovery of the
            same failure succeeded. Returns the block's value (or an awaitable of it).
        fields: Extra structlog fields (e.g. request method and path).
        caller: A mapping to expose as ``caller`` instead of the frame's locals.
        returns: The block produces a value: bind ``set_result`` and ``rerun`` for the agent.
        secrets: Values to mask in everything the recovery sends or records (e.g. the values
            of an HTTP request's secret headers).
    """

    __slots__ = (
        "bindings",
        "brief",
        "caller",
        "check",
        "fields",
        "frame",
        "globals",
        "kind",
        "replay",
        "returns",
        "secrets",
    )  # fmt: skip

    def __init__(
        self,
        *,
        kind: str,
        frame: FrameType | None,
        globals_: dict[str, Any],
        bindings: Mapping[str, Any] | None = None,
        brief: str = "",
        check: Callable[[RunState], Any] | None = None,
        replay: Callable[[], Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        caller: Mapping[str, Any] | None = None,
        returns: bool = False,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.frame = frame
        self.globals = globals_
        self.bindings = dict(bindings or {})
        self.brief = brief
        self.check = check
        self.replay = replay
        self.fields = dict(fields or {})
        self.caller = caller
        self.returns = returns
        self.secrets = secrets
