"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event emitted during the test."""
    with capture_logs() as captured:
        yield captured
