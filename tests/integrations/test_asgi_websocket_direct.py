"""Websocket recovery per message with the middleware called directly, on asyncio and trio.

uvicorn runs on asyncio only, so on trio the middleware is driven the way a server drives it:
a scope, and ``receive`` / ``send`` over memory channels. Each message is a unit of work: the
replay of a failed one finds the declared effects (``CrashOverride.effect``) its failed
handling made; a later message making the same call makes it again.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from crashoverride import CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.integrations.asgi._block import RequestRecovery
from crashoverride.integrations.asgi._exchange import Exchange
from crashoverride.integrations.asgi._websocket import Connection
from crashoverride.integrations.asgi._ws_block import MessageRecovery
from crashoverride.testing import done, exec_python, give_up, script
from tests.integrations.asgi_support import decorated, first_input

pytestmark = pytest.mark.anyio

STATE = {"broken": True}


@pytest.fixture(autouse=True)
def broken() -> None:
    STATE["broken"] = True


def ship(order: int) -> str:
    if STATE["broken"]:
        raise ConnectionError("the shipping service is down")
    return f"shipped {order}"


class Shop:
    """A websocket endpoint that charges (a declared effect), then ships, per message."""

    def __init__(self, co: CrashOverride) -> None:
        self.charges: list[int] = []

        def charge(order: int) -> str:
            self.charges.append(order)
            return f"ch_{order}_{len(self.charges)}"

        self.charge = co.effect(charge)

    async def orders(self, websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            order = int(await websocket.receive_text())
            receipt = self.charge(order)
            await websocket.send_json({"receipt": receipt, "shipped": ship(order)})

    def app(self, co: CrashOverride) -> Starlette:
        return Starlette(
            routes=[WebSocketRoute("/orders", self.orders)],
            middleware=[Middleware(CrashOverrideMiddleware, crash_override=co, warm_up=False)],
        )


class Client:
    """The server's side of one websocket connection, over memory channels."""

    def __init__(self) -> None:
        self.to_app, self._app_in = anyio.create_memory_object_stream[dict[str, Any]](10)
        self._app_out, self.from_app = anyio.create_memory_object_stream[dict[str, Any]](10)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stream in (self.to_app, self._app_in, self._app_out, self.from_app):
            stream.close()

    async def receive(self) -> dict[str, Any]:
        return await self._app_in.receive()

    async def send(self, message: dict[str, Any]) -> None:
        await self._app_out.send(message)

    async def next(self) -> dict[str, Any]:
        with anyio.fail_after(60):
            return await self.from_app.receive()

    def scope(self) -> dict[str, Any]:
        return {
            "type": "websocket", "asgi": {"version": "3.0"}, "scheme": "ws", "path": "/orders",
            "raw_path": b"/orders", "root_path": "", "query_string": b"", "headers": [],
            "client": ("127.0.0.1", 50000), "server": ("app.test", 80), "subprotocols": [],
        }  # fmt: skip


async def _run(app: Any, client: Client, outcome: list[BaseException | None]) -> None:
    try:
        await app(client.scope(), client.receive, client.send)
    except Exception as exc:
        outcome.append(exc)
    else:
        outcome.append(None)


async def test_the_replay_finds_the_failed_handlings_charge_and_later_messages_charge_again(
    anyio_backend: str,
) -> None:
    model = script(
        exec_python("STATE['broken'] = False\nr = await replay_message()\nr"),
        done("the shipping service is back; replayed"),
    )
    co = CrashOverride(model=model)
    shop = Shop(co)
    outcome: list[BaseException | None] = []
    with Client() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, shop.app(co), client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "7"})
            reply = await client.next()
            # The failed handling's charge was found, not made again: one charge, its receipt.
            assert json.loads(reply["text"]) == {"receipt": "ch_7_1", "shipped": "shipped 7"}
            assert shop.charges == [7]
            # A later message is a unit of its own: the same charge is a new one.
            await client.to_app.send({"type": "websocket.receive", "text": "7"})
            again = await client.next()
            assert json.loads(again["text"]) == {"receipt": "ch_7_2", "shipped": "shipped 7"}
            await client.to_app.send({"type": "websocket.disconnect", "code": 1000})
    assert shop.charges == [7, 7]
    assert model.remaining_steps == 0
    # The endpoint ends on Starlette's WebSocketDisconnect; the client had left: not recovered.
    [raised] = outcome
    assert type(raised).__name__ == "WebSocketDisconnect"


