"""An arq worker whose jobs are recovered in the worker, with follow-ups as arq jobs.

`invoice_total` reads a field the billing service just renamed. The recovery agent, running in
the worker, reads the real amount from the reply and sets the job's result, which arq stores; a
follow-up (declared on the job) is enqueued as a `crashoverride.followup` job on the worker's
queue, and the worker turns it into a ticket. `collect` charges a card (a declared effect), then
finds the mail server down and asks arq to try again: the second try gets the first charge's
receipt instead of charging again.

Needs a Redis (`REDIS_URL`, default redis://127.0.0.1:6379/0). Runs one burst worker in this
process with a scripted model; in a deployment use a real model and start workers with
`arq arq_worker.WorkerSettings`.

    python examples/arq_worker.py
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, ClassVar

from agents.testing import ScriptedModel, assistant_message, function_call
from arq.connections import RedisSettings, create_pool
from arq.worker import Retry, Worker

from crashoverride import CrashOverride
from crashoverride.integrations.arq import install, recovered

REDIS = RedisSettings.from_dsn(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
QUEUE = os.environ.get("ARQ_QUEUE", "billing")
TICKETS: list[str] = []
CHARGES: list[int] = []


def open_ticket(title: str, body: str) -> str:
    """Open a ticket in the team's tracker.

    Args:
        title: One line.
        body: The diagnosis and the fix to make.
    """
    TICKETS.append(f"{title}\n{body}")
    return f"ticket #{len(TICKETS)} opened"


def scripted_model() -> ScriptedModel:
    """What a model would do here, scripted so the example runs without an API key."""
    recover = "set_result(caller['reply']['amount_due_cents'])"
    return ScriptedModel(
        [
            [function_call("eval_python", {"expression": "caller['reply']"}, call_id="look")],
            [function_call("exec_python", {"statements": recover}, call_id="set")],
            [assistant_message("billing renamed total_cents to amount_due_cents")],
            # The follow-up agent, run by the crashoverride.followup job.
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


def billing_service(invoice_id: int) -> dict[str, Any]:
    # The service's new release renamed `total_cents`.
    return {"invoice": invoice_id, "amount_due_cents": 1250 * invoice_id}


@recovered(
    "Return the invoice total in cents, as reported by the billing service.",
    followups=["Open a ticket describing the permanent fix."],
)
async def invoice_total(ctx: dict[str, Any], invoice_id: int) -> int:
    reply = billing_service(invoice_id)
    return int(reply["total_cents"])


@crash_override.effect(key=lambda invoice_id: f"charge invoice {invoice_id}")
def charge_card(invoice_id: int) -> str:
    CHARGES.append(invoice_id)
    return f"receipt {invoice_id}-{len(CHARGES)}"


async def collect(ctx: dict[str, Any], invoice_id: int) -> str:
    receipt: str = charge_card(invoice_id)
    if ctx["job_try"] == 1:  # the mail server is down: arq runs the job again
        raise Retry(defer=0)
    return f"mailed {receipt}"


class WorkerSettings:
    functions: ClassVar[list[Any]] = [invoice_total, collect]
    redis_settings = REDIS
    queue_name = QUEUE


# Every function protected (invoice_total with its own options), the crashoverride.followup
# function registered, follow-ups sent to this worker's queue.
install(WorkerSettings, crash_override)


async def main() -> None:
    pool = await create_pool(REDIS, default_queue_name=QUEUE)
    try:
        total = await pool.enqueue_job("invoice_total", 4, _queue_name=QUEUE)
        paid = await pool.enqueue_job("collect", 9, _queue_name=QUEUE)
        assert total is not None and paid is not None
        # One worker until the queue is empty: both jobs, the retry and the follow-up.
        worker = Worker(
            **{k: v for k, v in vars(WorkerSettings).items() if not k.startswith("_")},
            burst=True, handle_signals=False, poll_delay=0.05,
        )  # fmt: skip
        try:
            await worker.async_run()
        finally:
            await worker.close()
        print(f"invoice 4 total: {await total.result(timeout=60)} cents")
        print(f"invoice 9: {await paid.result(timeout=60)}; card charged {len(CHARGES)} time(s)")
    finally:
        await pool.aclose()
    print("tickets:", TICKETS)


if __name__ == "__main__":
    asyncio.run(main())
