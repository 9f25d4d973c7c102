"""Diagnose mode's read-only guarantee: each inspection runs in a throwaway copy of the process.

``inspect_python`` forks. The child is a copy-on-write snapshot: it sees every object of the
process as it is at that instant, and whatever it changes in memory (a local, a queue, a class,
``os.environ``, ``sys.modules``) changes only its own copy. So memory needs no list of allowed
names. What a copy does share with the process is the outside world: open descriptors, memory
mapped as shared, files, the network, other processes. Before the expression runs the child

1. makes every shared writable mapping read-only (``/proc/self/maps``, ``mprotect``): a write
   to ``mmap.mmap(-1, n)``, ``multiprocessing.Value`` or a shared file mapping kills the child
   (and the filter below never lets it be made writable again);
2. closes every descriptor it inherited (sockets, log files, pipes, event loop wake-ups) and
   puts ``/dev/null`` on 0, 1 and 2: a pooled connection, a queue's pipe or an open file the
   process holds cannot be used from the copy;
3. installs a PEP 578 audit hook, which cannot be removed, refusing what would reach outside:
   opening files for writing, removing, renaming and changing files, every socket operation
   (new sockets, DNS lookups), starting or signalling processes, ``fork``, ``ctypes`` and
   ``sqlite3`` (its own file access bypasses ``open``).

The child then evaluates the expression, renders the result (``describe_result``: the text the
model would get from any tool) and writes it to a pipe; it ends with ``os._exit``, never
returning into the process's own code. The parent waits until the recovery's deadline (or
``UNBOUNDED_CAP`` without one) and kills the child then; the text it returns goes through the
same redaction as every tool result.

On x86-64 a seccomp filter (``_diagnose.syscalls``) also has the kernel refuse those system calls,
for native code that raises no audit event (``os.mkfifo``, a C library writing a file, libc called
through any ``ctypes`` function object the expression reaches or builds from an address): that
filter, not the hook, is what holds against an expression that knows the mechanism. The setup
leaves no ``ctypes`` object of its own behind (``syscalls.libc_function``). Elsewhere only the
hook applies. Handlers registered with ``os.register_at_fork`` run in
the child before any of this (they are their libraries' own after-fork code). A lock another thread
held at the fork stays held in the child: an expression that needs it hangs until the deadline kills
the child.

Fork is used on Linux only (macOS frameworks are not fork-safe; Windows has no fork); elsewhere,
with ``FORK_ENABLED`` off, when a fork fails (no memory or processes left) or when a child
cannot be cut off (no ``/proc``; a kernel that refuses the filter), the static evaluator of
``_diagnose.readonly`` runs instead: a child that is not confined evaluates nothing.
"""

from __future__ import annotations

import functools
import gc
import linecache
import os
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Protocol

import anyio

from crashoverride._diagnose.confine import confine

# Imported here, in the parent: the child must not import (another thread may have held an
# import lock at the fork).
from crashoverride._placement.bridge import loop_running_here
from crashoverride._security.gate import compile_agent, run_code
from crashoverride._security.text import describe_result, format_tool_error


class Workspace(Protocol):
    """What an inspection needs of the agent's namespace (``_agent.namespace.Workspace``).

    A Protocol: diagnose sits below the agent layer and never imports it.
    """

    @property
    def deadline(self) -> float | None: ...
    @property
    def globals(self) -> dict[str, Any]: ...
    @property
    def error(self) -> BaseException | None: ...

    def take_output(self) -> str: ...


FORK_ENABLED = True
UNBOUNDED_CAP = 30.0  # seconds one inspection may run when the recovery has no deadline
_MAX_REPLY = 256 * 1024  # bytes read from a child; the rendered result is far smaller
_FILENAME = "<crashoverride-inspect>"
_VALUE, _ERROR, _UNCONFINED = b"V", b"E", b"U"


class Rendered(str):
    """A result already rendered in the snapshot: the model sees this text as it is."""

    __slots__ = ()


class InspectionFailed(Exception):
    """The expression raised, was refused, or ran out of time; the message says which."""


class _NoSnapshot(Exception):
    """No fork here or now: the static evaluator (``_diagnose.readonly``) answers instead."""


def fork_usable() -> bool:
    return FORK_ENABLED and sys.platform.startswith("linux") and hasattr(os, "fork")


def inspect_read_only(ws: Workspace, names: Mapping[str, Any], expression: str) -> Any:
    """Evaluate ``expression`` against the live namespace without changing the process.

    On a thread that runs an event loop the wait is a coroutine (the bridge awaits it), so
    the application goes on serving while the snapshot works, or hangs until the deadline.
    Without a snapshot (no fork, or a child that could not be cut off) the static evaluator
    answers instead.
    """
    budget = UNBOUNDED_CAP if ws.deadline is None else ws.deadline - time.monotonic()
    if budget <= 0:
        raise InspectionFailed("the recovery's time is up; the expression was not evaluated")

    def static() -> Any:
        from crashoverride._diagnose.readonly import evaluate_plain

        return evaluate_plain(expression, ws.globals, names)

    try:
        if not fork_usable():
            raise _NoSnapshot
        _warm_up()
        pid, read_end = _start(lambda: _evaluate(ws, names, expression))
    except _NoSnapshot:
        return static()
    if loop_running_here():
        return _wait_async(pid, read_end, budget, static)
    try:
        try:
            reply, finished = _collect(read_end, budget)
        finally:
            os.close(read_end)
            status = _reap(pid)
        return _conclude(reply, finished, status, budget)
    except _NoSnapshot:
        return static()


