"""A Celery worker app whose tasks are recovered in the worker, with durable follow-ups.

`invoice_total` reads a field the billing service just renamed. The recovery agent, running in
the worker, reads the real amount from the payload and sets the task's result, which the result
backend stores; a follow-up (declared on the task) goes to the `crashoverride.followups` queue
and another worker process, or this one, turns it into a ticket.

Runs offline in one process: an in-memory broker, an embedded worker and a scripted model. For a
real deployment point `CELERY_BROKER_URL` / `CELERY_RESULT_BACKEND` at Redis, use a real model,
and start workers with `celery -A celery_worker worker -Q celery,crashoverride.followups`.

    python examples/celery_worker.py
"""

from __future__ import annotations

import os
import time
from typing import Any

from agents.testing import ScriptedModel, assistant_message, function_call
from celery import Celery
from celery.contrib.testing.worker import start_worker

from crashoverride import CrashOverride
from crashoverride.integrations.celery import FOLLOWUP_QUEUE, CrashOverrideTask, install

TICKETS: list[str] = []

app = Celery(
    "billing",
    broker=os.environ.get("CELERY_BROKER_URL", "memory://"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "cache+memory://"),
    task_cls=CrashOverrideTask,
)


def open_ticket(title: str, body: str) -> str:
    """Open a ticket in the team's tracker.

    Args:
        title: One line.
        body: The diagnosis and the fix to make.
    """
    TICKETS.append(f"{title}\n{body}")
    return f"ticket #{len(TICKETS)} opened"


def scripted_model() -> ScriptedModel:
    """What a model would do here, scripted so the example runs offline."""
    recover = "set_result(caller['reply']['amount_due_cents'])"
    return ScriptedModel(
        [
            [function_call("eval_python", {"expression": "caller['reply']"}, call_id="look")],
            [function_call("exec_python", {"statements": recover}, call_id="set")],
            [assistant_message("billing renamed total_cents to amount_due_cents")],
            # The follow-up agent, run by the crashoverride.followup task.
            [function_call("open_ticket", {
                "title": "billing: total_cents renamed to amount_due_cents",
                "body": "invoice_total reads reply['total_cents']; read amount_due_cents.",
            }, call_id="ticket")],
            [assistant_message("ticket opened")],
        ]
    )  # fmt: skip


crash_override = CrashOverride(
    project_prompt="Billing worker. Amounts must come from the billing service; never invent them.",
    model=scripted_model(),
    tools=(open_ticket,),
)
install(app, crash_override)


def billing_service(invoice_id: int) -> dict[str, Any]:
    # The service's new release renamed `total_cents`.
    return {"invoice": invoice_id, "amount_due_cents": 1250 * invoice_id}


@app.task(
    name="billing.invoice_total",
    recovery_prompt="Return the invoice total in cents, as reported by the billing service.",
    recovery_options={"followups": ["Open a ticket describing the permanent fix."]},
)
def invoice_total(invoice_id: int) -> int:
    reply = billing_service(invoice_id)
    return int(reply["total_cents"])


def main() -> None:
    with start_worker(app, pool="solo", perform_ping_check=False,
                      queues=["celery", FOLLOWUP_QUEUE], loglevel="WARNING"):  # fmt: skip
        result = invoice_total.delay(4)
        print(f"invoice 4 total: {result.get(timeout=60)} cents (state {result.state})")
        # The follow-up is another task on its own queue; wait for the worker to run it.
        deadline = time.monotonic() + 60
        while not TICKETS and time.monotonic() < deadline:
            time.sleep(0.05)
    print("tickets:", TICKETS)


if __name__ == "__main__":
    main()
