"""A Celery worker whose crashoverride events go through stdlib logging, named `crashoverride`.

A Celery worker redirects stdout to its logger, and structlog's default logger prints: every
event would come out as one `WARNING/ForkPoolWorker-N` line, whatever its level. Configured as
below (once, at import, so every prefork child inherits it), each event is a record of the
stdlib logger `crashoverride`, at its own level, formatted by the worker's handlers.

The task's recovery succeeds; its follow-up gives up, so the follow-up's Celery task ends in
FAILURE with `FollowupFailed` (red in Flower), while the recovered task's SUCCESS is untouched.

Runs offline in one process: an in-memory broker, an embedded solo-pool worker (`--pool solo`:
one process, so the scripted model below is the one every task uses) and a scripted model.

    python examples/celery_logging.py
"""

from __future__ import annotations

import logging
import os
import re

import structlog
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from crashoverride import CrashOverride
from crashoverride.integrations.celery import (
    FOLLOWUP_QUEUE,
    CrashOverrideTask,
    FollowupFailed,
    install,
)
from crashoverride.testing import done, exec_python, give_up, script

# -- logging: structlog hands every event to the stdlib logger of its name --------------------
structlog.configure(
    processors=[
        structlog.contextvars.merge_contextvars,  # the recovery's id and handler, bound by us
        structlog.stdlib.filter_by_level,  # the stdlib logger's level decides
        structlog.stdlib.add_log_level,
        structlog.processors.format_exc_info,
        structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),  # get_logger("crashoverride") -> that name
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)
logging.getLogger("crashoverride").setLevel(logging.INFO)

# -- the app -------------------------------------------------------------------------------
app = Celery(
    "billing",
    broker=os.environ.get("CELERY_BROKER_URL", "memory://"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "cache+memory://"),
    task_cls=CrashOverrideTask,
)
model = script(
    exec_python("set_result(caller['reply']['amount_due_cents'])"),
    done("billing renamed total_cents to amount_due_cents"),
    give_up("no ticket tracker is configured in this worker"),  # the follow-up agent
)
install(app, CrashOverride(model=model))


@app.task(
    name="billing.invoice_total",
    recovery_prompt="Return the invoice total in cents, as the billing service reports it.",
    recovery_options={"followups": ["Open a ticket describing the permanent fix."]},
)
def invoice_total(invoice_id: int) -> int:
    reply = {"invoice": invoice_id, "amount_due_cents": 1250 * invoice_id}
    return int(reply["total_cents"])


class Shown(logging.Handler):
    """Stands in for the worker's handlers: prints what the `crashoverride` logger emits."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        print(f"{record.name} {record.levelname} {line.split(' ', 1)[0]}")

    def followup_id(self) -> str | None:
        for line in self.lines:
            found = re.search(r"followup_id='(fu_[0-9a-f]+)'", line)
            if line.startswith("event='followup.submitted'") and found:
                return found[1]
        return None


def main() -> None:
    shown = Shown()
    logging.getLogger("crashoverride").addHandler(shown)
    with start_worker(app, pool="solo", perform_ping_check=False,
                      queues=["celery", FOLLOWUP_QUEUE], loglevel="WARNING"):  # fmt: skip
        sent = invoice_total.delay(4)
        print(f"invoice 4 total: {sent.get(timeout=60)} cents (state {sent.state})")
        # The follow-up is a task of its own whose id is the follow-up's (in its events).
        followup_id = shown.followup_id()
        assert followup_id is not None, "the recovery submitted its follow-up before returning"
        job = AsyncResult(followup_id, app=app)
        try:
            job.get(timeout=60)
        except FollowupFailed as failure:
            print(f"follow-up task: state {job.state}: {failure}")


if __name__ == "__main__":
    main()
