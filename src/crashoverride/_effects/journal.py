"""Units of work, their attempts and the journal of their declared effects.

A unit of work is what an entry point protects and may run again: a request, a task call, a
decorated call, a ``with`` block, a follow-up. Its first run is one attempt; every later run of
any of its code is another: a replay (``rerun()``, ``replay_request()``, a single-flight
waiter's, a recipe's), each piece of agent code the recovery runs, a Celery retry or
redelivery of the same task id, a client retry with the same ``Idempotency-Key``.

An effect call is identified within its attempt by its key and how many calls with that key
came before it in the attempt (``n``): the n-th call of "charge order 17" in a replay is the
n-th call of it in the first run. An attempt that *consults* the journal finds that entry and,
when it finished, returns its result instead of running the effect again.

The first attempt of a unit that cannot have a history (a fresh in-process unit) only records,
and records lazily: the call's arguments are kept and its key is computed when a later attempt
first needs it, so an effect costs an object and a list append on the happy path.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final, Protocol

STARTED: Final = "started"  # begun and never seen to end: interrupted, or the process died
DONE: Final = "done"
FAILED: Final = "failed"  # raised an Exception: taken as not done, so it runs again


class Keyed(Protocol):
    """What the journal needs of an effect to key one of its calls (``effect.Effect``)."""

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str: ...

    def label_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str: ...


class Entry:
    """One effect call of a unit: what was called, and how it ended."""

    __slots__ = (
        "args", "at", "effect", "error", "key", "kwargs", "label", "n", "result", "serial", "state"
    )  # fmt: skip

    def __init__(self, effect: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        global serial
        serial += 1  # one thread's entries are ordered by it (see ``ambient_unit``)
        self.serial = serial
        self.effect: Keyed | None = effect
        self.args: tuple[Any, ...] | None = args
        self.kwargs: dict[str, Any] | None = kwargs
        self.key = ""  # set when first needed (``Journal.keyed``)
        self.label = ""
        self.n = 0
        self.state = STARTED
        self.result: Any = None
        self.error = ""
        self.at = time.time()

    @classmethod
    def stored(cls, key: str, n: int, label: str, state: str, result: Any, error: str) -> Entry:
        """An entry read back from a store (another process's): keyed, no call at hand."""
        entry = cls.__new__(cls)
        entry.serial = 0
        entry.effect = entry.args = entry.kwargs = None
        entry.key, entry.n, entry.label, entry.state = key, n, label, state
        entry.result, entry.error, entry.at = result, error, time.time()
        return entry

    def finish(self, result: Any) -> None:
        self.state, self.result = DONE, result

    def fail(self, error: BaseException) -> None:
        self.state, self.error = FAILED, f"{type(error).__name__}: {error}"

    def view(self) -> dict[str, Any]:
        """What the agent's ``effects()`` helper and the brief show (the caller redacts)."""
        shown: dict[str, Any] = {"effect": self.label, "key": self.key, "state": self.state}
        if self.state == DONE:
            shown["result"] = self.result
        elif self.state == FAILED:
            shown["error"] = self.error
        return shown


class Journal:
    """The journal of one unit, in this process. A store for units with an id outside the
    process (a task id, an idempotency key) hands the same journal to every attempt; other
    stores (Redis) subclass it and write through."""

    # True when some of the unit's calls may be missing (a ``with`` block that made more calls
    # than this thread keeps, see ``ambient_unit``): a call it does not find is uncertain.
    incomplete = False

    def __init__(self) -> None:
        self._lock = threading.Lock()  # an attempt's code may run effects in threads
        self._unkeyed: list[Entry] = []  # the first attempt's calls, keyed when needed
        self._first: dict[str, int] = {}  # calls per key in that first attempt
        self._entries: dict[tuple[str, int], Entry] = {}
        self._order: list[Entry] = []

    def recorded(self, entry: Entry) -> None:
        """The first attempt's call, not keyed yet (the happy path: no key is computed)."""
        self._unkeyed.append(entry)

    def keyed(self) -> None:
        with self._lock:
            pending, self._unkeyed = self._unkeyed, []
            for entry in pending:
                effect, args, kwargs = entry.effect, entry.args, entry.kwargs
                if effect is not None and args is not None and kwargs is not None:
                    try:
                        entry.key = effect.key_of(args, kwargs)
                        entry.label = effect.label_of(args, kwargs)
                    except Exception as error:  # the application's key= failed on them
                        # A key no call can have: the entry is listed, never matched.
                        entry.key = f"\x00unkeyed {id(entry)}"
                        entry.label = f"(an effect whose key= raised {type(error).__name__})"
                # else keyed already, by another journal that listed it (``ambient_unit``)
                entry.n = self._first.get(entry.key, 0)
                self._first[entry.key] = entry.n + 1
                entry.effect = entry.args = entry.kwargs = None  # hold no argument longer
                self._entries[(entry.key, entry.n)] = entry
                self._order.append(entry)

    def find(self, key: str, n: int) -> Entry | None:
        self.keyed()
        return self._entries.get((key, n))

    def begin(self, entry: Entry) -> None:
        """A keyed call of a consulting attempt begins (its entry is new, or one that raised
        and runs again)."""
        with self._lock:
            if self._entries.get((entry.key, entry.n)) is not entry:
                self._entries[(entry.key, entry.n)] = entry
                self._order.append(entry)

    def ended(self, entry: Entry) -> None:
        """``entry`` finished or failed (in place here; a store writing through says so)."""

    def adopt(self, entry: Entry) -> None:
        """An entry another process journaled (read back from a store): it takes the place of
        this journal's own, unless that one is done here (a result in hand beats one that
        could not be stored)."""
        self.keyed()
        with self._lock:
            mine = self._entries.get((entry.key, entry.n))
            if mine is None:
                self._entries[(entry.key, entry.n)] = entry
                self._order.append(entry)
            elif mine.state != DONE:
                mine.state, mine.result, mine.error = entry.state, entry.result, entry.error

    # The async effect path awaits these: a store that talks to a server (Redis) overrides
    # them so the event loop is never blocked; in this process they are the plain calls.
    async def afind(self, key: str, n: int) -> Entry | None:
        return self.find(key, n)

    async def abegin(self, entry: Entry) -> None:
        self.begin(entry)

    async def aended(self, entry: Entry) -> None:
        self.ended(entry)

    def entries(self) -> list[Entry]:
        self.keyed()
        with self._lock:
            return list(self._order)

    def __bool__(self) -> bool:
        return bool(self._unkeyed or self._order)


class Store(Protocol):
    """Where the journals of units with an outside id live (``MemoryStore``, Redis)."""

    def journal(self, unit_id: str) -> Journal: ...


class MemoryStore:
    """This process's journals by unit id, the most recent ``size`` units, each kept ``ttl``
    seconds: enough for a retry or a replay, bounded for a server that runs for months.
    ``make``: a new unit's journal (a store writing through keeps its journals here too)."""

    def __init__(
        self,
        size: int = 10_000,
        ttl: float = 3600.0,
        make: Callable[[str], Journal] | None = None,
    ) -> None:
        self._size, self._ttl, self._make = size, ttl, make
        self._lock = threading.Lock()
        self._journals: OrderedDict[str, tuple[float, Journal]] = OrderedDict()

    def journal(self, unit_id: str) -> Journal:
        now = time.monotonic()
        with self._lock:
            kept = self._journals.pop(unit_id, None)
            if kept is not None and kept[0] > now:
                journal = kept[1]
            else:
                journal = Journal() if self._make is None else self._make(unit_id)
            self._journals[unit_id] = (now + self._ttl, journal)
            while len(self._journals) > self._size:
                self._journals.popitem(last=False)
            return journal


class Unit:
    """A unit of work: its id (None: known to this process only) and its journal."""

    __slots__ = ("id", "journal")

    def __init__(self, unit_id: str | None = None, journal: Journal | None = None) -> None:
        self.id = unit_id
        self.journal = Journal() if journal is None else journal


class Attempt:
    """One run of a unit's code in this context; ``consults``: finds what earlier attempts did.

    A handler's attempt makes its unit only when something needs it (an effect call, a
    failure): a ``with`` block that calls no effect and does not fail allocates one object.
    """

    __slots__ = ("_unit", "consults", "counts", "opener", "parent")

    def __init__(
        self,
        unit: Unit | None,
        consults: bool,
        parent: Attempt | None = None,
        opener: object = None,
    ) -> None:
        self._unit = unit
        self.consults = consults
        self.counts: dict[str, int] | None = None
        self.parent = parent
        self.opener = opener  # the handler whose ``with`` opened it, to close it on exit

    @property
    def unit(self) -> Unit:
        unit = self._unit
        if unit is None:
            unit = self._unit = Unit()
        return unit

    def next(self, key: str) -> int:
        counts = self.counts
        if counts is None:
            counts = self.counts = {}
        n = counts.get(key, 0)
        counts[key] = n + 1
        return n


CURRENT: ContextVar[Attempt | None] = ContextVar("crashoverride_attempt", default=None)

# Whether any effect was ever declared in this process: until one is, entry points open no
# unit at all (the happy path of an application without effects is unchanged).
declared = False


def current_unit() -> Unit | None:
    attempt = CURRENT.get()
    return None if attempt is None else attempt.unit


def begin(unit: Unit, *, consults: bool) -> Attempt:
    """Run the following code of this context as an attempt of ``unit``; ``end`` it after."""
    attempt = Attempt(unit, consults, CURRENT.get())
    CURRENT.set(attempt)
    return attempt


def opened(opener: object) -> None:
    """A unit of work begins (an ``async with``, a decorated call): a new unit, its first
    attempt (nothing to consult) -- unless it runs inside one already. Then it is part of that
    one: whatever runs the enclosing unit again (a replay, a redelivery) runs this code again
    too, so its effects must be in the enclosing unit's journal (``closed`` finds nothing to
    close, and its recovery's unit is the enclosing one: ``current_unit``)."""
    current = CURRENT.get()
    if current is None:
        CURRENT.set(Attempt(None, False, None, opener))


def opened_as(opener: object, unit_id: str, journal: Journal) -> None:
    """A unit of work with an id outside this run begins (a task id, an idempotency key):
    ``journal`` holds what earlier runs with that id did, so this run consults it."""
    CURRENT.set(Attempt(Unit(unit_id, journal), True, CURRENT.get(), opener))


def closed(opener: object) -> Attempt | None:
    """That ``with`` ends: back to what ran before it. Returns the attempt it ended (None: it
    had opened none, or something else took over since — a generator's ``with`` left open,
    say: then that stays)."""
    attempt = CURRENT.get()
    if attempt is not None and attempt.opener is opener:
        CURRENT.set(attempt.parent)
        return attempt
    return None


# -- effects outside any unit: a ``with`` block's ------------------------------------------
#
# A ``with co.handler(...)`` block opens no unit: a context variable set on the way in and
# back on the way out would double what the happy path of a block costs. It takes ``serial``
# instead (``Handler.__enter__``). An effect called outside any unit is kept here, in a
# bounded list per thread, and when such a block fails, its unit is made of the calls this
# thread made since the block began: everything this thread ran in between is the block's
# body (or code it awaited, for a block that awaits). That is why a thread, not a context:
# the block's body is what ran on its thread since it began, whatever task it belonged to.

serial = 0  # the last entry's number, process-wide (``Entry.serial``)
AMBIENT_KEPT: Final = 256  # calls kept per thread outside any unit (with their arguments)


class _Kept(threading.local):
    def __init__(self) -> None:
        self.entries: deque[Entry] = deque(maxlen=AMBIENT_KEPT)
        self.dropped = 0  # the serial of the last entry pushed out


_kept = _Kept()


def ambient(entry: Entry) -> None:
    """An effect call outside any unit of work: kept for a ``with`` block that may fail."""
    kept = _kept
    entries = kept.entries
    if len(entries) == AMBIENT_KEPT:
        kept.dropped = entries[0].serial
    entries.append(entry)


def ambient_unit(since: int | None) -> Unit:
    """The unit of a ``with`` block that opened none: this thread's effect calls since
    ``serial`` was ``since`` (None: not known -- the block's handler was entered again while
    the block ran -- so every call kept). Incomplete when some were pushed out."""
    kept = _kept
    journal = Journal()
    since = 0 if since is None else since
    for entry in list(kept.entries):
        if entry.serial > since:
            journal.recorded(entry)
    if kept.dropped > since:
        journal.incomplete = True
    return Unit(None, journal)


def end(attempt: Attempt) -> None:
    """Back to what ran before ``attempt``, unless something else took over since (a
    generator's ``with`` left open, say): then that stays."""
    if CURRENT.get() is attempt:
        CURRENT.set(attempt.parent)
