"""The sync and async drivers of a recovery: admission, waits, placement, decision.

Both follow the same steps; they differ only in how they wait and where the agent runs.
Cancellation, KeyboardInterrupt and SystemExit are never caught here: they propagate.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from . import _bridge, _log
from ._agent import AgentRun, import_sdk_async, run_agent
from ._block import Block
from ._limits import Limits
from ._recovery import Decision, Recovery, internal_failure
from ._settings import Settings

_LEADER_LOST = "the concurrent recovery of this failure did not recover it"


def recover_sync(
    settings: Settings, limits: Limits, exc: BaseException, block: Block
) -> Decision | None:
    """Recover from synchronous code. None means: crashoverride failed, re-raise ``exc``."""
    try:
        rec = Recovery(settings, limits, exc, block)
    except Exception as problem:
        internal_failure(exc, problem)
        return None
    try:
        with _log.bound(recovery_id=rec.id, fingerprint=rec.fingerprint):
            return _run_sync(rec)
    except Exception as problem:
        internal_failure(exc, problem)
        return None
    finally:
        # Interrupted or broken: the flight and slot must still be handed on.
        rec.abandon()


def _run_sync(rec: Recovery) -> Decision:
    settings = rec.settings
    reason = rec.admission()
    if reason is not None:
        return rec.skipped(reason)
    if not rec.join_flight():
        assert rec.flight is not None
        began = time.monotonic()
        done = _wait_sync(rec.flight.done, settings.timeout + _bridge.GRACE)
        rec.waited += time.monotonic() - began
        if done and not rec.flight.done.result():
            return rec.skipped(_LEADER_LOST)
        if done and rec.block is not None and rec.block.replay is not None:
            try:
                value = rec.block.replay()
            except Exception as again:
                _log.emit("info", "recovery.replay_failed", error=repr(again), **rec.fields())
            else:
                return rec.replayed(value)
    slot = rec.limits.slots.acquire()
    began = time.monotonic()
    if not _wait_sync(slot, settings.concurrency_wait):
        rec.limits.slots.abandon(slot)
        return rec.skipped("too many recoveries at once (max_concurrent_recoveries)")
    rec.waited += time.monotonic() - began
    rec.slot = slot
    job = rec.prepare()
    placement = _bridge.placement_sync()
    rec.started(placement)
    began = time.monotonic()
    run: AgentRun | None = None
    failure: str | None = None
    try:
        run = _bridge.run_sync(lambda dispatch: run_agent(job, dispatch), job.deadline)
    except TimeoutError:
        failure = f"timed out after {settings.timeout:g}s"
    finally:
        if placement == "worker-thread-blocking":
            blocked_ms = round((time.monotonic() - began) * 1000, 3)
            _log.emit("warning", _log.LOOP_BLOCKED, blocked_ms=blocked_ms, **rec.fields())
    return rec.concluded(run, failure)


def _wait_sync(future: Any, timeout: float) -> bool:
    import concurrent.futures

    done, _ = concurrent.futures.wait([future], timeout=timeout)
    return bool(done)


async def recover_async(
    settings: Settings, limits: Limits, exc: BaseException, block: Block
) -> Decision | None:
    """Recover from async code on any anyio backend. None: crashoverride failed; re-raise."""
    try:
        rec = Recovery(settings, limits, exc, block)
    except Exception as problem:
        internal_failure(exc, problem)
        return None
    try:
        with _log.bound(recovery_id=rec.id, fingerprint=rec.fingerprint):
            return await _run_async(rec)
    except Exception as problem:
        internal_failure(exc, problem)
        return None
    finally:
        # Cancelled or broken: the flight and slot must still be handed on.
        rec.abandon()


async def _wait_async(future: Any, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await _bridge.wait_future(future)
    return bool(future.done())


async def _run_async(rec: Recovery) -> Decision:
    settings = rec.settings
    reason = rec.admission()
    if reason is not None:
        return rec.skipped(reason)
    if not rec.join_flight():
        assert rec.flight is not None
        began = time.monotonic()
        done = await _wait_async(rec.flight.done, settings.timeout + _bridge.GRACE)
        rec.waited += time.monotonic() - began
        if done and not rec.flight.done.result():
            return rec.skipped(_LEADER_LOST)
        if done and rec.block is not None and rec.block.replay is not None:
            try:
                value = rec.block.replay()
                if hasattr(value, "__await__"):
                    value = await value
            except Exception as again:
                _log.emit("info", "recovery.replay_failed", error=repr(again), **rec.fields())
            else:
                return rec.replayed(value)
    slot = rec.limits.slots.acquire()
    began = time.monotonic()
    waited = False
    try:
        acquired = await _wait_async(slot, settings.concurrency_wait)
        waited = True
    finally:
        if not waited:  # cancelled while queued: hand the slot on if it was just granted
            rec.limits.slots.abandon(slot)
    if not acquired:
        rec.limits.slots.abandon(slot)
        return rec.skipped("too many recoveries at once (max_concurrent_recoveries)")
    rec.waited += time.monotonic() - began
    rec.slot = slot
    if _bridge.on_asyncio():
        # ``import agents`` takes seconds: never on the application's event loop.
        await import_sdk_async()
    job = rec.prepare()
    rec.started(_bridge.placement_async())
    run: AgentRun | None = None
    failure: str | None = None
    try:
        run = await _bridge.run_async(lambda dispatch: run_agent(job, dispatch), job.deadline)
    except TimeoutError:
        failure = f"timed out after {settings.timeout:g}s"
    return rec.concluded(run, failure)
