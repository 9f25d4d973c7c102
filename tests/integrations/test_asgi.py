"""The ASGI middleware against a real uvicorn server and a real HTTP client."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, script, tool_outputs
from tests.integrations import asgi_apps
from tests.integrations.asgi_support import first_input, named, serve

FIX = """
def read_price(item):
    return PRICES[item]["cost"]
globals()["read_price"] = read_price
r = await replay_request()
r
"""

APPS: dict[str, Callable[..., Any]] = {
    "starlette": asgi_apps.starlette_app,
    "fastapi": asgi_apps.fastapi_app,
}


@pytest.fixture(autouse=True)
def probe(monkeypatch: pytest.MonkeyPatch) -> asgi_apps.Probe:
    # Agents patch ``read_price`` in the app module: put the broken one back after each test.
    monkeypatch.setattr(asgi_apps, "read_price", asgi_apps.read_price)
    fresh = asgi_apps.Probe()
    monkeypatch.setattr(asgi_apps, "PROBE", fresh)
    return fresh


@pytest.mark.parametrize(
    ("flavour", "path", "endpoint"),
    [
        ("starlette", "/price/apple", "price"),
        ("fastapi", "/price/apple", "fastapi_price"),
        ("fastapi", "/sync-price/apple", "fastapi_sync_price"),
    ],
)
def test_recovered_via_replay(
    flavour: str, path: str, endpoint: str, logs: list[dict[str, Any]]
) -> None:
    model = script(
        exec_python("endpoint.__name__"),
        exec_python(FIX),
        done("read_price reads 'cost' now; replayed"),
    )
    app = APPS[flavour](crash_override=CrashOverride(model=model), prompt="Real prices only.")
    with serve(app) as server:
        first = httpx.get(server.url + path, headers={"X-Request-ID": "req-42"}, timeout=30)
        # The repair holds for later requests: no second agent run (no model steps left).
        second = httpx.get(server.url + path.replace("apple", "pear"), timeout=30)
    assert (first.status_code, first.json()) == (200, {"item": "apple", "price": 3})
    assert (second.status_code, second.json()) == (200, {"item": "pear", "price": 5})
    assert model.remaining_steps == 0
    endpoint_name, replayed = tool_outputs(model)
    assert endpoint_name == endpoint  # the routed endpoint is in the namespace
    assert "200" in replayed
    assert "GET is a safe method" in first_input(model)
    [started] = named(logs, "recovery.started")
    [succeeded] = named(logs, "recovery.succeeded")
    for event in (started, succeeded):
        assert event["method"] == "GET"
        assert event["path"] == path
        assert event["request_id"] == "req-42"
    assert succeeded["handler"] == "request"


@pytest.mark.parametrize("flavour", APPS)
def test_recovered_via_respond(flavour: str, logs: list[dict[str, Any]]) -> None:
    model = script(
        exec_python(
            "item = request.json()['item']\n"
            "respond(200, {'ordered': item, 'total': PRICES[item]['cost'] * 2},"
            " headers={'x-recovered': 'yes'})"
        ),
        done("answered from PRICES"),
    )
    app = APPS[flavour](crash_override=CrashOverride(model=model))
    with serve(app) as server:
        response = httpx.post(server.url + "/order", json={"item": "pear"}, timeout=30)
    assert response.status_code == 200
    assert response.json() == {"ordered": "pear", "total": 10}
    assert response.headers["x-recovered"] == "yes"
    assert response.headers["content-type"] == "application/json"
    brief = first_input(model)
    assert "POST is NOT idempotent" in brief
    assert "is kept: the request is replayable" in brief
    assert named(logs, "recovery.succeeded")[0]["method"] == "POST"


@pytest.mark.parametrize("flavour", APPS)
def test_gave_up_gives_the_normal_500_and_the_server_logs_it(
    flavour: str, logs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    model = script(give_up("the price source has no usable field"))
    app = APPS[flavour](crash_override=CrashOverride(model=model))
    plain = APPS[flavour](crash_override=CrashOverride(model=script()), exclude=["/*"])
    with caplog.at_level(logging.ERROR):
        with serve(app) as server:
            response = httpx.get(server.url + "/price/apple", timeout=30)
        with serve(plain) as server:
            unprotected = httpx.get(server.url + "/price/apple", timeout=30)
    assert response.status_code == 500
    assert (response.text, response.headers["content-type"]) == (
        unprotected.text,
        unprotected.headers["content-type"],
    )
    errors = [r for r in caplog.records if r.name == "uvicorn.error" and r.exc_info]
    assert len(errors) == 2
    exc = errors[0].exc_info[1] if errors[0].exc_info else None
    assert isinstance(exc, KeyError)
    assert any("gave up" in note for note in getattr(exc, "__notes__", []))
    assert named(logs, "recovery.failed")[0]["path"] == "/price/apple"


@pytest.mark.parametrize("flavour", APPS)
def test_failure_after_the_response_started_never_sends_twice(
    flavour: str, logs: list[dict[str, Any]]
) -> None:
    model = script()
    starts: list[int] = []
    inner = APPS[flavour](crash_override=CrashOverride(model=model))

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                starts.append(message["status"])
            await send(message)

        await inner(scope, receive, watch)

    with serve(counting) as server, httpx.Client(timeout=30) as client:
        with client.stream("GET", server.url + "/stream-fail") as response:
            assert response.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                b"".join(response.iter_bytes())
    assert starts == [200]
    assert model.calls == ()
    [skipped] = named(logs, "recovery.skipped")
    assert "already started" in skipped["reason"]
    assert skipped["path"] == "/stream-fail"


@pytest.mark.parametrize("flavour", APPS)
def test_streaming_background_websocket_and_lifespan_pass_through(
    flavour: str, probe: asgi_apps.Probe
) -> None:
    model = script()
    app = APPS[flavour](crash_override=CrashOverride(model=model))
    with serve(app) as server:
        assert probe.events == ["startup"]
        with httpx.Client(base_url=server.url, timeout=30) as client:
            with client.stream("GET", "/stream") as response:
                pieces = list(response.iter_raw())
            assert b"".join(pieces) == b"".join(f"chunk-{i}\n".encode() for i in range(5))
            assert response.headers.get("transfer-encoding") == "chunked"
            assert client.get("/background").text == "queued"
            assert probe.background_done.wait(5)
            assert client.get("/greeting").text == f"hello from {flavour}"
        with ws_connect(server.url.replace("http", "ws") + "/ws") as websocket:
            websocket.send("hi")
            assert websocket.recv(timeout=5) == "echo: hi"
            websocket.send("bye")
    assert probe.events == ["startup", "background ran", "shutdown"]
    assert model.calls == ()


def _chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    block = random.Random(size).randbytes(size)  # the same bytes for the expected digest
    for _ in range(total // size):
        yield block


def test_large_upload_streams_through_unbuffered() -> None:
    total = 20 * 1024 * 1024
    app = asgi_apps.starlette_app(crash_override=CrashOverride(model=script()))
    expected = hashlib.sha256(b"".join(_chunks(total))).hexdigest()
    with serve(app) as server:
        response = httpx.post(server.url + "/upload", content=_chunks(total), timeout=60)
    body = response.json()
    assert response.status_code == 200
    assert body["size"] == total
    # Many body messages reached the endpoint: it read the stream as it came, not one blob.
    assert body["chunks"] > 10
    assert body["sha256"] == expected


def test_large_failed_upload_is_not_replayable_and_the_agent_is_told() -> None:
    total = 20 * 1024 * 1024
    model = script(
        exec_python("request.replayable, request.body"),
        exec_python("await replay_request()"),
        exec_python("respond(503, 'Price service unavailable, retry later', {'retry-after': '5'})"),
        done("answered 503: the upload cannot be replayed"),
    )
    app = asgi_apps.starlette_app(
        crash_override=CrashOverride(model=model), max_replay_body=1024 * 1024
    )
    with serve(app) as server:
        response = httpx.post(server.url + "/upload?fail=1", content=_chunks(total), timeout=60)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert "NOT replayable" in first_input(model)
    looked, replayed = tool_outputs(model)[:2]
    assert "(False, None)" in looked
    assert "NotReplayable" in replayed


def test_burst_of_identical_failures_costs_one_agent_run(
    probe: asgi_apps.Probe, logs: list[dict[str, Any]]
) -> None:
    burst = 200
    probe.burst_size = burst
    model = script(
        # Repair only once every request of the burst has failed: they all wait on this run.
        exec_python("await PROBE.wait_for_burst()\n" + FIX),
        done("repaired once for the whole burst"),
    )
    app = asgi_apps.starlette_app(crash_override=CrashOverride(model=model))

    async def fire(url: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=burst, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            return await asyncio.gather(*(client.get(f"{url}/price/apple") for _ in range(burst)))

    with serve(app, backlog=4096) as server:
        began = time.monotonic()
        responses = asyncio.run(fire(server.url))
        elapsed = time.monotonic() - began
    assert [r.status_code for r in responses] == [200] * burst
    assert all(r.json() == {"item": "apple", "price": 3} for r in responses)
    assert len(named(logs, "recovery.started")) == 1
    assert len(model.calls) == 2 and model.remaining_steps == 0
    replayed = [e for e in named(logs, "recovery.succeeded") if e.get("via") == "replay"]
    assert len(replayed) == burst - 1
    assert elapsed < 30


def test_client_disconnect_cancels_the_recovery(
    probe: asgi_apps.Probe, logs: list[dict[str, Any]]
) -> None:
    model = script(exec_python("await PROBE.hang()"))
    app = asgi_apps.starlette_app(crash_override=CrashOverride(model=model))
    with serve(app) as server:
        # A declared body: the middleware reads it, then listens for the client leaving.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/hang", json={"item": "pear"}, timeout=1.0)
        assert probe.cancelled.wait(10), "the agent's work was not cancelled"
        deadline = time.monotonic() + 10
        while not named(logs, "recovery.cancelled") and time.monotonic() < deadline:
            time.sleep(0.05)
    [cancelled] = named(logs, "recovery.cancelled")
    assert cancelled["reason"] == "the client disconnected"
    assert cancelled["path"] == "/hang"
    assert len(model.calls) == 1  # no model turn after the cancellation
    assert not named(logs, "recovery.succeeded")
