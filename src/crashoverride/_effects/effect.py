"""``CrashOverride.effect``: a function whose calls change the outside world, journaled.

Inside a unit of work the call is recorded in the unit's journal (``_effects.journal``);
outside one, in this thread's short list of such calls, for a ``with`` block that may fail
(``journal.ambient``). In an attempt that consults the
journal (a replay, agent code, a redelivery), a call already done returns its recorded result
without running; one begun and never seen to end asks ``probe`` whether it happened, and
without a probe raises ``EffectUncertain`` rather than risk doing it twice; one that raised
runs again.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable
from typing import Any, Final

from crashoverride._effects.journal import CURRENT, DONE, STARTED, Attempt, Entry, ambient
from crashoverride._errors import ConfigurationError, EffectUncertain


class _NotDone:
    """What a probe returns when the effect did not happen (``crashoverride.NOT_DONE``)."""

    _instance: _NotDone | None = None

    def __new__(cls) -> _NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "crashoverride.NOT_DONE"

    def __reduce__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Final = _NotDone()
_LABEL: Final = 120  # characters of a call's arguments its label shows


class Effect:
    """A declared effect: the function, how its calls are keyed, how to ask if one happened."""

    def __init__(
        self,
        func: Callable[..., Any],
        key: Callable[..., Any] | None,
        probe: Callable[..., Any] | None,
    ) -> None:
        if not callable(func):
            raise ConfigurationError("func", f"expected a callable, got {type(func).__name__}")
        if key is not None and not callable(key):
            raise ConfigurationError("key", f"expected a callable, got {type(key).__name__}")
        if probe is not None and not callable(probe):
            raise ConfigurationError("probe", f"expected a callable, got {type(probe).__name__}")
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigurationError(
                "func", "a generator function's effects happen while it is iterated: declare "
                "the function that makes each change instead"
            )  # fmt: skip
        self.func = func
        self.key = key
        self.probe = probe
        self.name = getattr(func, "__qualname__", None) or repr(func)
        self.asynchronous = inspect.iscoroutinefunction(func)
        if probe is not None and inspect.iscoroutinefunction(probe) and not self.asynchronous:
            raise ConfigurationError("probe", "an async probe needs an async effect")

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.key is not None:
            return f"{self.name}:{self.key(*args, **kwargs)}"
        return f"{self.name}:{_digest(args, kwargs)}"

    def label_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.key is not None:
            return str(self.key(*args, **kwargs))
        from crashoverride._security.text import safe_repr  # never on the happy path

        shown = ", ".join(
            [*map(safe_repr, args), *(f"{k}={safe_repr(v)}" for k, v in kwargs.items())]
        )
        if len(shown) > _LABEL:
            shown = shown[: _LABEL - 3] + "..."
        return f"{self.name}({shown})"


def _digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    # The arguments' values where JSON can say them (the same in every process), their repr
    # otherwise (an object without a repr of its own is the same object in this process only:
    # pass ``key=`` to name such a call by what identifies it).
    text = json.dumps([args, kwargs], sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def wrap(effect: Effect) -> Callable[..., Any]:
    """The function's stand-in: the same signature, journaled inside a unit of work."""
    func = effect.func
    if effect.asynchronous:

        @functools.wraps(func)
        async def journaled_async(*args: Any, **kwargs: Any) -> Any:
            attempt = CURRENT.get()
            if attempt is None:
                entry = Entry(effect, args, kwargs)
                ambient(entry)
                return await _kept_async(func, entry, args, kwargs)
            if not attempt.consults:
                entry = Entry(effect, args, kwargs)
                attempt.unit.journal.recorded(entry)
                return await _run_async(func, attempt, entry, args, kwargs)
            # Awaited journal calls: a store in Redis is never waited for on the loop.
            entry, then = await _aconsult(effect, attempt, args, kwargs)
            if then is _KNOWN:
                return entry.result
            if then is _PROBE:
                assert effect.probe is not None
                found = await effect.probe(*args, **kwargs)
                if found is not NOT_DONE:
                    entry.finish(found)
                    await attempt.unit.journal.aended(entry)
                    _said("info", "probed", entry, attempt)
                    return found
            return await _run_async(func, attempt, entry, args, kwargs)

        journaled_async.__crashoverride_effect__ = effect  # type: ignore[attr-defined]
        return journaled_async

    @functools.wraps(func)
    def journaled(*args: Any, **kwargs: Any) -> Any:
        attempt = CURRENT.get()
        if attempt is None:
            entry = Entry(effect, args, kwargs)
            ambient(entry)
            return _kept(func, entry, args, kwargs)
        if not attempt.consults:
            entry = Entry(effect, args, kwargs)
            attempt.unit.journal.recorded(entry)
            return _run(func, attempt, entry, args, kwargs)
        entry, then = _consult(effect, attempt, args, kwargs)
        if then is _KNOWN:
            return entry.result
        if then is _PROBE:
            assert effect.probe is not None
            found = effect.probe(*args, **kwargs)
            if _settled(attempt, entry, found):
                return found
        return _run(func, attempt, entry, args, kwargs)

    journaled.__crashoverride_effect__ = effect  # type: ignore[attr-defined]
    return journaled


