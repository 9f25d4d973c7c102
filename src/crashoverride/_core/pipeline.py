"""The recovery algorithm, written once.

    admit → single-flight → slot → prepare → agent run → verdict → outcome → release

``run`` is the only implementation of these steps. Every entry point (``with``, ``async with``,
decorators, asyncio and Celery tasks, ASGI requests) describes its unit of work as a ``Block``
and calls ``_core.entry.recover_async`` or ``_core.entry.recover_sync``. Those begin the record and
ask admission's first question (can any model be reached?) before this module is even imported, then
hand over to ``recover_admitted_*`` here; the sync one drives the same coroutine through the
``owner-thread`` placement (see ``_placement.bridge``). The recovery's one ``Deadline`` becomes one
cancel scope around all the steps; nothing below restates the budget.

Cancellation, KeyboardInterrupt and SystemExit are never caught here: they propagate, after one
terminal event. Any other failure of ours ends with the user's exception re-raised and a note.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator
from inspect import isawaitable
from typing import Protocol, TypeVar

import anyio
import structlog  # noqa: F401  (a recovery that runs emits: async callers load it off the loop)

from crashoverride._agent import run as _agent
from crashoverride._agent.state import AgentInterrupted
from crashoverride._core.block import Check
from crashoverride._core.record import Record
from crashoverride._core.recovery import Decision, Recovery, internal_failure
from crashoverride._effects import journal as effects
from crashoverride._observe import events
from crashoverride._placement import bridge, waiting
from crashoverride._placement.bridge import Dispatch, Job, Placement

# A failure raised where a recovery's agent code runs is part of that recovery's work (a
# verification call, say) and never starts or waits for another.
from crashoverride._placement.inside import INSIDE
from crashoverride._placement.lane import lane
from crashoverride._placement.owner_thread import drive
from crashoverride._repair import journal, recipes, watch
from crashoverride._security.verdict import judge, reason

_LEADER_LOST = "the concurrent recovery of this failure did not recover it"
_OVERLOADED = "too many recoveries at once (max_concurrent_recoveries)"

C = TypeVar("C")
T = TypeVar("T")


class Coordinated(Protocol[C]):
    """The steps a recovery takes part in and a follow-up does not (see ``_Coordination``)."""

    async def admit(self, call: Dispatch) -> C | None:
        """Steps 1-3: admission, single-flight and a slot. A conclusion: no agent run here."""
        ...

    async def replay_recipe(self, agent_call: Dispatch, check: Check | None) -> C | None:
        """Step 4b: an earlier recovery's state repair; a conclusion when it held."""
        ...

    async def land(self, conclusion: C) -> None:
        """Step 8: tell the waiters in other processes (bounded)."""
        ...


def inside(recovery_id: str, job: Job, unit: effects.Unit, *, agent_code: bool = False) -> Job:
    """``job`` marked as part of recovery ``recovery_id`` while it runs (its awaitable too).

    It runs as a new attempt of the recovery's unit of work: a declared effect it calls that an
    earlier attempt (the failed run, earlier agent code) already did is found in the unit's
    journal, not done again (``_effects``). Every job passes here: agent code, replays, the
    re-run after repair, recipes, the check.

    For ``agent_code``, a ``KeyboardInterrupt`` it raises ends the run as ``AgentInterrupted``
    and is re-raised by the entry point once the recovery has cleaned up: raised inside an
    SDK task, it would otherwise tear the event loop down mid-recovery and lose the user's
    exception.
    """

    def marked() -> object:
        with _marked(recovery_id, unit, agent_code):
            value = job()
        if isawaitable(value):
            return _marked_async(recovery_id, unit, value, agent_code)
        return value

    return marked


async def _marked_async(
    recovery_id: str, unit: effects.Unit, awaitable: Awaitable[T], agent_code: bool
) -> T:
    with _marked(recovery_id, unit, agent_code):
        return await awaitable


@contextlib.contextmanager
def _marked(recovery_id: str, unit: effects.Unit, agent_code: bool) -> Iterator[None]:
    token = INSIDE.set(recovery_id)
    attempt = effects.begin(unit, consults=True)
    try:
        yield
    except KeyboardInterrupt as interrupt:
        if not agent_code:
            raise
        raise AgentInterrupted(interrupt) from None
    finally:
        effects.end(attempt)
        INSIDE.reset(token)


