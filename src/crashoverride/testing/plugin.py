"""pytest plugin (entry point ``pytest11``): fixtures to rehearse recoveries in a user's tests.

- ``crashoverride_script``: ``crashoverride_script(step, ...)`` returns a ``ScriptedModel``
  for ``CrashOverride(model=...)``; at teardown every scripted turn must have been used.
- ``openai_mock_server``: a running ``MockServer``; ``.serve(steps)`` then
  ``.crash_override(...)``; at teardown it must have seen no errors and no unused turns.
- ``crashoverride_cassette``: a running ``MockServer`` replaying this test's cassette, or, with
  ``--crashoverride-record``, recording it through a proxy to the real endpoint. Override the
  ``crashoverride_cassette_path`` fixture to store cassettes elsewhere.

The plugin is loaded by every pytest run in an environment with crashoverride installed, so
this module imports nothing beyond pytest until a fixture is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_DEFAULT_UPSTREAM = "https://api.openai.com/v1"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("crashoverride", "crashoverride recovery rehearsal")
    group.addoption(
        "--crashoverride-record",
        action="store_true",
        default=False,
        help="record the cassettes of crashoverride_cassette tests against the real endpoint "
        "(overwrites them); default: replay offline",
    )
    group.addoption(
        "--crashoverride-upstream",
        default=None,
        metavar="URL",
        help="OpenAI-compatible endpoint to record from (default: $CRASHOVERRIDE_UPSTREAM, "
        f"$OPENAI_BASE_URL or {_DEFAULT_UPSTREAM}); its key comes from $OPENAI_API_KEY",
    )


@pytest.fixture
def crashoverride_script() -> Iterator[Callable[..., Any]]:
    """Build ``ScriptedModel``s from steps or a ``Script``; checks they were used up."""
    from crashoverride.testing import Script

    models: list[Any] = []

    def make(*steps: Any) -> Any:
        plan = steps[0] if len(steps) == 1 and isinstance(steps[0], Script) else Script(*steps)
        model = plan.model()
        models.append(model)
        return model

    yield make
    for model in models:
        model.assert_complete()


@pytest.fixture
def openai_mock_server() -> Iterator[Any]:
    """A running ``MockServer`` in script mode: ``openai_mock_server.serve(steps)``."""
    from crashoverride.testing import MockServer

    with MockServer() as server:
        yield server
        server.assert_complete()


@pytest.fixture
def crashoverride_cassette_path(request: pytest.FixtureRequest) -> Path:
    """``cassettes/<test module>/<test name>.json`` next to the test module."""
    module = Path(str(request.node.path))
    name = re.sub(r"[^\w.-]+", "_", request.node.name).strip("_")
    return module.parent / "cassettes" / module.stem / f"{name}.json"


@pytest.fixture
def crashoverride_cassette(
    request: pytest.FixtureRequest, crashoverride_cassette_path: Path
) -> Iterator[Any]:
    """A ``MockServer`` replaying this test's cassette (or recording it, see the options)."""
    from crashoverride.testing import CassetteError, MockServer

    config = request.config
    path = crashoverride_cassette_path
    if config.getoption("crashoverride_record"):
        upstream = (
            config.getoption("crashoverride_upstream")
            or os.environ.get("CRASHOVERRIDE_UPSTREAM")
            or os.environ.get("OPENAI_BASE_URL")
            or _DEFAULT_UPSTREAM
        )
        server = MockServer(
            upstream=upstream,
            upstream_api_key=os.environ.get("OPENAI_API_KEY"),
            record_to=path,
        )
    else:
        try:
            server = MockServer(cassette=path)
        except CassetteError as exc:
            pytest.fail(
                f"{exc}; run pytest with --crashoverride-record to record it", pytrace=False
            )
    with server:
        yield server
        if server.mode == "replay":
            server.assert_complete()
        elif server.errors:
            raise AssertionError("; ".join(server.errors))
