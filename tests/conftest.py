"""Shared fixtures: anyio's pytest plugin runs backend-neutral tests on asyncio and trio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def asyncio_only() -> str:
    return "asyncio"