async def run(rec: Record[C], place: Placement, coordinated: Coordinated[C] | None = None) -> C:
    """All the steps, under the record's one deadline; returns the record's conclusion.

    ``rec`` is a ``Recovery`` (``_core.recovery``) or a follow-up's record (``followups._run``),
    admitted by ``_core.entry.admit``: the same steps, minus the coordination (``coordinated``,
    a recovery's) a follow-up does not take part in.
    """
    deadline = rec.deadline
    unit = rec.unit  # every job is an attempt of it (see ``inside``)

    def call(job: Job) -> Awaitable[object]:
        return place.call(inside(rec.id, job, unit))

    with anyio.CancelScope(deadline=deadline.backend_deadline()) as scope:
        conclusion = await _steps(rec, place, call, unit, coordinated)
    if scope.cancelled_caught:
        what = "" if rec.running else "waiting for a concurrent recovery or a free slot"
        conclusion = rec.timed_out(what)
    if coordinated is not None:  # 8. release: tell the waiters in other processes (bounded)
        await coordinated.land(conclusion)
    return conclusion


async def _steps(
    rec: Record[C],
    place: Placement,
    call: Dispatch,
    unit: effects.Unit,
    coordinated: Coordinated[C] | None,
) -> C:
    # 1. admit: the credentials were asked by the caller (``_core.entry.admit``), before any of
    # this was imported; what remains of admission is the coordination's.
    if coordinated is not None:
        refused = await coordinated.admit(call)
        if refused is not None:
            return refused
    # 4. prepare (in the owner's thread: its frame, its context)
    if place.name == "running-loop":
        try:
            await _agent.import_sdk_async()  # seconds, the first time: never on an app's loop
        except ImportError:
            pass  # the agent run reports it, as it does on every other placement
    async with lane():  # the heavy part of a start, one failure at a time on the loop
        job = await call(rec.prepare)
    assert isinstance(job, _agent.AgentJob)  # the placement hands values back as ``object``
    check = rec.block.check if rec.block is not None else None

    def agent_call(job_: Job) -> Awaitable[object]:
        return place.call(inside(rec.id, job_, unit, agent_code=True))

    # 4b. an earlier recovery's state repair (its recipe), before any model call
    if coordinated is not None:
        replayed = await coordinated.replay_recipe(agent_call, check)
        if replayed is not None:
            return replayed
    rec.started(place.name)
    # 5. the agent run; its code runs as the owner, through the placement
    run_ = await place.run_session(
        lambda dispatch, tools_at: _agent.run_agent(job, dispatch, tools_at), agent_call,
        rec.deadline,
    )  # fmt: skip
    # 6. verdict: the block's evidence, judged in the owner's context
    verdict: str | None = None
    if run_.failure is None and not rec.state.stopped and rec.settings.mode == "repair":
        verdict = (
            "the block has no check"
            if check is None
            else reason(await call(lambda: _judged(check, rec)))
        )
    # 7. outcome (and release: the record drops every reference into the failed code)
    return rec.concluded(run_, verdict)


