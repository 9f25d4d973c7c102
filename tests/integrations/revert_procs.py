"""A fleet process for tests/integrations/test_fleet_revert.py: one decorated call, driven
from stdin (``call N`` prints ``{"result": ...}``), its events as JSON lines on stdout.

    python -m tests.integrations.revert_procs ROLE   # ROLE: publisher | applier

Configured through the environment: ``FLEET_REDIS_URL``, ``FLEET_NS``. Only the model is
scripted, in the process itself.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.testing import done, exec_python, script

KEY = "fleet-test-key-0123456789"
RATES = {"USD": 2}
# Works for the call that failed (rerun() verifies it); divides by zero for another input.
FIX = "replace_function(convert, 'def convert(value):\\n    return 100 // value\\n')\nrerun()"
SCRIPTS = {
    # Recovers the first failure with FIX; after the revert, a failure afresh: answered.
    "publisher": lambda: script(exec_python(FIX), done("patched"),
                                exec_python("set_result(-1)"), done("answered")),
    # Never patches: it gets FIX from the fleet, and answers the failure FIX caused.
    "applier": lambda: script(exec_python("set_result(-2)"), done("answered")),
}  # fmt: skip


def convert(value: int) -> int:
    return RATES["EUR"] * value  # the bug: no EUR rate (KeyError)


def main(role: str) -> None:
    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )  # fmt: skip
    env = os.environ
    fleet = RedisCoordination(env["FLEET_REDIS_URL"], namespace=env["FLEET_NS"], key=KEY,
                              op_timeout=2.0)  # fmt: skip
    co = CrashOverride(model=SCRIPTS[role](), timeout=30, coordination=fleet)

    @co.handler(prompt="Return the converted amount.")
    def job(value: int) -> int:
        return convert(value)

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        result: Any
        try:
            result = job(int(line.split()[1]))
        except Exception as exc:
            result = {"error": type(exc).__name__}
        print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":  # run from its module: the fleet names functions by module
    from tests.integrations.revert_procs import main as run

    run(sys.argv[1])
