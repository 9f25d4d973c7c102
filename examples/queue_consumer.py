"""A new integration in one small file: an ``asyncio.Queue`` consumer, protected message by
message, written only against the public contract ``crashoverride.integration``.

Each message is handled by ``handle_order``. When the producer renames a field, the handler
raises ``KeyError`` for the first such message; the agent reads the message, repairs
``handle_order`` in the running process and re-runs the call, so that message is handled after
all. Later messages go through the repaired code with no further recovery.

    python examples/queue_consumer.py          # offline: the model is scripted, and says so
    python examples/queue_consumer.py --live   # a real model (OPENAI_API_KEY)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from crashoverride import CrashOverride, Handler, integration

# The brief's text is written here; what a message brings (and names) are values, which the
# agent is shown fenced as data: ``integration.Brief(TEXT, label=value, ...)``.
MESSAGE_BRIEF = """\
This is the handling of one queue message by the handler shown above (`handler`); `args[0]` is
the message. Finish with `set_result(value)` (the value the handler should have returned), or
repair the handler and call `rerun()` to handle the message once more. Messages are not
idempotent: check for effects of the failed attempt first. If neither is right, call give_up:
the message then fails as usual."""


class ProtectedConsumer:
    """Consumes a queue; every message that fails is recovered before the next one is taken."""

    def __init__(self, handler: Handler, handle: Callable[[Any], Awaitable[Any]]) -> None:
        self.handler = handler
        self.handle = handle

    async def process(self, message: Any) -> Any:
        try:
            return await self.handle(message)
        except Exception as exc:
            if not integration.catches(self.handler, exc):
                raise
            # The description is built lazily (a failure there must not replace ``exc``) and is
            # not kept in a local: it holds ``exc``, whose traceback holds this frame.
            outcome = await integration.arecover(
                self.handler, exc, functools.partial(self._block, message, exc)
            )
            if not integration.settle(self.handler, outcome, exc):
                raise  # the original exception, with a note saying why
            assert outcome is not None
            return outcome.value

    def _block(self, message: Any, exc: BaseException) -> integration.Block:
        name = getattr(self.handle, "__qualname__", "handler")
        return integration.call_block(
            self.handle, (message,), {}, exc, kind="queue_message",
            brief=integration.Brief(MESSAGE_BRIEF, handler=name),
            fields={"message_id": message.get("id")},
        )  # fmt: skip

    async def consume(self, queue: asyncio.Queue[Any], results: list[Any]) -> None:
        while True:
            message = await queue.get()
            try:
                results.append(await self.process(message))
            except Exception as exc:
                results.append(f"failed: {exc!r}")
            finally:
                queue.task_done()


async def handle_order(message: dict[str, Any]) -> str:
    """Return a one-line confirmation: order id, quantity and the customer's e-mail."""
    return f"order {message['id']}: {message['qty']} item(s) for {message['email']}"


def scripted_agent() -> Any:
    from crashoverride.testing import done, exec_python, script

    repair = (
        "async def handle_order(message):\n"
        '    """Return a one-line confirmation: order id, quantity and the customer\'s e-mail."""\n'
        "    email = message.get('email', message.get('customer_email'))\n"
        "    return f\"order {message['id']}: {message['qty']} item(s) for {email}\"\n"
        "replace_function(function, handle_order)\n"
        "rerun()"
    )
    return script(
        exec_python("args[0]"),
        exec_python(repair),
        done("The producer renamed `email` to `customer_email`; the handler accepts both now."),
    )


async def main(live: bool) -> list[Any]:
    recoveries: list[Any] = []
    co = CrashOverride(
        project_prompt="An order queue consumer. Never invent order data.",
        model=None if live else scripted_agent(),
        on_recovery=recoveries.append,
    )
    consumer = ProtectedConsumer(co.handler(name="orders"), handle_order)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for i, field in enumerate(["email", "customer_email", "customer_email"], 1):
        queue.put_nowait({"id": i, "qty": i, field: f"user{i}@example.com"})
    results: list[Any] = []
    worker = asyncio.create_task(consumer.consume(queue, results))
    await queue.join()
    worker.cancel()
    print(f"recoveries: {len(recoveries)}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", action="store_true", help="use a real model")
    arguments = parser.parse_args()
    if not arguments.live:
        print("(offline: the model is scripted, no AI involved)")
    for line in asyncio.run(main(arguments.live)):
        print(line)
