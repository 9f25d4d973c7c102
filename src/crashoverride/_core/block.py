"""``Block``: what an entry point protects, described once for the pipeline.

Every entry point (``with``, decorator, task, request, follow-up) builds one. It says what the
block is (for the agent and the events), which names the agent's namespace gets, how to tell
that the block was recovered (the evidence), and how a single-flight waiter re-runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import FrameType, MappingProxyType
from typing import Any

from crashoverride._agent.state import NO_RESULT, RunState
from crashoverride._effects.journal import Unit, current_unit
from crashoverride._security.brief import NO_BRIEF, Brief
from crashoverride._security.verdict import judge

Check = Callable[[RunState], Any]

NO_EVIDENCE_WITH = (
    "no evidence of recovery: the agent set no variable of the block through caller[...] and "
    "the handler has no postcondition"
)
NO_EVIDENCE_CALL = "the agent finished without set_result() or rerun()"


class Block:
    """What an entry point protects.

    Args:
        kind: ``"with"``, ``"call"``, ``"request"``, ``"task"``... (for events and reports).
        frame: The frame whose locals become ``caller`` (write-through), or None.
        globals_: The globals agent code runs in.
        bindings: Extra names in the agent's namespace.
        brief: What this block is and how to finish it, for the agent: a ``Brief``, whose
            trusted parts are shown as instructions and whose values (a request's method and
            target, a task's id) are fenced as data, so text an attacker chose cannot pass for
            instructions. A ``str`` is refused: nothing can tell its trusted text from a value.
        check: The evidence that the block was recovered, called in the owner's context after
            the agent finished: True when recovered; anything else, None included, is not (a
            string is the reason; one rule for every check, ``_security.verdict``). May
            return an awaitable. Required: a block without a check is never "recovered" (the
            model's last message is not evidence). It gets the run's state: a check that saw
            the unit run through the repaired code (a re-run, a replayed request) or judged
            the application's own postcondition says so in ``state.verified_by``; only such
            a recovery's fix record is published to the fleet.
        replay: For single-flight waiters: re-run the block once after another recovery of the
            same failure succeeded. Returns the block's value (or an awaitable of it).
        fields: Extra structlog fields (e.g. request method and path).
        caller: A mapping to expose as ``caller`` instead of the frame's locals.
        returns: The block produces a value: bind ``set_result`` and ``rerun`` for the agent.
        secrets: Values to mask in everything the recovery sends or records.
        why_cancelled: Says why, when the recovery is cancelled from outside (e.g. "the client
            disconnected"), for its ``recovery.cancelled`` event.
        repair_only: This occurrence cannot be recovered (e.g. a response that had started),
            only the code for later ones: when the check holds the outcome is ``"repaired"``
            (event ``recovery.repaired``) and the exception is still re-raised.
        unit: The unit of work whose declared effects the recovery's replays and agent code
            find in its journal (``_effects``). Default: the one open in this context when the
            block is described, which is the failed code's (a handler, a request, a task).
    """

    __slots__ = (
        "bindings", "brief", "caller", "check", "fields", "frame", "globals", "kind",
        "repair_only", "replay", "returns", "secrets", "unit", "why_cancelled",
    )  # fmt: skip

    def __init__(
        self,
        *,
        kind: str,
        frame: FrameType | None,
        globals_: dict[str, Any],
        check: Check | None,
        bindings: Mapping[str, Any] | None = None,
        brief: Brief = NO_BRIEF,
        replay: Callable[[], Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        caller: Mapping[str, Any] | None = None,
        returns: bool = False,
        secrets: tuple[str, ...] = (),
        why_cancelled: Callable[[], str | None] | None = None,
        repair_only: bool = False,
        unit: Unit | None = None,
    ) -> None:
        if not isinstance(brief, Brief):
            raise TypeError(f"a block's brief is a Brief, got {type(brief).__name__}")
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
        self.why_cancelled = why_cancelled
        self.repair_only = repair_only
        self.unit = unit if unit is not None else current_unit()

    def release(self) -> None:
        """Drop every reference into the failed code (frames, bound methods, arguments).

        Bindings often hold bound methods of the integration object that holds this block; that
        cycle would keep a request's frames and locals alive until a full garbage collection.
        """
        self.frame = None
        self.caller = None
        self.bindings = {}
        self.check = None
        self.replay = None
        self.why_cancelled = None
        self.globals = {}
        self.unit = None


# ------------------------------------------------------------------------------ with blocks


WITH_BLOCK_BRIEF = """\
This is a `with` block. Execution resumes after the whole block, not at the failed statement,
so every variable the code after the block needs must hold its intended value when you finish
(write it with `caller["name"] = value`)."""


def with_block(
    postcondition: Callable[..., Any] | None, frame: FrameType | None, unit: Unit | None = None
) -> Block:
    """The block of a ``with`` / ``async with`` statement (``frame`` holds the statement);
    ``unit``: the unit of work the block was (ended before its recovery starts)."""
    from crashoverride._placement.frames import CallerLocals

    caller = CallerLocals(frame) if frame is not None else None
    return Block(
        kind="with",
        frame=frame,
        globals_=frame.f_globals if frame is not None else {},
        caller=caller,
        brief=Brief(WITH_BLOCK_BRIEF),
        check=functools.partial(_check_with, postcondition, caller),
        unit=unit,
    )


def _check_with(postcondition: Callable[..., Any] | None, caller: Any, state: RunState) -> Any:
    if postcondition is not None:
        state.verified_by = "postcondition"  # counts only if it holds (the verdict)
        return judge(lambda: postcondition(caller), what="the postcondition")
    if caller is None or not caller.writes:
        return NO_EVIDENCE_WITH
    return True


# ------------------------------------------------------------------------------ function calls


def call_block(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException,
    *,
    postcondition: Callable[..., Any] | None = None,
    kind: str = "call",
    brief: Brief | None = None,
    fields: Mapping[str, Any] | None = None,
    bindings: Mapping[str, Any] | None = None,
) -> Block:
    """The block of one call of ``func``: the agent ends it with ``set_result`` or ``rerun``."""
    from crashoverride._agent.prompt import CALL_BRIEF

    frame = _function_frame(exc, func)
    name = getattr(func, "__qualname__", repr(func))
    return Block(
        kind=kind,
        frame=frame,
        globals_=getattr(func, "__globals__", None) or (frame.f_globals if frame else {}),
        # The call has ended: its locals are for reading; the result is set explicitly.
        caller=MappingProxyType(dict(frame.f_locals)) if frame is not None else None,
        bindings={"args": args, "kwargs": kwargs, "function": func, **(bindings or {})},
        brief=Brief(CALL_BRIEF, function=name) if brief is None else brief,
        check=functools.partial(_check_call, postcondition, func, args, kwargs),
        replay=functools.partial(func, *args, **kwargs),
        returns=True,
        fields={"function": name} if fields is None else fields,
    )


def _function_frame(exc: BaseException, func: Callable[..., Any]) -> Any:
    """The called function's own frame in the traceback (wrappers' frames come first)."""
    target = getattr(func, "__code__", None)
    tb = exc.__traceback__
    first_inner = tb.tb_next if tb is not None else None
    while tb is not None:
        if tb.tb_frame.f_code is target:
            return tb.tb_frame
        tb = tb.tb_next
    return first_inner.tb_frame if first_inner is not None else None


def result_view(value: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
    """What a call's postcondition receives."""
    return MappingProxyType({"result": value, "args": args, "kwargs": kwargs or {}})


def _check_call(
    postcondition: Callable[..., Any] | None,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    state: RunState,
) -> Any:
    def accept(value: Any) -> Any:
        state.result = value
        if state.rerun:
            state.verified_by = "rerun"  # the call ran again through the repaired code
        if postcondition is None:
            return True
        state.verified_by = state.verified_by or "postcondition"
        view = result_view(value, args, kwargs)
        return judge(lambda: postcondition(view), what="the postcondition")

    if state.rerun:
        # The agent repaired the code and asked for the call to be made again, once.
        return judge(lambda: _then(func(*args, **kwargs), accept), what="the re-run after repair")
    if state.result is NO_RESULT:
        return NO_EVIDENCE_CALL
    return accept(state.result)


def _then(value: Any, accept: Callable[[Any], Any]) -> Any:
    if hasattr(value, "__await__"):
        return _then_async(value, accept)
    return accept(value)


async def _then_async(awaitable: Any, accept: Callable[[Any], Any]) -> Any:
    verdict = accept(await awaitable)
    if hasattr(verdict, "__await__"):
        verdict = await verdict
    return verdict
