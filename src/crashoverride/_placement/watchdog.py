"""Stop agent code that is still running on the owner's thread when the recovery's time is up.

Agent snippets run on the thread that owns the failed frame. A snippet that spins in pure Python
(``while True: pass``) holds that thread, so no timeout that needs the thread back (an asyncio
timeout, a cancel scope) can fire. While a snippet runs under :func:`guard`:

* at the deadline the watchdog thread raises ``Preempted`` in the owner's thread
  (``PyThreadState_SetAsyncExc``): this strike also reaches application code the snippet
  called, and a blocking C call once it returns;
* from then on the stop cannot be swallowed by any code below the guard on the owner's thread:
  what is stopped is found by the stack it runs on, not by where it was compiled (the snippet,
  what it passes to ``exec``, builds from code objects or imports from a string, the
  application code it calls). A frame that swallowed a stop is stopped again at every line it
  runs: the frame running when a ``Preempted`` is freed, and, when a strike lands while an
  earlier one is still kept somewhere (``except BaseException as e: errors.append(e)``),
  every frame below the guard. Code that lets the stop go on is left alone: ``finally``
  blocks, ``__exit__`` and finalizers run to their end, so an application's ``with
  semaphore:`` is still released;
* this takes a ``sys.settrace`` tracer on the owner's thread, installed there by the first
  ``Preempted`` made (a strike landing): before the deadline nothing is traced, the happy path
  costs nothing. The tracer never raises (CPython drops a trace function that raises, and the
  handler catching it would then spin untraced): it sends ``Preempted`` to its own thread, as
  the watchdog does, raised at the next call or backward jump. A ``Preempted`` made or freed
  puts the tracer back should something have removed it, and the watchdog strikes again every
  ``RESTRIKE`` seconds while the owner's thread is still running code below the guard;
* a strike landing in code CPython runs on the side (a gc callback, a finalizer) ends that
  code only, as nothing can propagate from there; it is kept from ``sys.unraisablehook`` (a
  wrapper put there by the first strike) and the next strike stops the code below the guard;
* ``Preempted`` derives from ``BaseException``, so ``except Exception`` lets it through anyway.

A snippet with top-level ``await`` is driven by :func:`stepped`, one guarded step at a time:
each stretch of it between two awaits holds the event loop just the same.

Nothing is raised outside the guarded code and no lock is ever left held. An asynchronous
exception is delivered only where the interpreter checks for pending work (the end of a call,
the start of a function, a backward jump). The watchdog strikes while holding a plain C lock,
and leaving the guard takes that lock first, so no strike comes after it; one sent just before
(at most one: later ones need code below the guard running), or by the tracer in the guarded
code's last lines, lands by the end of ``close()``, whose callers then simply run it again.
``with lock:`` on a C lock is inside its body as soon as the lock is taken, where a Python-level
lock (``threading.Condition``, ``Event``) can be interrupted after taking it and stay taken for
good; the watchdog thread is woken through a C ``SimpleQueue`` for the same reason. A strike is
never withdrawn with ``PyThreadState_SetAsyncExc(id, NULL)``: before 3.13 that leaves the
interpreter's "pending work" flag set for good, which slows every thread down and, with a trace
function installed, makes the next function call spin forever.

What it cannot stop: a blocking C call (``time.sleep``, ``lock.acquire``, a socket read) before
it returns, and code the snippet leaves to run elsewhere or later (a thread it starts, a callback
it schedules): that no longer holds the owner's thread, and the application's own threads and
callbacks, started while the snippet called it, look just the same (stopping those would break
the application). Interrupted code may leave state half-updated: the stop comes only once the
recovery has already failed by running out of time.
"""

from __future__ import annotations

import ctypes
import heapq
import inspect
import itertools
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Coroutine, Generator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import TraceFunction

T = TypeVar("T")

STOPPED = "agent code was still running when the recovery's time ran out and was interrupted"
RESTRIKE = 0.1  # seconds between strikes once out of time


