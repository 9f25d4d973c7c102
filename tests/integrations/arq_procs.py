"""An arq worker process for the kill test: ``python -m tests.integrations.arq_procs N``.

Configured through the environment: ``ARQ_TEST_REDIS_URL``, ``ARQ_TEST_QUEUE``, ``ARQ_TEST_NS``
(the journal's namespace in Redis) and ``ARQ_TEST_DIR`` (the card processor's log, and the
file worker 1 writes when its recovery has begun). Worker 1's agent then hangs until the test
kills the process; worker 2 (burst) runs the job again once arq sees it abandoned.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from arq.connections import RedisSettings
from arq.worker import Worker

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.integrations.arq import install
from crashoverride.testing import done, exec_python, script

KEY = "fleet-test-key-0123456789"
DIR = Path(os.environ["ARQ_TEST_DIR"])
# arq runs an abandoned job again once its in-progress key expires: job timeout + 10 s.
JOB_TIMEOUT = 20


def _charge(order: int) -> str:
    with open(DIR / "charges", "a", encoding="utf-8") as log:
        log.write(f"{order}\n")
    return f"ch_{len((DIR / 'charges').read_text().split())}"


# Declared once, as an application does; the journal a call is written to is the one of the
# unit of work it runs in: the job's, kept in Redis by the worker's CrashOverride.
charge = CrashOverride().effect(_charge, key=lambda order: f"charge order {order}")


async def pay(ctx: dict[str, Any], order: int) -> str:
    receipt: str = charge(order)
    if ctx["job_try"] == 1:
        raise ConnectionError("mail server down")
    return f"{receipt} mailed"


def main(which: str) -> None:
    if which == "1":
        # The agent starts working, says so, and is still at it when the worker is killed.
        hang = f"open({str(DIR / 'recovering')!r}, 'w').close()\nimport time\ntime.sleep(300)"
        model = script(exec_python(hang), done("never reached"))
    else:
        model = script()  # the second try does not fail: no agent
    journal = RedisCoordination(
        os.environ["ARQ_TEST_REDIS_URL"], namespace=os.environ["ARQ_TEST_NS"], key=KEY
    )
    co = CrashOverride(model=model, coordination=journal)
    settings: dict[str, Any] = {
        "functions": [pay],
        "queue_name": os.environ["ARQ_TEST_QUEUE"],
        "redis_settings": RedisSettings.from_dsn(os.environ["ARQ_TEST_REDIS_URL"]),
    }
    install(settings, co)

    async def run() -> None:
        worker = Worker(
            **settings, burst=which == "2", handle_signals=False, poll_delay=0.1,
            job_timeout=JOB_TIMEOUT, keep_result=600,
        )  # fmt: skip
        try:
            await worker.async_run()
        finally:
            await worker.close()

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1])
