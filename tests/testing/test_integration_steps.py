"""The request and task step helpers rehearse real recoveries."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from crashoverride import CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.testing import done, script
from crashoverride.testing.asgi import patch, replay_request, respond
from crashoverride.testing.tasks import rerun, set_result
from tests.integrations.asgi_support import serve

PRICES = {"tea": {"amount": 3}}


def price_of(item: str) -> int:
    return PRICES[item]["price"]


async def price(request: Request) -> JSONResponse:
    return JSONResponse({"price": price_of(request.path_params["item"])})


@pytest.mark.slow
def test_patch_and_replay_a_request() -> None:
    model = script(
        patch("price_of", "def price_of(item):\n    return PRICES[item]['amount']\n"),
        replay_request(),
        done("renamed field; patched and replayed"),
    )
    app = Starlette(routes=[Route("/price/{item}", price)])
    app.add_middleware(CrashOverrideMiddleware, crash_override=CrashOverride(model=model))
    original = price_of.__code__
    try:
        with serve(app) as served:
            first = httpx.get(f"{served.url}/price/tea", timeout=30)
            second = httpx.get(f"{served.url}/price/tea", timeout=30)
    finally:
        price_of.__code__ = original
    assert (first.status_code, first.json()) == (200, {"price": 3})
    assert (second.status_code, second.json()) == (200, {"price": 3})


@pytest.mark.slow
def test_respond_with_a_built_response() -> None:
    model = script(respond(503, {"retry": True}, headers={"retry-after": "5"}), done())
    app = Starlette(routes=[Route("/price/{item}", price)])
    app.add_middleware(CrashOverrideMiddleware, crash_override=CrashOverride(model=model))
    with serve(app) as served:
        response = httpx.get(f"{served.url}/price/coffee", timeout=30)
    assert response.status_code == 503 and response.json() == {"retry": True}
    assert response.headers["retry-after"] == "5"


def test_set_result_and_rerun() -> None:
    co = CrashOverride(model=script(set_result([1, 2]), done(), rerun(), done()))

    @co.handler()
    def listing() -> list[int]:
        raise ValueError("down")

    assert listing() == [1, 2]
    attempts: list[int] = []

    @co.handler()
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("reset")
        return "ok"

    assert flaky() == "ok" and len(attempts) == 2
