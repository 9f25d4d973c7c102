"""Process-wide admission control: concurrency limit, single-flight and circuit breaker.

One ``CrashOverride`` serves threads, several event loops and trio at once, so nothing here is
bound to a loop: state sits behind a ``threading.Lock`` and every wait is a
``concurrent.futures.Future`` that sync code blocks on and async code awaits (see
``_placement.bridge``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    # Imported where a future is made: ``concurrent.futures`` imports ``logging``, and a failure
    # refused at admission (no credentials) builds these limits without ever waiting on one.
    from concurrent.futures import Future

    from crashoverride._admission.coordination import Coordination


class Slots:
    """A counting semaphore whose waiters are futures, fair (FIFO) across threads and loops."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = threading.Lock()
        self._waiters: deque[Future[None]] = deque()

    def acquire(self) -> Future[None]:
        """Return a future that completes when a slot is held (already done if one was free)."""
        from concurrent.futures import Future

        future: Future[None] = Future()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                future.set_result(None)
            else:
                self._waiters.append(future)
        return future

    def abandon(self, future: Future[None]) -> None:
        """Give up waiting; if the slot was granted meanwhile, hand it on."""
        with self._lock:
            try:
                self._waiters.remove(future)
                return
            except ValueError:
                pass
        if future.done():
            self.release()

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                nxt = self._waiters.popleft()
                if nxt.set_running_or_notify_cancel():
                    nxt.set_result(None)
                    return
            self._free += 1


class Flight:
    """One in-flight recovery that others with the same fingerprint can wait for."""

    __slots__ = ("done", "fingerprint")

    def __init__(self, fingerprint: str) -> None:
        from concurrent.futures import Future

        self.fingerprint = fingerprint
        # Result: True when the leader recovered, False otherwise.
        self.done: Future[bool] = Future()


# How long a landed flight still answers failures raised while it was in the air.
LANDED_FOR = 60.0


class SingleFlight:
    """At most one recovery per fingerprint at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}
        # The last landed flight per fingerprint, and when (``time.monotonic()``): a failure
        # raised while it was in the air that reaches ``join`` only after it landed (it waited
        # behind others for the loop's lane, ``_placement.lane``) is still its to answer.
        self._landed: dict[str, tuple[Flight, float]] = {}

    def join(self, fingerprint: str, raised_at: float | None = None) -> tuple[Flight, bool]:
        """Return the flight for ``fingerprint`` and whether the caller leads it.

        ``raised_at``: when the failure happened (``time.monotonic()``); a flight that landed
        since then is joined (already done) instead of starting another.
        """
        with self._lock:
            flight = self._flights.get(fingerprint)
            if flight is not None:
                return flight, False
            landed = self._landed.get(fingerprint)
            if landed is not None and raised_at is not None and landed[1] >= raised_at:
                return landed[0], False
            flight = self._flights[fingerprint] = Flight(fingerprint)
            return flight, True

    def land(self, flight: Flight, recovered: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if self._flights.get(flight.fingerprint) is flight:
                del self._flights[flight.fingerprint]
            self._landed[flight.fingerprint] = (flight, now)
            if len(self._landed) > 64:  # bounded: forget what no failure can still be waiting for
                for key, (_, at) in list(self._landed.items()):
                    if now - at > LANDED_FOR:
                        del self._landed[key]
        if not flight.done.done():
            flight.done.set_result(recovered)


class Admission(NamedTuple):
    """The breaker's answer for one failure (see ``Breaker.admit``)."""

    skip: str | None
    """Why this recovery must not run, in words; None when it may run."""
    trial: int
    """Nonzero when this caller holds the half-open trial: hand it back with ``abandon``."""


class _Circuit:
    """What the breaker remembers about one fingerprint."""

    __slots__ = ("failures", "open_until", "trial", "trial_until")

    def __init__(self) -> None:
        self.failures: deque[float] = deque()  # closed: times of the failures within the window
        self.open_until: float | None = None  # open until then, half-open after
        self.trial = 0  # the half-open trial in progress (0: none)
        self.trial_until = 0.0  # when that trial is given up on

    def forget_at(self, window: float) -> float:
        if self.open_until is None:
            return self.failures[-1] + window if self.failures else float("-inf")
        # After its cool-down (and trial) the failure stayed away for a whole window: it is new.
        return max(self.open_until, self.trial_until) + window


