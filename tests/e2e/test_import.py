"""The zero-cost path: importing and a block that does not raise load and create nothing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

HEAVY = ("agents", "openai", "structlog", "asyncio", "anyio", "httpx", "httpx2", "mcp")
# The recovery machinery: the pipeline and the agent run, loaded by a first failure only.
RECOVERY = ("crashoverride._core", "crashoverride._agent")


def _run(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_loads_no_heavy_module() -> None:
    result = _run(
        "import sys, json\n"
        "import crashoverride\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    )
    assert result == dict.fromkeys(HEAVY, False)


def test_the_recovery_machinery_guarded_against_exists() -> None:
    # A guard naming a module that was renamed or deleted would pass for ever.
    assert all(importlib.util.find_spec(name) is not None for name in RECOVERY)


def test_a_block_that_does_not_raise_creates_nothing() -> None:
    result = _run(
        "import sys, json, threading\n"
        "from crashoverride import CrashOverride\n"
        "co = CrashOverride(model='m', project_prompt='p')\n"
        "threads = threading.active_count()\n"
        "with co.handler(prompt='x'):\n"
        "    pass\n"
        "@co.handler(prompt='y')\n"
        "def f():\n"
        "    return 1\n"
        "f()\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in "
        f"{HEAVY!r} or m.startswith({RECOVERY!r})]\n"
        "print(json.dumps({'loaded': loaded, 'threads': threading.active_count() - threads,"
        " 'limits': co._limits_state is not None}))"
    )
    assert result == {"loaded": [], "threads": 0, "limits": False}


def test_a_non_matching_exception_loads_nothing_either() -> None:
    result = _run(
        "import sys, json\n"
        "from crashoverride import CrashOverride\n"
        "co = CrashOverride(catch=KeyError)\n"
        "try:\n"
        "    with co.handler():\n"
        "        raise ValueError\n"
        "except ValueError:\n"
        "    pass\n"
        f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))"
    )
    assert result == {"loaded": []}