class Preempted(BaseException):
    """Raised inside agent code that was still running when the recovery's time ran out."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # A strike landing (the tracer asks again with ``_Again``): it may land in a handler
        # that spins, or while an earlier one is kept.
        _retrace(struck=id(self) if type(self) is Preempted else None)

    def __del__(self) -> None:
        _retrace(freed=id(self))  # the last reference went: the code running now swallowed it


class _Again(Preempted):
    """The stop again, asked for by the tracer in a frame that swallowed it."""


def _retrace(*, struck: int | None = None, freed: int | None = None) -> None:
    """If this thread is out of time: note what a stop made or freed tells, trace again."""
    current = getattr(_this_thread, "guard", None)
    while current is not None and not current.stop:
        current = current.outer  # an enclosing recovery's guard may be out of time first
    if current is not None:
        current.retrace(struck=struck, freed=freed)


_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def _strike(thread: int, stop: type[Preempted]) -> None:
    """Raise ``stop`` in ``thread`` at its next check for pending work: the one way we strike.

    That check can come in Python code CPython runs on the side (a ``gc.callbacks`` entry, a
    ``__del__``, a weakref callback), where an exception ends that code but cannot propagate:
    CPython hands it to ``sys.unraisablehook`` ("Exception ignored in ...") and goes on. Such a
    stop is ours, not an error of the application's, so it is kept from the hook; the code
    below the guard is still stopped, by the next strike.
    """
    if not getattr(sys.unraisablehook, "_drops_preempted", False):
        sys.unraisablehook = _dropping_preempted(sys.unraisablehook)
    _set_async_exc(thread, stop)


def _dropping_preempted(
    hook: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    # Installed on the first strike only, never on the happy path; left in place afterwards
    # (something may have wrapped it since), passing on everything that is not a stop.
    def drop_preempted(unraisable: sys.UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, Preempted):
            hook(unraisable)

    drop_preempted._drops_preempted = True  # type: ignore[attr-defined]
    return drop_preempted


_this_thread = threading.local()  # .guard: the innermost open guard of this thread
# The watchdog's own frames (``Preempted`` being made or freed, leaving the guard) are never
# traced nor counted as agent code: the stop must not stop itself.
_OURS = globals()


class _Guard:
    """Guarded stretches of agent code against one deadline; entered again for each stretch.

    What is guarded is the call stack rooted at ``entry`` (the frame running the ``with``) on
    the owner's thread: every frame called from it, however it was compiled.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.thread = 0
        self.live = False  # open, and armed unless out of time already
        self.stop = False  # out of time: code below the guard is being stopped
        self.queued = False  # in the watchdog's heap
        self.retired = False  # closed for good: its heap entry is dropped, not kept to deadline
        self.tracing = False  # our tracer is installed (only ever once out of time)
        self.previous: TraceFunction | None = None
        self.outer: _Guard | None = None
        self.entry: FrameType | None = None  # the frame running the guarded code
        # Once out of time (the owner's thread only; cleared on leaving):
        self.swallowers: set[FrameType] = set()  # frames stopped again at every line
        self.struck: set[int] = set()  # the strikes' stops not freed yet
        self.unwinding: set[FrameType] = set()  # swallowers an exception is leaving
        self.barred = False  # entered out of time: every new frame below is a swallower

        def lines(frame: FrameType, event: str, arg: Any) -> TraceFunction:
            if self.stop and frame in self.swallowers:
                if event == "exception":
                    self.unwinding.add(frame)  # on its way out already
                elif event == "return" and frame in self.unwinding:
                    self.unwinding.discard(frame)  # left by the exception: nothing to add
                else:
                    # Caught it and goes on. Not raised here: CPython drops a trace function
                    # that raises, and the handler would then spin untraced. An asynchronous
                    # exception of its own, it is raised at the next call or backward jump.
                    self.unwinding.discard(frame)
                    _strike(self.thread, _Again)
            return self._lines  # not ``lines``: a function closing over itself is a cycle

        def calls(frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
            # Installed once out of time only; new frames are left alone (cleanup among them)
            # unless the guarded code began out of time.
            if self.barred and self.below(frame):
                self.swallowers.add(frame)
                return self._lines
            return None

        self._lines = lines
        self._calls = calls

    def __enter__(self) -> _Guard:
        self.thread = threading.get_ident()
        self.entry = sys._getframe(1)
        self.outer = getattr(_this_thread, "guard", None)
        _this_thread.guard = self
        self.previous = sys.gettrace()  # a debugger's or coverage's: restored on the way out
        self.live = True
        if self.deadline <= time.monotonic():
            # Out of time already: no first strike into this code, it stops at its first line;
            # later strikes still come should a handler spin.
            self.stop = self.barred = True
            self.retrace()
        try:
            _WATCHDOG.arm(self)  # last: from here on a strike may land at any check
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except Preempted:
            # The strike landed in close(), which cannot be struck again: finish leaving. The
            # guarded code has ended, so its own outcome stands.
            self.close()

    def close(self) -> None:
        """Leave the guard. Idempotent: a strike landing part-way leaves the rest to a rerun."""
        with _WATCHDOG.lock:  # the watchdog strikes only while holding it: none after this
            self.live = self.stop = False
        # A strike sent before that lands at the latest as the lock's exit call returns.
        if self.tracing:
            self.tracing = False
            sys.settrace(self.previous)
        self.barred = False
        self.swallowers.clear()  # frames kept since the stop: their finalizers run now
        self.unwinding.clear()
        self.struck.clear()
        if getattr(_this_thread, "guard", None) is self:
            _this_thread.guard = self.outer
        self.entry = None

    def retire(self) -> None:
        """Closed for good (its recovery's code has ended): the watchdog may forget it now."""
        self.close()
        _WATCHDOG.forget(self)
        # Its tracers close over it: without them it is freed by reference counting.
        self._lines = self._calls = _no_trace

    def below(self, frame: FrameType) -> bool:
        """Whether ``frame`` was called, however deeply, from the guarded code, and is not ours."""
        if frame.f_globals is _OURS:
            return False
        caller = frame.f_back
        while caller is not None:
            if caller is self.entry:
                return True
            caller = caller.f_back
        return False

    def running_below(self) -> bool:
        """Whether the owner's thread is running code below the guard (not the guard's own)."""
        frame = sys._current_frames().get(self.thread)
        agent = False
        while frame is not None:
            if frame is self.entry:
                return agent
            agent = agent or frame.f_globals is not _OURS
            frame = frame.f_back
        return False

    def retrace(self, *, struck: int | None = None, freed: int | None = None) -> None:
        """Install the tracer on this, the owner's, thread, and on the frames that swallowed.

        Called on the owner's thread only: on entry, or by a ``Preempted`` made there
        (``struck``: a strike landing) or freed there (``freed``: the frame running swallowed
        it).
        """
        running: list[FrameType] = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame is not self.entry:
            if frame.f_globals is not _OURS:
                running.append(frame)
            frame = frame.f_back
        if frame is None:
            return  # not below the guard: its code has ended, nothing to stop
        if freed is not None:
            self.struck.discard(freed)
            self.swallowers.update(running[:1])
        if struck is not None:
            if self.struck:  # an earlier strike's stop is still kept: nothing here may go on
                self.swallowers.update(running)
            self.struck.add(struck)
        if sys.gettrace() is not self._calls:
            self.tracing = True
            sys.settrace(self._calls)
        for frame in running:
            if frame in self.swallowers:
                frame.f_trace = self._lines


class _Watchdog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()  # C, like the lock
        self._heap: list[tuple[float, int, _Guard]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._retired = 0  # heap entries of retired guards, dropped in bulk (amortised O(1))

    def arm(self, guard_: _Guard) -> None:
        with self.lock:
            if not guard_.queued:
                guard_.queued = True
                heapq.heappush(self._heap, (guard_.deadline, next(self._order), guard_))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="crashoverride-watchdog", daemon=True
                )
                self._thread.start()
            self._wake.put(None)

    def forget(self, guard_: _Guard) -> None:
        # Without this every snippet's guard stayed queued until its recovery's deadline: a
        # server recovering often held thousands of them (and their closures) for minutes.
        with self.lock:
            if guard_.retired:
                return
            guard_.retired = True
            if guard_.queued:
                self._retired += 1
                if self._retired * 2 > len(self._heap):
                    self._heap = [entry for entry in self._heap if not entry[2].retired]
                    heapq.heapify(self._heap)
                    self._retired = 0

    def _watch(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    guard_ = heapq.heappop(self._heap)[2]
                    guard_.queued = False
                    if guard_.retired:
                        self._retired -= 1
                        continue
                    if not guard_.live:
                        continue
                    # The first strike always; later ones only into code below the guard,
                    # never into the code leaving it.
                    if not guard_.stop or guard_.running_below():
                        guard_.stop = True
                        _strike(guard_.thread, Preempted)
                    guard_.queued = True
                    heapq.heappush(self._heap, (now + RESTRIKE, next(self._order), guard_))
                timeout = self._heap[0][0] - now if self._heap else None
            try:
                self._wake.get(timeout=timeout)
            except queue.Empty:
                pass


_WATCHDOG = _Watchdog()


def _no_trace(frame: FrameType, event: str, arg: Any) -> TraceFunction:
    return _no_trace  # a retired guard's tracer: never installed again


class _Unguarded:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None

    def close(self) -> None:
        return None

    def retire(self) -> None:
        return None


def guard(deadline: float | None) -> _Guard | _Unguarded:
    """Run the body with the watchdog armed for ``deadline`` (``time.monotonic`` seconds).

    The one strike can land as ``__exit__`` begins, before it runs: then ``Preempted`` leaves the
    ``with`` and the caller must ``close()`` the guard, as :func:`guarded` does.
    """
    return _Unguarded() if deadline is None else _Guard(deadline)


def guarded(deadline: float | None, fn: Callable[..., T], /, *args: Any) -> T:
    """Return ``fn(*args)`` run under :func:`guard`."""
    watch = guard(deadline)
    try:
        return _run(watch, fn, *args)
    finally:
        watch.retire()


def _run(watch: _Guard | _Unguarded, fn: Callable[..., T], /, *args: Any) -> T:
    try:
        with watch:
            return fn(*args)
    except BaseException:
        watch.close()  # a no-op unless something landed as __exit__ began, before it ran
        raise


@types.coroutine
def stepped(coro: Coroutine[Any, Any, T], deadline: float | None) -> Generator[Any, Any, T]:
    """Await ``coro`` with every synchronous stretch of it (between its awaits) guarded.

    What it yields goes to the event loop unchanged, and what the loop sends or throws goes back
    into it, so this works on any event loop (asyncio, trio).
    """
    watch = guard(deadline)  # one guard, entered per step: one place in the watchdog's heap
    thrown: BaseException | None = None
    sent: Any = None
    try:
        while True:
            try:
                if thrown is None:
                    yielded = _run(watch, coro.send, sent)
                else:
                    yielded = _run(watch, coro.throw, thrown)
            except StopIteration as stop:
                value: T = stop.value
                return value
            except Preempted:
                if thrown is not None:  # stopped while handling a cancellation: that goes on
                    raise thrown from None
                raise
            thrown = sent = None
            try:
                sent = yield yielded
            except GeneratorExit:
                raise
            except BaseException as exc:  # cancellation and the like: the snippet gets it
                thrown = exc
    finally:
        if inspect.getcoroutinestate(coro) != inspect.CORO_CLOSED:
            _close(watch, coro)
        watch.retire()


def _close(watch: _Guard | _Unguarded, coro: Coroutine[Any, Any, Any]) -> None:
    """Close a snippet left suspended; its cleanup is guarded too, and may not outlast it."""
    try:
        _run(watch, coro.close)
    except Preempted:
        pass  # out of time in its cleanup as well: the exception on the way out stands