# What a consulting attempt does with a call, once the journal answered.
_KNOWN: Final = "known"  # done before: its recorded result is returned
_PROBE: Final = "probe"  # begun before and never seen to end: the probe says whether it happened
_RUN: Final = "run"  # new, or it raised before: it runs


def _consult(
    effect: Effect, attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Entry, str]:
    """The entry of this call in the unit's journal, and what to do with it (``_KNOWN``...).

    A new call gets a new entry. An interrupted one is left to the probe; with no probe it is
    ``EffectUncertain``, raised here, before anything runs.
    """
    journal = attempt.unit.journal
    key = effect.key_of(args, kwargs)
    n = attempt.next(key)
    entry, then = _decided(effect, attempt, args, kwargs, key, n, journal.find(key, n))
    if then is _RUN:
        journal.begin(entry)
    return entry, then


async def _aconsult(
    effect: Effect, attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Entry, str]:
    """``_consult`` on the async path."""
    journal = attempt.unit.journal
    key = effect.key_of(args, kwargs)
    n = attempt.next(key)
    found = await journal.afind(key, n)
    entry, then = _decided(effect, attempt, args, kwargs, key, n, found)
    if then is _RUN:
        await journal.abegin(entry)
    return entry, then


def _decided(
    effect: Effect,
    attempt: Attempt,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str,
    n: int,
    found: Entry | None,
) -> tuple[Entry, str]:
    """What the journal's answer means: the entry and what to do with the call (a call that
    runs is journaled as started first, by the caller)."""
    if found is None:
        if attempt.unit.journal.incomplete:  # the call may be one of those not kept
            label = effect.label_of(args, kwargs)
            raise EffectUncertain(label, attempt.unit.id, kept=False)
        entry = Entry(effect, args, kwargs)
        entry.key, entry.label, entry.n = key, effect.label_of(args, kwargs), n
        entry.effect = entry.args = entry.kwargs = None
        return entry, _RUN
    if found.state == DONE:
        _said("info", "replayed", found, attempt)
        return found, _KNOWN
    if found.state == STARTED:
        if effect.probe is None:
            _said("warning", "uncertain", found, attempt)
            raise EffectUncertain(found.label, attempt.unit.id)
        return found, _PROBE
    found.state, found.error = STARTED, ""  # it raised before: it runs again
    return found, _RUN


def _settled(attempt: Attempt, entry: Entry, found: Any) -> bool:
    """The probe's answer: True when the effect had happened (``found`` is its result)."""
    if found is NOT_DONE:
        return False
    entry.finish(found)
    attempt.unit.journal.ended(entry)
    _said("info", "probed", entry, attempt)
    return True


def _kept(
    func: Callable[..., Any], entry: Entry, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A call outside any unit: the plain call, its outcome noted on its kept entry."""
    try:
        result = func(*args, **kwargs)
    except Exception as error:
        entry.fail(error)
        raise
    entry.finish(result)
    return result


async def _kept_async(
    func: Callable[..., Any], entry: Entry, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:
        result = await func(*args, **kwargs)
    except Exception as error:
        entry.fail(error)
        raise
    entry.finish(result)
    return result


def _run(
    func: Callable[..., Any],
    attempt: Attempt,
    entry: Entry,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    try:
        result = func(*args, **kwargs)
    except Exception as error:  # an interrupt or a cancellation leaves it begun: uncertain
        entry.fail(error)
        attempt.unit.journal.ended(entry)
        raise
    entry.finish(result)
    attempt.unit.journal.ended(entry)
    return result


async def _run_async(
    func: Callable[..., Any],
    attempt: Attempt,
    entry: Entry,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    # A recording attempt's journal is this process's: the plain call, nothing to await on the
    # happy path. A consulting one's may be in Redis: awaited, the loop goes on meanwhile.
    journal = attempt.unit.journal
    try:
        result = await func(*args, **kwargs)
    except Exception as error:
        entry.fail(error)
        if attempt.consults:
            await journal.aended(entry)
        else:
            journal.ended(entry)
        raise
    entry.finish(result)
    if attempt.consults:
        await journal.aended(entry)
    else:
        journal.ended(entry)
    return result


def _said(level: str, what: str, entry: Entry, attempt: Attempt) -> None:
    """An ``effect.*`` event (the replay path only: structlog is loaded by then)."""
    from crashoverride._observe import events
    from crashoverride._security.redact import scanned

    unit = attempt.unit.id
    events.emit(
        level,
        events.EFFECTS[what],
        effect=scanned(entry.label),
        unit=None if unit is None else scanned(unit),
    )