class _Coordination:
    """A recovery's ``Coordinated`` steps: this process's or the fleet's coordination, the
    recipes, the slots (``rec.limits``)."""

    def __init__(self, rec: Recovery) -> None:
        self.rec = rec

    async def admit(self, call: Dispatch) -> Decision | None:
        rec = self.rec
        settings, limits = rec.settings, rec.limits
        coordination = limits.coordination  # in-process or fleet: the one pluggable piece
        # 1. admit
        within = INSIDE.get()
        if within is not None:
            return rec.skipped(f"raised by agent code of recovery {within}, which it is part of")
        admission = coordination.admit(rec)
        if admission.skip is not None:
            return rec.skipped(admission.skip)
        rec.trial = admission.trial  # handed back by the record unless an agent run reports
        # 2. single-flight: one agent run per fingerprint; the others wait for its whole life
        if settings.single_flight:
            # Raised through code a fix has replaced since: a concurrent recovery fixed it and
            # ended before this one got here (a loaded machine, a slow request path), or a fix
            # arrived from the fleet. It replays as that recovery's waiters did; only a replay
            # that fails again goes on to lead (or wait).
            if journal.ran_superseded(rec.exc):
                replayed = await _replay(rec, call)
                if replayed is not None:
                    return replayed
            joined = await coordination.join(rec, call)
            if joined.skip is not None:
                return rec.skipped(joined.skip)
            if not joined.leading:
                if not joined.recovered:
                    return rec.skipped(_LEADER_LOST)
                replayed = await _replay(rec, call)
                if replayed is not None:
                    return replayed
        # 3. slot
        slot = limits.slots.acquire()
        began = time.monotonic()
        acquired = False
        try:
            acquired = await waiting.wait_within(slot, settings.concurrency_wait)
        finally:
            if acquired:
                rec.slot = slot
            else:  # timed out, cancelled or interrupted: hand the slot on if it was just granted
                limits.slots.abandon(slot)
        rec.waited += time.monotonic() - began
        return None if acquired else rec.skipped(_OVERLOADED)

    async def replay_recipe(self, agent_call: Dispatch, check: Check | None) -> Decision | None:
        rec = self.rec
        if not recipes.applies(rec):
            return None
        recipe = rec.limits.recipes.get(rec.fingerprint)
        if recipe is not None and check is not None:
            held = await recipes.replay(rec, recipe, agent_call, lambda: _judged(check, rec))
            if held:
                return rec.recipe_replayed(recipe.turns)
            rec.limits.recipes.forget(rec.fingerprint)  # it did not hold: the agent runs
        recipes.record(rec)
        return None

    async def land(self, conclusion: Decision) -> None:
        await self.rec.limits.coordination.land(self.rec, conclusion)


async def _replay(rec: Recovery, call: Dispatch) -> Decision | None:
    """The unit run again through the repaired code (decorators, tasks, requests; a ``with``
    block cannot be); None when it cannot be or failed again."""
    replay = rec.block.replay if rec.block is not None else None
    if replay is None:
        return None
    try:
        value = await call(replay)
    except Exception as again:
        events.emit("info", events.REPLAY_FAILED, error=rec.redact(repr(again)), **rec.fields())
        watch.observe(again)  # a failure of the repaired code, as if its own handler saw it
        return None
    return rec.replayed(value)


def _judged(check: Check, rec: Record[object]) -> object:
    """The block's check, judged (in the owner's context): True, the reason, or an awaitable of
    it for an async check (the placement awaits it there)."""
    return judge(lambda: check(rec.state), what="the block's check")


# ------------------------------------------------------------------------------- entry points


async def recover_admitted_async(rec: Recovery, exc: BaseException) -> Decision | None:
    """Steps 2-8 for async code (``_core.entry`` began and admitted ``rec``). None: let
    ``exc`` go."""
    try:
        if bridge.cancel_pending():
            return None  # a failure raised while being cancelled: the cancellation goes on
        with events.bound(recovery_id=rec.id, fingerprint=rec.fingerprint):
            decision = await run(rec, bridge.placement(), _Coordination(rec))
            return decision
    except anyio.get_cancelled_exc_class():
        why = rec.block.why_cancelled if rec.block is not None else None
        rec.cancelled((why() if why is not None else None) or "cancelled by the caller")
        raise
    except Exception as problem:
        internal_failure(exc, problem, rec.redact)
        return None
    finally:
        rec.abandon()  # a no-op after a decision; hands on the flight and slot otherwise
        rec.limits.coordination.abandon(rec)


def recover_admitted_sync(rec: Recovery, exc: BaseException) -> Decision | None:
    """Steps 2-8 for synchronous code (``_core.entry`` began and admitted ``rec``)."""
    # Sync code called from async code: its loop is blocked until the recovery ends. Said once.
    blocking = bridge.loop_running_here()
    began = time.monotonic()
    try:
        with events.bound(recovery_id=rec.id, fingerprint=rec.fingerprint):
            decision = drive(lambda place: run(rec, place, _Coordination(rec)), rec.deadline)
            return decision
    except TimeoutError:
        return rec.timed_out()  # the agent ignored the deadline; it was left behind
    except Exception as problem:
        internal_failure(exc, problem, rec.redact)
        return None
    except BaseException:  # an interrupt or exit: one terminal event, then it propagates
        rec.cancelled("interrupted")
        raise
    finally:
        rec.abandon()
        rec.limits.coordination.abandon(rec)
        if blocking:
            blocked_ms = round((time.monotonic() - began) * 1000, 3)
            events.emit("warning", events.LOOP_BLOCKED, blocked_ms=blocked_ms, **rec.fields())
