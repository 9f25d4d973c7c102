"""Requests are units of work: a replay, a waiter's replay or a client's retry with the same
``Idempotency-Key`` finds the declared effects the failed request made instead of repeating them.

A real uvicorn server and a real httpx client (asyncio), and the middleware called directly on
asyncio and trio. The "outside world" is the list of charges made; only the model is scripted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from crashoverride import ConfigurationError, CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.testing import done, exec_python, give_up, script
from tests.integrations.asgi_support import first_input, serve

# The shipping service is down until the agent (or a deploy, between two requests) repairs it.
STATE = {"broken": True}
REPAIR_AND_REPLAY = "STATE['broken'] = False\nr = await replay_request()\nr.status, r.json()"


@pytest.fixture(autouse=True)
def broken() -> None:
    STATE["broken"] = True


def ship(order: int) -> str:
    if STATE["broken"]:
        raise ConnectionError("the shipping service is down")
    return f"shipped {order}"


class Shop:
    """An app that charges a card, then ships; the card processor is ``charges``."""

    def __init__(self, co: CrashOverride, *, declared: bool = True) -> None:
        self.charges: list[int] = []
        self.mails: list[str] = []
        lock = threading.Lock()  # sync endpoints charge from the thread pool

        def charge(order: int, amount: int) -> str:
            with lock:
                self.charges.append(order)
                return f"ch_{order}_{len(self.charges)}"

        def mail(text: str) -> None:
            self.mails.append(text)

        if declared:
            self.charge = co.effect(charge, key=lambda order, amount: f"charge order {order}")
            self.mail = co.effect(mail)
        else:
            self.charge, self.mail = charge, mail

    async def checkout(self, request: Request) -> Response:
        order = (await request.json())["order"]
        receipt = self.charge(order, 100)
        return JSONResponse({"receipt": receipt, "shipped": ship(order)})

    def checkout_sync(self, request: Request) -> Response:  # run in the thread pool
        order = int(request.path_params["order"])
        receipt = self.charge(order, 100)
        return JSONResponse({"receipt": receipt, "shipped": ship(order)})

    async def donate(self, request: Request) -> Response:
        order = (await request.json())["order"]
        return JSONResponse({"receipt": self.charge(order, 100), "shipped": ship(order)})

    async def notify(self, request: Request) -> Response:
        return PlainTextResponse("queued", background=BackgroundTask(send_receipt, self, 5))

    def app(self, **options: Any) -> Starlette:
        routes = [
            Route("/checkout", self.checkout, methods=["POST"]),
            Route("/checkout-sync/{order}", self.checkout_sync, methods=["POST"]),
            Route("/donate", self.donate, methods=["POST"]),
            Route("/notify", self.notify, methods=["POST"]),
        ]
        return Starlette(routes=routes, middleware=[Middleware(CrashOverrideMiddleware, **options)])


def send_receipt(shop: Shop, order: int) -> None:
    shop.mail(f"order {order} paid")
    ship(order)  # the mail went out; the shipping request after it fails


# -- a real server, a real client -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/checkout", "/checkout-sync/17"])
def test_a_replayed_post_returns_the_recorded_charge_instead_of_charging_again(path: str) -> None:
    model = script(exec_python(REPAIR_AND_REPLAY), done("shipping repaired; replayed"))
    shop = Shop(co := CrashOverride(model=model))
    with serve(shop.app(crash_override=co)) as server:
        response = httpx.post(server.url + path, json={"order": 17}, timeout=60)
    assert (response.status_code, response.json()) == (
        200, {"receipt": "ch_17_1", "shipped": "shipped 17"},
    )  # fmt: skip
    assert shop.charges == [17]  # charged once, though the request ran twice
    assert "charge order 17 -> 'ch_17_1' (done)" in first_input(model)


def test_without_the_declaration_the_replay_charges_twice() -> None:
    # The same shop, its charge not declared: what the journal prevents.
    model = script(exec_python(REPAIR_AND_REPLAY), done("shipping repaired; replayed"))
    shop = Shop(co := CrashOverride(model=model), declared=False)
    with serve(shop.app(crash_override=co)) as server:
        response = httpx.post(server.url + "/checkout", json={"order": 18}, timeout=60)
    assert (response.status_code, response.json()["receipt"]) == (200, "ch_18_2")
    assert shop.charges == [18, 18]


def test_a_client_retry_with_the_same_idempotency_key_finds_the_charge() -> None:
    # The first request charged, then failed; the agent gave up, the client got its 500. The
    # shipping service came back; the client retries with the same key: the retry's charge is
    # the one already made. A new key is a new request, and charges.
    co = CrashOverride(model=script(give_up("the shipping service is down")))
    shop = Shop(co)
    key = {"Idempotency-Key": "3c9ae5ea-980f-4ebd-a027-04529942b95e"}
    with serve(shop.app(crash_override=co)) as server:
        url = server.url + "/checkout"
        failed = httpx.post(url, json={"order": 1}, headers=key, timeout=60)
        STATE["broken"] = False
        retried = httpx.post(url, json={"order": 1}, headers=key, timeout=60)
        again = httpx.post(url, json={"order": 1}, headers=key, timeout=60)
        other = httpx.post(url, json={"order": 1}, headers={"Idempotency-Key": "k2"}, timeout=60)
        unkeyed = httpx.post(url, json={"order": 1}, timeout=60)
    assert failed.status_code == 500
    assert [r.json()["receipt"] for r in (retried, again)] == ["ch_1_1", "ch_1_1"]
    assert [r.json()["receipt"] for r in (other, unkeyed)] == ["ch_1_2", "ch_1_3"]
    assert shop.charges == [1, 1, 1]


def test_an_idempotency_key_is_scoped_to_its_route_method_and_credentials() -> None:
    # Like Stripe's, a key names one request of one client: the same key sent to another route,
    # or by another client (other credentials), is another unit and never reads this journal.
    co = CrashOverride()
    shop = Shop(co)
    STATE["broken"] = False
    key = "order-2-attempt"
    with serve(shop.app(crash_override=co, idempotency_header="X-Request-Key")) as server:

        def post(path: str, **headers: str) -> str:
            response = httpx.post(
                server.url + path, json={"order": 2}, timeout=60,
                headers={"X-Request-Key": key, **headers},
            )  # fmt: skip
            assert response.status_code == 200, response.text
            return str(response.json()["receipt"])

        receipts = [
            post("/checkout", Authorization="Bearer alice"),
            post("/checkout", Authorization="Bearer alice"),  # alice's retry
            post("/checkout", Authorization="Bearer bob"),
            post("/donate", Authorization="Bearer alice"),
            post("/checkout", Cookie="session=carol"),
            post("/checkout", Cookie="session=carol"),  # carol's retry
        ]
        default_header = httpx.post(
            server.url + "/checkout", json={"order": 2}, timeout=60,
            headers={"Idempotency-Key": key, "Authorization": "Bearer alice"},
        )  # fmt: skip
    assert receipts == ["ch_2_1", "ch_2_1", "ch_2_2", "ch_2_3", "ch_2_4", "ch_2_4"]
    # The header is the configured one: the default name means nothing to this app.
    assert default_header.json()["receipt"] == "ch_2_5"


# -- the middleware called directly, on asyncio and trio ---------------------------------------


async def post(
    app: Any, path: str, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = ()
) -> tuple[int, bytes]:
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await anyio.sleep_forever()  # the client stays connected
        raise AssertionError  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    await app(scope, receive, send)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    return start["status"], b"".join(m.get("body", b"") for m in sent if "body" in m)


@pytest.mark.anyio
async def test_replay_and_idempotent_retry_on_each_backend(anyio_backend: str) -> None:
    model = script(exec_python(REPAIR_AND_REPLAY), done("replayed"), give_up("down again"))
    shop = Shop(co := CrashOverride(model=model))
    app = shop.app(crash_override=co)
    assert await post(app, "/checkout", b'{"order": 3}') == (
        200, b'{"receipt":"ch_3_1","shipped":"shipped 3"}',
    )  # fmt: skip
    STATE["broken"] = True
    key = [(b"idempotency-key", b"k-4")]
    with pytest.raises(ConnectionError):  # given up: the app's own 500 follows
        await post(app, "/checkout", b'{"order": 4}', key)
    STATE["broken"] = False
    assert await post(app, "/checkout", b'{"order": 4}', key) == (
        200, b'{"receipt":"ch_4_2","shipped":"shipped 4"}',
    )  # fmt: skip
    assert shop.charges == [3, 4]


@pytest.mark.anyio
async def test_a_background_task_s_rerun_finds_the_mail_it_sent(anyio_backend: str) -> None:
    # A background task is part of its request's unit: re-run after the repair, it does not
    # send the mail its failed run sent.
    model = script(exec_python("STATE['broken'] = False\nrerun()"), done("re-run"))
    shop = Shop(co := CrashOverride(model=model))
    assert await post(shop.app(crash_override=co), "/notify") == (200, b"queued")
    assert shop.mails == ["order 5 paid"]
    assert model.remaining_steps == 0


def test_a_bad_idempotency_header_fails_at_construction() -> None:
    co = CrashOverride()
    for bad in ("", "  ", "Idempotency Key", 7, b"idempotency-key"):
        with pytest.raises(ConfigurationError, match="idempotency_header"):
            CrashOverrideMiddleware(Shop(co).app, crash_override=co, idempotency_header=bad)
    CrashOverrideMiddleware(Shop(co).app, crash_override=co, idempotency_header=None)
