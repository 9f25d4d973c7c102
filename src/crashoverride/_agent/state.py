"""Mutable state of one agent run, written by the agent's tools and namespace helpers."""

from __future__ import annotations

from typing import Any

from crashoverride._observe.report import Usage
from crashoverride._security.audit import ToolCallRecord


class AgentExit(Exception):
    """Agent code called ``sys.exit()``: a recovery never exits the process; it ends instead."""


class AgentInterrupted(AgentExit):
    """Agent code raised ``KeyboardInterrupt``: the run ends; the entry point re-raises it."""

    def __init__(self, interrupt: KeyboardInterrupt) -> None:
        super().__init__("agent code raised KeyboardInterrupt")
        self.interrupt = interrupt


NO_RESULT: Any = object()


class AgentRun:
    """What the SDK run produced (or, with ``failure`` set, why there was none)."""

    def __init__(self, failure: str | None = None) -> None:
        self.final_output = ""
        self.turns = 0
        self.usage = Usage()
        self.failure = failure


class RunState:
    """What the agent decided, as opposed to what the SDK run returned."""

    def __init__(self) -> None:
        self.records: list[ToolCallRecord] = []
        self.gave_up: str | None = None
        self.replacement: BaseException | None = None
        self.aborted: str | None = None
        # A KeyboardInterrupt raised in agent code: the run ends, the entry point re-raises it.
        self.interrupted: BaseException | None = None
        self.result: Any = NO_RESULT
        self.rerun = False
        # How the block's check verified the repaired code, if it did: "rerun" (the unit ran
        # again through it), "replay_request", "postcondition" (the application's own check
        # held). None: the agent's word only (``set_result``, ``respond``, ``caller[...]``);
        # such a recovery's fix is never published to the fleet.
        self.verified_by: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether the agent ended the run through a tool (no further model turn needed)."""
        return (
            self.gave_up is not None
            or self.replacement is not None
            or self.aborted is not None
            or self.interrupted is not None
        )

    def ended_by(self, exc: Exception) -> str | None:
        """If agent code's ``exc`` ends the run (``sys.exit()``, ``KeyboardInterrupt``), record
        it and say so to the model; None for an ordinary failure."""
        if not isinstance(exc, AgentExit):
            return None
        self.aborted = str(exc)
        if isinstance(exc, AgentInterrupted):
            self.interrupted = exc.interrupt
        return f"{exc}; the recovery is over (a recovery never exits the process)."

    # Namespace helpers: plain functions the agent calls from exec_python.

    def give_up(self, reason: str = "") -> str:
        """End the recovery; the original exception is re-raised with ``reason`` attached."""
        self.gave_up = str(reason) or "no reason given"
        return "Recovery ended: the original exception will be re-raised."

    def raise_instead(self, exc: BaseException) -> str:
        """End the recovery by raising ``exc`` (chained to the original) instead."""
        if not isinstance(exc, Exception):
            raise TypeError("raise_instead() needs an Exception instance")
        self.replacement = exc
        return f"Recovery ended: {type(exc).__name__} will be raised from the original exception."

    def set_result(self, value: Any) -> str:
        """Decorator form: the value the failed call returns to its caller."""
        self.result = value
        return "Result set."

    def request_rerun(self) -> str:
        """Decorator form: call the function again, once, with the same arguments."""
        self.rerun = True
        return "The call will be made once more when you finish."