async def _wait_async(pid: int, read_end: int, budget: float, static: Callable[[], Any]) -> Any:
    try:
        try:
            reply, finished = await _collect_async(read_end, budget)
        finally:
            os.close(read_end)
            status = _reap(pid)
        return _conclude(reply, finished, status, budget)
    except _NoSnapshot:
        return static()


def _conclude(reply: bytes, finished: bool, status: int | None, budget: float) -> Rendered:
    if not finished:
        raise InspectionFailed(
            f"the expression was still running after {budget:.3g}s: its snapshot was stopped "
            "(nothing in the process changed)"
        )
    if reply[:1] == _VALUE:
        return Rendered(reply[1:].decode("utf-8", "replace"))
    if reply[:1] == _ERROR:
        raise InspectionFailed(reply[1:].decode("utf-8", "replace"))
    if reply[:1] == _UNCONFINED:
        raise _NoSnapshot
    raise InspectionFailed(_death(status))


@functools.cache
def _warm_up() -> None:
    # Rendering compiles patterns and fills caches on first use. Done once here, the
    # children inherit them instead of each paying for them again (milliseconds per call).
    describe_result([{"key": "value", "n": 1}, ("text", b"bytes", 1.5)], "")


def _evaluate(ws: Workspace, names: Mapping[str, Any], expression: str) -> tuple[bytes, str]:
    """In the child: the expression's rendered value, or its traceback."""
    source = expression.strip()
    linecache.cache[_FILENAME] = (len(source), None, source.splitlines(True), _FILENAME)
    try:
        code = compile_agent(source, "eval", filename=_FILENAME)
        value = run_code(code, ws.globals, names)
        return _VALUE, describe_result(value, ws.take_output())
    except BaseException as exc:  # the child's copy of any exception is only a result to report
        return _ERROR, format_tool_error(exc, ws.error)


def _start(work: Any) -> tuple[int, int]:
    """Fork a child that runs ``work`` and replies; its pid and the pipe's read end."""
    read_end, write_end = os.pipe()  # close-on-exec: no subprocess of the parent keeps them
    with warnings.catch_warnings():
        # 3.12+ warns that fork() in a multi-threaded process may deadlock the child. This child
        # runs only the expression, the reply and ``os._exit``; a lock another thread held
        # makes it hang until the deadline kills it, and the process is unaffected. The filter
        # swap is process-wide for the instant of the fork only.
        warnings.filterwarnings("ignore", r"This process .*is multi-threaded", DeprecationWarning)
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory (overcommit off, a large heap)
            os.close(read_end)
            os.close(write_end)
            raise _NoSnapshot from None
        if pid == 0:
            _child(write_end, work)
    os.close(write_end)
    return pid, read_end


def _death(status: int | None) -> str:
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number in (signal.SIGSEGV, signal.SIGBUS):
            return (
                f"the snapshot crashed ({signal.Signals(number).name}): the expression most "
                "likely wrote to memory shared with other processes, read-only in diagnose mode"
            )
    # Any other end: it exited early, or closed its pipe and ran on until ``_reap`` killed it.
    return "the snapshot evaluating the expression ended without a result"


def _collect(fd: int, budget: float) -> tuple[bytes, bool]:
    """Read the child's reply until it closes the pipe (True) or the budget runs out (False)."""
    end = time.monotonic() + budget
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    chunks: list[bytes] = []
    size = 0
    while size < _MAX_REPLY:
        left = end - time.monotonic()
        if left <= 0:
            return b"", False
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), True


async def _collect_async(fd: int, budget: float) -> tuple[bytes, bool]:
    """``_collect`` without holding the event loop while the child works."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(budget) as scope:
        while size < _MAX_REPLY:
            await anyio.wait_readable(fd)
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if scope.cancelled_caught:
        return b"", False
    return b"".join(chunks), True


def _reap(pid: int) -> int | None:
    """Collect the child, killing it first if it still runs; its exit status (None if gone)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        # Still running (out of time, or it closed the pipe and went on). Killed only while
        # it is known to be ours: a pid that someone else reaped may be reused.
        os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:  # an application's SIGCHLD handler reaped it first
        return None


def _child(write_end: int, work: Any) -> NoReturn:
    status = 1
    try:
        # A collection would walk (and so copy, page by page) the whole inherited heap; the
        # child's garbage is freed at once by ``_exit``.
        gc.disable()
        try:
            confine(keep=write_end)
        except Exception as exc:  # never evaluate in a copy that is not cut off
            kind, text = _UNCONFINED, repr(exc)
        else:
            kind, text = work()
        reply = kind + text.encode("utf-8", "backslashreplace")
        view = memoryview(reply)
        while view:
            view = view[os.write(write_end, view) :]
        status = 0
    finally:
        # Whatever happened, the copy never unwinds into the process's own frames (the
        # application's event loop, its request handler): it ends here.
        os._exit(status)