async def test_given_up_the_exception_leaves_the_middleware_as_it_was_raised(
    anyio_backend: str,
) -> None:
    model = script(give_up("the shipping service is down"))
    co = CrashOverride(model=model)
    shop = Shop(co)
    outcome: list[BaseException | None] = []
    with Client() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, shop.app(co), client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "7"})
        with pytest.raises(anyio.WouldBlock):  # nothing was sent after the accept, no close
            client.from_app.receive_nowait()
    [raised] = outcome
    assert isinstance(raised, ConnectionError)
    assert any("gave up" in note for note in raised.__notes__)
    assert shop.charges == [7]


async def test_a_restarted_endpoint_whose_setup_fails_is_not_recovered(anyio_backend: str) -> None:
    # The agent answers the failed message itself; the endpoint is started again for the next
    # messages, and its setup now fails: no message is being handled, so nothing is replayed.
    runs: list[int] = []

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        runs.append(len(runs))
        if len(runs) > 1:
            raise LookupError("the session store is gone")
        await websocket.receive_text()
        raise ConnectionError("the shipping service is down")

    model = script(exec_python("send_json({'answer': 1})"), done("answered"))
    co = CrashOverride(model=model)
    app = Starlette(
        routes=[WebSocketRoute("/orders", endpoint)],
        middleware=[Middleware(CrashOverrideMiddleware, crash_override=co, warm_up=False)],
    )
    outcome: list[BaseException | None] = []
    with Client() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, app, client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "7"})
            assert json.loads((await client.next())["text"]) == {"answer": 1}
    [raised] = outcome
    assert isinstance(raised, LookupError)
    assert any("no message was being handled" in note for note in raised.__notes__)
    assert runs == [0, 1]
    assert model.remaining_steps == 0


FAILED = {"count": 0}


async def both_failed() -> None:
    """Agent code awaits this: both connections' handlings have failed before the repair."""
    with anyio.fail_after(30):
        while FAILED["count"] < 2:  # noqa: ASYNC110 - counted by the endpoints
            await anyio.sleep(0.01)


async def test_two_connections_failing_alike_share_one_recovery(anyio_backend: str) -> None:
    FAILED["count"] = 0

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            order = int(await websocket.receive_text())
            try:
                shipped = ship(order)
            except ConnectionError:
                FAILED["count"] += 1
                raise
            await websocket.send_json({"shipped": shipped})

    model = script(
        exec_python("await both_failed()\nSTATE['broken'] = False\nr = await replay_message()"),
        done("the shipping service is back; replayed"),
    )
    co = CrashOverride(model=model)
    app = Starlette(
        routes=[WebSocketRoute("/orders", endpoint)],
        middleware=[Middleware(CrashOverrideMiddleware, crash_override=co, warm_up=False)],
    )
    outcomes: list[BaseException | None] = []
    with Client() as first, Client() as second:
        async with anyio.create_task_group() as group:
            for number, client in enumerate((first, second), 1):
                group.start_soon(_run, app, client, outcomes)
                await client.to_app.send({"type": "websocket.connect"})
                assert (await client.next())["type"] == "websocket.accept"
                await client.to_app.send({"type": "websocket.receive", "text": str(number)})
            # The waiter replays its own message through the repaired code, and goes on.
            for number, client in enumerate((first, second), 1):
                reply = json.loads((await client.next())["text"])
                assert reply == {"shipped": f"shipped {number}"}
                await client.to_app.send({"type": "websocket.receive", "text": "9"})
                assert json.loads((await client.next())["text"]) == {"shipped": "shipped 9"}
                await client.to_app.send({"type": "websocket.disconnect", "code": 1000})
    assert model.remaining_steps == 0
    assert len(model.calls) == 2  # one agent run of two turns: the second connection waited
    assert [type(o).__name__ for o in outcomes] == ["WebSocketDisconnect"] * 2


SENT_MEANWHILE = {"done": False}


async def client_sent_again() -> None:
    """Agent code awaits this: the client sent its next message during the recovery."""
    with anyio.fail_after(30):
        while not SENT_MEANWHILE["done"]:  # noqa: ASYNC110 - set by the test
            await anyio.sleep(0.01)


async def test_a_message_sent_during_the_recovery_is_held_for_the_restarted_endpoint(
    anyio_backend: str,
) -> None:
    SENT_MEANWHILE["done"] = False
    model = script(
        exec_python("await client_sent_again()\nSTATE['broken'] = False\nawait replay_message()"),
        done("replayed"),
    )
    co = CrashOverride(model=model)
    shop = Shop(co)
    outcome: list[BaseException | None] = []
    with Client() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, shop.app(co), client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "1"})
            await client.to_app.send({"type": "websocket.receive", "text": "2"})
            SENT_MEANWHILE["done"] = True
            first, second = await client.next(), await client.next()
            await client.to_app.send({"type": "websocket.disconnect", "code": 1000})
    assert json.loads(first["text"])["shipped"] == "shipped 1"
    assert json.loads(second["text"])["shipped"] == "shipped 2"
    assert shop.charges == [1, 2]


async def test_a_message_too_large_to_keep_can_only_be_answered(anyio_backend: str) -> None:
    model = script(
        exec_python(
            "try:\n    await replay_message()\nexcept Exception as error:\n"
            "    refused = type(error).__name__\nsend_json({'refused': refused})"
        ),
        done("answered"),
    )
    co = CrashOverride(model=model)
    shop = Shop(co)
    app = Starlette(
        routes=[WebSocketRoute("/orders", shop.orders)],
        middleware=[Middleware(CrashOverrideMiddleware, crash_override=co, warm_up=False,
                               max_message=2)],
    )  # fmt: skip
    outcome: list[BaseException | None] = []
    with Client() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, app, client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "123"})
            reply = json.loads((await client.next())["text"])
            await client.to_app.send({"type": "websocket.disconnect", "code": 1000})
    assert reply == {"refused": "NotReplayable"}
    assert shop.charges == [123]
    assert "NOT replayable" in first_input(model)


async def test_an_error_of_the_servers_channel_is_not_the_apps_to_recover(
    anyio_backend: str,
) -> None:
    STATE["broken"] = False
    model = script()
    co = CrashOverride(model=model)
    shop = Shop(co)
    outcome: list[BaseException | None] = []

    class Gone(Client):
        async def send(self, message: dict[str, Any]) -> None:
            if message["type"] == "websocket.send":
                raise OSError("the client went away")
            await super().send(message)

    with Gone() as client:
        async with anyio.create_task_group() as group:
            group.start_soon(_run, shop.app(co), client, outcome)
            await client.to_app.send({"type": "websocket.connect"})
            assert (await client.next())["type"] == "websocket.accept"
            await client.to_app.send({"type": "websocket.receive", "text": "5"})
    [raised] = outcome
    # Starlette turns the server's OSError into a disconnect: the app did not fail.
    assert type(raised).__name__ == "WebSocketDisconnect"
    assert isinstance(raised.__context__, OSError)
    assert model.calls == ()
    assert not getattr(raised, "__notes__", [])


async def test_without_an_application_frame_the_agent_works_in_the_endpoints_own_module(
    anyio_backend: str,
) -> None:
    # An exception that carries no traceback has no application frame: the agent's code runs in
    # the globals of the endpoint routing chose, through its decorator (``functools.wraps``) to
    # the function the application wrote, for a failed message as for a failed request (they
    # shared no code, and the message's took the decorator's module).
    co = CrashOverride(model=script())
    handler = co.handler()
    shop = Shop(co)
    with Client() as client:
        scope = {**client.scope(), "endpoint": decorated(shop.orders)}
        conn = Connection(scope, client.receive, client.send, 1024, handler)
        message = MessageRecovery(
            app=shop.app(co), exc=ConnectionError("raised nowhere"), conn=conn, handler=handler,
            unit=None, start=lambda instance: None,
        )  # fmt: skip
        http = {**scope, "type": "http", "method": "GET", "scheme": "http"}
        request = RequestRecovery(
            app=shop.app(co), exc=ConnectionError("raised nowhere"), runner=None,
            exchange=Exchange(http, client.receive, client.send, 1024), request_id_header=None,
        )  # fmt: skip
        for block in (message.block, request.block):
            assert block.frame is None
            assert block.globals is globals()
            assert block.bindings["endpoint"] is scope["endpoint"]
            block.release()
