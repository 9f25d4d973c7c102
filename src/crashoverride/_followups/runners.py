"""Where follow-ups run: runners, and the one made current for a context.

* ``TaskGroupRunner`` (``_followups.taskgroup``): an anyio task group the application owns.
* ``ThreadRunner``: a supervised daemon thread per job; the process-wide default.
* ``SubprocessRunner``: a detached process, for work that must outlive this one.

Every runner waits for its jobs with ``join`` (bounded); see each class.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from crashoverride._followups.job import FollowupJob
from crashoverride._observe import events
from crashoverride._security.redact import scanned


@runtime_checkable
class FollowupRunner(Protocol):
    """Runs follow-ups in this process.

    ``fn`` runs the whole job (events included) and raises nothing but cancellation; ``name`` is
    the job id. Returns the id the runner tracks the job under (usually ``name``). Called from
    any thread; must keep a strong reference to the work until it ends.
    """

    def submit(self, fn: Callable[[], Awaitable[Any]], *, name: str) -> str: ...


@runtime_checkable
class JobRunner(Protocol):
    """Runs follow-ups elsewhere (another process, a queue) from their serialisable form."""

    def submit_job(self, job: FollowupJob) -> str: ...


_current: ContextVar[FollowupRunner | JobRunner | None] = ContextVar(
    "crashoverride_followup_runner", default=None
)
_default_lock = threading.Lock()
_default: ThreadRunner | None = None


@contextlib.contextmanager
def using(runner: FollowupRunner | JobRunner) -> Iterator[FollowupRunner | JobRunner]:
    """Make ``runner`` the one recoveries in this context submit follow-ups to."""
    token = _current.set(runner)
    try:
        yield runner
    finally:
        _current.reset(token)


def current_runner() -> FollowupRunner | JobRunner | None:
    return _current.get()


def default_runner() -> ThreadRunner:
    """The process-wide ``ThreadRunner``, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ThreadRunner()
        return _default


def resolve_runner(configured: Any = None) -> FollowupRunner | JobRunner:
    if configured is not None:
        return configured  # type: ignore[no-any-return]
    return _current.get() or default_runner()


def _cut_off(name: str, runner: str, grace: float) -> None:
    reason = f"cut off: still running {grace:g}s after shutdown began"
    events.emit("warning", events.FOLLOWUP_FAILED, followup_id=scanned(name),
              runner=scanned(runner), cut_off=True, reason=scanned(reason))  # fmt: skip


# ------------------------------------------------------------------------------------ thread


class ThreadRunner:
    """One daemon thread (with its own event loop) per job, supervised.

    At interpreter exit the runner waits up to ``grace`` seconds for running jobs, then
    reports each one still running as cut off (``followup.failed`` with ``cut_off=True``).
    Daemon threads keep a stuck job from hanging the exit forever; ``join`` waits explicitly.
    """

    def __init__(self, *, grace: float = 30.0) -> None:
        self.grace = grace
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._hooked = False

    def submit(self, fn: Callable[[], Awaitable[Any]], *, name: str) -> str:
        thread = threading.Thread(
            target=self._run, args=(fn, name), name=f"crashoverride-{name}", daemon=True
        )
        with self._lock:
            self._threads[name] = thread
            if not self._hooked:
                # Registered late, so it runs before logging's own exit hook (LIFO).
                atexit.register(self._at_exit)
                self._hooked = True
        thread.start()
        return name

    def _run(self, fn: Callable[[], Awaitable[Any]], name: str) -> None:
        async def main() -> None:
            await fn()

        try:
            asyncio.run(main())
        except Exception as problem:  # the thread is ours: nothing above it to tell
            events.emit(
                "error",
                events.FOLLOWUP_FAILED,
                followup_id=scanned(name),
                reason=scanned(f"runner error: {problem!r}"),
            )
        finally:
            with self._lock:
                self._threads.pop(name, None)

    @property
    def running(self) -> list[str]:
        with self._lock:
            return list(self._threads)

    def join(self, timeout: float | None = None) -> list[str]:
        """Wait for the running jobs, at most ``timeout`` seconds; returns the unfinished ids."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads.items())
        for _, thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        return [name for name, thread in threads if thread.is_alive()]

    def _at_exit(self) -> None:
        for name in self.join(self.grace):
            _cut_off(name, "ThreadRunner", self.grace)


# -------------------------------------------------------------------------------- subprocess


class SubprocessRunner:
    """Each follow-up in a detached Python process that outlives this one.

    Args:
        app: ``"module:attribute"`` naming the ``CrashOverride`` the child process uses (its
            model, tools and credentials); the module must be importable there. The job's mode
            and approver are its recovery's (``_followups.inherit``), not this app's alone.
        log_path: File the child's output (including its structlog events) is appended to;
            default: discarded.
        python: The interpreter to start.
        env: Environment of the child; default: this process's.
    """

    def __init__(
        self,
        app: str,
        *,
        log_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        if ":" not in app:
            raise ValueError("app must look like 'package.module:attribute'")
        self.app = app
        self.log_path = log_path
        self.python = python
        self.env = env
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def submit_job(self, job: FollowupJob) -> str:
        fd, path = tempfile.mkstemp(prefix="crashoverride-followup-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(job.to_payload(), file)
        with contextlib.ExitStack() as stack:
            out: Any = subprocess.DEVNULL
            if self.log_path is not None:
                out = stack.enter_context(open(self.log_path, "ab"))
            proc = subprocess.Popen(
                [self.python, "-m", "crashoverride.followups", self.app, path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                # Its own session: a Ctrl-C or SIGTERM to our process group does not reach it.
                start_new_session=True,
            )
        with self._lock:
            # Reap finished children so none lingers as a zombie.
            for name in [n for n, p in self._procs.items() if p.poll() is not None]:
                del self._procs[name]
            self._procs[job.id] = proc
        return f"{job.id} (pid {proc.pid})"

    def join(self, timeout: float | None = None) -> dict[str, int | None]:
        """Wait for the children started here; returns each one's exit code (None: running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            procs = dict(self._procs)
        codes: dict[str, int | None] = {}
        for name, proc in procs.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                codes[name] = proc.wait(left)
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes
