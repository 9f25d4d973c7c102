"""Shared fixtures: anyio's pytest plugin runs backend-neutral tests on asyncio and trio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
