"""Shared fixtures: anyio's pytest plugin runs backend-neutral tests on asyncio and trio.

Two tiers: ``slow`` marks what starts processes, servers or workers, or takes long (whole
folders below, single tests with ``@pytest.mark.slow``); ``make test-fast`` runs the rest. A
test outside the slow tier that starts a subprocess or listens on a socket fails (see
``_Watch``): the fast tier stays fast by construction, not by remembering.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
# Folders whose every test is slow: real uvicorn/Celery/Redis processes, the CLI and a browser,
# the README and examples as subprocesses, wheels.
SLOW_FOLDERS = frozenset({"integrations", "fleet", "e2e", "cli"})
# The kit's MockServer listens on loopback in a thread of this process: cheap, and the way the
# fast tier talks to a model over real HTTP. Listening from anywhere else is a server.
_IN_PROCESS_SERVER = "crashoverride.testing._http"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/ (pytester's): not ours to sort
            continue
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


class _Watch:
    """Records subprocesses started and sockets listening while a fast test runs.

    Only in this process: a forked child (the diagnose snapshot, agent code) calls through.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.on = False
        self.seen: list[str] = []

    def install(self) -> None:
        popen_init: Callable[..., None] = subprocess.Popen.__init__
        listen: Callable[..., None] = socket.socket.listen
        watch = self

        def watched_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
            if watch.active():
                watch.seen.append(f"started a subprocess: {args!r}"[:300])
            popen_init(self, args, *rest, **kw)

        def watched_listen(self: socket.socket, *backlog: int) -> None:
            if watch.active() and not _called_from(_IN_PROCESS_SERVER):
                watch.seen.append(f"listened on {self.getsockname()!r}")
            listen(self, *backlog)

        self.originals = (popen_init, listen)
        subprocess.Popen.__init__ = watched_popen  # type: ignore[method-assign]
        socket.socket.listen = watched_listen  # type: ignore[method-assign]

    def uninstall(self) -> None:
        popen_init, listen = self.originals
        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
        socket.socket.listen = listen  # type: ignore[method-assign]

    def active(self) -> bool:
        return self.on and os.getpid() == self.pid


_WATCH = _Watch()


def pytest_configure(config: pytest.Config) -> None:
    # The openai client's platform headers ask platform.processor(), which runs `uname -p` once
    # per process and caches it: asked here, it is not charged to whichever test comes first.
    platform.processor()
    _WATCH.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    _WATCH.uninstall()


def _watched(item: pytest.Item) -> Generator[None, object, object]:
    _WATCH.on, _WATCH.seen = item.get_closest_marker("slow") is None, []
    try:
        result = yield
    finally:
        _WATCH.on = False
    if _WATCH.seen:
        pytest.fail(
            "a fast test started a process or a server: mark it @pytest.mark.slow\n  "
            + "\n  ".join(_WATCH.seen),
            pytrace=False,
        )
    return result


# Setup, call and teardown each: a fixture starting a server counts as much as the test body.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _watched(item))


def _called_from(module: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a non-daemon thread outlives it: that would hang interpreter exit."""
    import threading
    import time

    deadline = time.monotonic() + 5
    while True:
        alive = [
            t.name
            for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()
        ]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if alive:
        print(f"\nnon-daemon threads still running after the tests: {alive}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