class Breaker:
    """Per-fingerprint circuit breaker.

    After ``threshold`` failed recoveries within ``window`` seconds the circuit opens: recoveries
    for that fingerprint are skipped (no model call) until ``cooldown`` seconds have passed. Then
    it is half-open: exactly one caller gets a trial recovery and the others are skipped until the
    trial's result is recorded; success closes the circuit, failure re-opens it. A trial that will
    record nothing (it ran no agent) is handed back with ``abandon``; one that is simply never
    heard of again expires after ``trial_timeout`` seconds (default: the cool-down), and the next
    caller becomes the trial.

    Memory stays bounded in servers that meet endless distinct failures. A fingerprint is
    forgotten ``window`` seconds after its last failure (closed) or after its cool-down and last
    trial (open); a sweep at most once per ``max(window, 1s)`` drops those, so an entry outlives
    that point by at most one sweep interval. On top, at most ``max_entries`` fingerprints are
    held: past that the least recently active is forgotten. Forgetting can only let a recovery
    run (its next failure counts from zero), never block one.
    """

    def __init__(
        self,
        threshold: int,
        window: float,
        cooldown: float,
        *,
        trial_timeout: float | None = None,
        max_entries: int = 10_000,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.threshold = threshold
        self.window = window
        self.cooldown = cooldown
        self.trial_timeout = cooldown if trial_timeout is None else trial_timeout
        self.max_entries = max_entries
        self._lock = threading.Lock()
        # Least recently active first: the order in which the cap forgets.
        self._circuits: OrderedDict[str, _Circuit] = OrderedDict()
        self._trials = itertools.count(1)
        self._sweep_every = max(window, 1.0)
        self._next_sweep = float("-inf")

    def __len__(self) -> int:
        """How many fingerprints are remembered (bounded: see the class docstring)."""
        return len(self._circuits)

    def check(self, fingerprint: str) -> float | None:
        """Seconds before ``fingerprint`` may be tried again, or None when this recovery may run.

        Open: the cool-down left. Half-open with a trial in progress: the time until that trial
        expires. None for a closed circuit, and for the one caller that becomes the trial (its
        ``record`` decides). ``admit`` gives the same answer in words, with a trial handle.
        """
        return self._decide(fingerprint)[0]

    def admit(self, fingerprint: str) -> Admission:
        """Decide like ``check``; the reason to skip in words, and the trial this caller holds."""
        left, half_open, trial = self._decide(fingerprint)
        if left is None:
            return Admission(None, trial)
        if half_open:
            return Admission(
                "circuit breaker half-open for this failure: a trial recovery is in progress and "
                f"others are skipped until it reports (at most {left:.0f}s more)",
                0,
            )
        return Admission(
            f"circuit breaker open for this failure ({left:.0f}s of cool-down left)", 0
        )

    def _decide(self, fingerprint: str) -> tuple[float | None, bool, int]:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            circuit = self._circuits.get(fingerprint)
            if circuit is None or circuit.open_until is None:
                return None, False, 0
            if now < circuit.open_until:
                return circuit.open_until - now, False, 0
            if circuit.trial and now < circuit.trial_until:
                return circuit.trial_until - now, True, 0
            # Half-open and nobody trying (or the last trial expired): this caller is the trial.
            circuit.trial = next(self._trials)
            circuit.trial_until = now + self.trial_timeout
            self._circuits.move_to_end(fingerprint)
            return None, True, circuit.trial

    def record(self, fingerprint: str, recovered: bool) -> None:
        """The result of a recovery that ran an agent for ``fingerprint``."""
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            if recovered:
                # It can be repaired after all: nothing counted against it applies any more.
                self._circuits.pop(fingerprint, None)
                return
            circuit = self._circuits.get(fingerprint)
            if circuit is None:
                circuit = self._circuits[fingerprint] = _Circuit()
                while len(self._circuits) > self.max_entries:
                    self._circuits.popitem(last=False)
            else:
                self._circuits.move_to_end(fingerprint)
            if circuit.open_until is not None:
                if now >= circuit.open_until:
                    self._open(circuit, now)  # half-open: one failed trial re-opens
                return  # still open: a straggler that started earlier adds nothing
            times = circuit.failures
            times.append(now)
            while times and now - times[0] > self.window:
                times.popleft()
            if len(times) >= self.threshold:
                self._open(circuit, now)

    def abandon(self, fingerprint: str, trial: int) -> None:
        """Hand back a half-open trial that will record no result (e.g. no slot freed in time).

        The next caller becomes the trial at once instead of after ``trial_timeout``. A zero or
        stale ``trial`` changes nothing, so every exit path may call this.
        """
        with self._lock:
            circuit = self._circuits.get(fingerprint)
            if trial and circuit is not None and circuit.trial == trial:
                circuit.trial = 0

    def _open(self, circuit: _Circuit, now: float) -> None:
        circuit.open_until = now + self.cooldown
        circuit.failures.clear()  # the open state carries the verdict now
        circuit.trial = 0

    def _sweep(self, now: float) -> None:
        # One pass per interval, over at most max_entries: cheap next to a recovery, and it
        # catches fingerprints that never fail (or are checked) again.
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every
        stale = [key for key, c in self._circuits.items() if now > c.forget_at(self.window)]
        for key in stale:
            del self._circuits[key]


class Limits:
    """The admission state shared by every handler of one ``CrashOverride``."""

    def __init__(self, settings: Any, coordinate: Callable[[Limits], Coordination]) -> None:
        self.slots = Slots(settings.max_concurrent_recoveries)
        self.flights = SingleFlight()
        self.breaker = Breaker(
            settings.breaker_threshold, settings.breaker_window, settings.breaker_cooldown
        )
        from crashoverride._repair.recipes import Recipes

        self.recipes = Recipes()  # state repairs of recovered ``with`` blocks, by fingerprint

        # Who decides admission and single-flight: this process, or the fleet (through Redis).
        # ``coordinate`` comes from the composition root (``_app``), which knows the backends.
        self.coordination = coordinate(self)
