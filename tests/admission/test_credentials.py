"""Without credentials the first failure fails at once, with a clear note, before any SDK import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
from crashoverride import CrashOverride

co = CrashOverride(project_prompt="p")
try:
    with co.handler(prompt="x"):
        raise ValueError("boom")
except ValueError as exc:
    notes = getattr(exc, "__notes__", [])
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"agents", "openai", "httpx2", "mcp"})
machinery = sorted(set(sys.modules) & {"anyio", "crashoverride._core.pipeline",
    "crashoverride._agent.run", "crashoverride._placement.bridge",
    "crashoverride._placement.owner_thread", "structlog", "asyncio", "concurrent.futures",
    "logging", "hashlib"})
threads = sorted(t.name for t in __import__("threading").enumerate())
print(json.dumps({"notes": notes, "loaded": loaded, "machinery": machinery, "threads": threads}))
"""


def _probe(code: str, **env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_a_first_failure_without_a_key_fails_clearly_without_importing_the_sdk() -> None:
    result = _probe(_PROBE)
    assert result["loaded"] == []  # the SDK import (seconds) never started
    (note,) = result["notes"]  # type: ignore[misc]
    assert "failed: no API key: set OPENAI_API_KEY or pass api_key= (or base_url=)" in note


@pytest.mark.slow
def test_without_a_key_the_run_machinery_is_not_even_imported() -> None:
    # Issue 12: < 50 ms from a cold start (benchmarks/bench_credentials.py measures it). What
    # makes that possible: admission asks for credentials before anyio, the placements or the
    # agent are imported, and no thread or event loop is started to learn the answer.
    result = _probe(_PROBE)
    assert result["machinery"] == []
    assert result["threads"] == ["MainThread"]


@pytest.mark.slow
def test_without_a_key_structlog_is_imported_only_by_the_application() -> None:
    # Issue 25 §5: structlog (and the asyncio its stdlib module imports) was most of that
    # first failure's time. Nobody can be listening to a structlog nobody imported, so the
    # refusal's event is not emitted then (the note says it all); an application that
    # imported structlog gets the event.
    code = _PROBE.replace(
        "from crashoverride import CrashOverride\n",
        "from crashoverride import CrashOverride\n"
        "import structlog\n"
        "from structlog.testing import capture_logs\n",
    ).replace(
        'try:\n    with co.handler(prompt="x"):\n        raise ValueError("boom")\n'
        'except ValueError as exc:\n    notes = getattr(exc, "__notes__", [])\n',
        "with capture_logs() as logs:\n"
        "    try:\n"
        '        with co.handler(prompt="x"):\n'
        '            raise ValueError("boom")\n'
        "    except ValueError as exc:\n"
        '        notes = getattr(exc, "__notes__", [])\n'
        'print(json.dumps([e["event"] for e in logs]))\n',
    )
    assert "capture_logs() as logs" in code
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},
    )  # fmt: skip
    events_line, result_line = done.stdout.strip().splitlines()[-2:]
    assert json.loads(events_line) == ["recovery.failed"]
    assert "no API key" in json.loads(result_line)["notes"][0]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_first_failure_without_a_key_fails_clearly_too(backend: str) -> None:
    code = _PROBE.replace(
        'try:\n    with co.handler(prompt="x"):\n        raise ValueError("boom")\n'
        'except ValueError as exc:\n    notes = getattr(exc, "__notes__", [])\n',
        "import anyio\n"
        "async def main():\n"
        "    try:\n"
        '        async with co.handler(prompt="x"):\n'
        '            raise ValueError("boom")\n'
        "    except ValueError as exc:\n"
        '        return getattr(exc, "__notes__", [])\n'
        f"notes = anyio.run(main, backend={backend!r})\n",
    )
    assert "anyio.run(main, backend=" in code
    result = _probe(code)
    assert result["loaded"] == []
    # The test's own anyio.run (and what anyio imports); nothing of ours.
    assert "anyio" in result["machinery"]
    assert not {"structlog", "crashoverride._core.pipeline"} & set(result["machinery"])
    (note,) = result["notes"]  # type: ignore[misc]
    assert "no API key" in note


@pytest.mark.slow
def test_a_key_in_the_environment_or_a_base_url_is_enough_to_go_on() -> None:
    # With a key (or a base URL) the check passes and the recovery proceeds to the SDK; the
    # endpoint is unreachable here, so it fails later, for that reason and not for credentials.
    code = _PROBE.replace('project_prompt="p"', 'project_prompt="p", timeout=20, '
                          'base_url="http://127.0.0.1:9/v1"')  # fmt: skip
    result = _probe(code)
    (note,) = result["notes"]  # type: ignore[misc]
    assert "no API key" not in note
    assert "agents" in result["loaded"]
