"""Process-wide admission control: concurrency limit, single-flight and circuit breaker.

One ``CrashOverride`` serves threads, several event loops and trio at once, so nothing here is
bound to a loop: state sits behind a ``threading.Lock`` and every wait is a
``concurrent.futures.Future`` that sync code blocks on and async code awaits (see ``_bridge``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any


class Slots:
    """A counting semaphore whose waiters are futures, fair (FIFO) across threads and loops."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = threading.Lock()
        self._waiters: deque[Future[None]] = deque()

    def acquire(self) -> Future[None]:
        """Return a future that completes when a slot is held (already done if one was free)."""
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
        self.fingerprint = fingerprint
        # Result: True when the leader recovered, False otherwise.
        self.done: Future[bool] = Future()


class SingleFlight:
    """At most one recovery per fingerprint at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}

    def join(self, fingerprint: str) -> tuple[Flight, bool]:
        """Return the flight for ``fingerprint`` and whether the caller leads it."""
        with self._lock:
            flight = self._flights.get(fingerprint)
            if flight is not None:
                return flight, False
            flight = self._flights[fingerprint] = Flight(fingerprint)
            return flight, True

    def land(self, flight: Flight, recovered: bool) -> None:
        with self._lock:
            if self._flights.get(flight.fingerprint) is flight:
                del self._flights[flight.fingerprint]
        if not flight.done.done():
            flight.done.set_result(recovered)


class Breaker:
    """Per-fingerprint circuit breaker.

    After ``threshold`` failed recoveries within ``window`` seconds the circuit opens: recoveries
    for that fingerprint are skipped (no model call) until ``cooldown`` seconds have passed. Then
    one trial recovery runs; its success closes the circuit, its failure re-opens it.
    """

    def __init__(self, threshold: int, window: float, cooldown: float) -> None:
        self.threshold = threshold
        self.window = window
        self.cooldown = cooldown
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}
        self._open_until: dict[str, float] = {}

    def check(self, fingerprint: str) -> float | None:
        """Seconds left open for ``fingerprint``, or None when a recovery may run."""
        now = time.monotonic()
        with self._lock:
            until = self._open_until.get(fingerprint)
            if until is None:
                return None
            if now >= until:
                # Half-open: let this one through; its result decides.
                del self._open_until[fingerprint]
                self._failures[fingerprint] = deque([now] * (self.threshold - 1))
                return None
            return until - now

    def record(self, fingerprint: str, recovered: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if recovered:
                self._failures.pop(fingerprint, None)
                return
            times = self._failures.setdefault(fingerprint, deque())
            times.append(now)
            while times and now - times[0] > self.window:
                times.popleft()
            if len(times) >= self.threshold:
                self._open_until[fingerprint] = now + self.cooldown
                # Bound memory: the open entry carries the state now.
                self._failures.pop(fingerprint, None)


class Limits:
    """The admission state shared by every handler of one ``CrashOverride``."""

    def __init__(self, settings: Any) -> None:
        self.slots = Slots(settings.max_concurrent_recoveries)
        self.flights = SingleFlight()
        self.breaker = Breaker(
            settings.breaker_threshold, settings.breaker_window, settings.breaker_cooldown
        )
