"""The ASGI middleware called directly, on asyncio and trio: options, replay, background work."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from structlog.testing import capture_logs

from crashoverride import ConfigurationError, CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware, TaskGroupRunner
from crashoverride.integrations.asgi._block import build_response, settle_body
from crashoverride.integrations.asgi._exchange import Exchange
from crashoverride.testing import Script, done, exec_python, script, tool_outputs

pytestmark = pytest.mark.anyio

FLAKY = True
SEEN: list[str] = []


def echo_body(body: bytes) -> bytes:
    if FLAKY:
        raise LookupError("the echo service is flaky")
    return body


async def raw_app(scope: Any, receive: Any, send: Any) -> None:
    """A plain ASGI app: lifespan support, and an endpoint that fails before reading its body."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                SEEN.append("app shutdown")
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/fail-first":
        echo_body(b"")  # raises before the body was read
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    payload = echo_body(body)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-echo", b"1")]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(autouse=True)
def reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "FLAKY", True)
    SEEN.clear()


async def call(
    app: Any,
    method: str = "GET",
    path: str = "/",
    chunks: Sequence[bytes] = (b"",),
    headers: Sequence[tuple[bytes, bytes]] = (),
    disconnect_after: float | None = None,
    receive_error: Exception | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    inbox = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if receive_error is not None:
            raise receive_error
        if inbox:
            return inbox.pop(0)
        if disconnect_after is not None:
            await anyio.sleep(disconnect_after)
            return {"type": "http.disconnect"}
        await anyio.sleep_forever()  # the client stays connected
        raise AssertionError  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": list(headers), "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    await app(scope, receive, send)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return starts[0]["status"], dict(starts[0]["headers"]), body


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    to_app, app_inbox = anyio.create_memory_object_stream[dict[str, Any]](4)
    app_outbox, from_app = anyio.create_memory_object_stream[dict[str, Any]](4)
    async with anyio.create_task_group() as group, to_app, from_app, app_inbox, app_outbox:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        group.start_soon(app, scope, app_inbox.receive, app_outbox.send)
        await to_app.send({"type": "lifespan.startup"})
        assert (await from_app.receive())["type"] == "lifespan.startup.complete"
        yield
        await to_app.send({"type": "lifespan.shutdown"})
        assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"


async def test_replay_gets_the_whole_body_the_app_never_read(anyio_backend: str) -> None:
    model = script(
        exec_python(
            "assert request.header('authorization') == '[REDACTED]', request.headers\n"
            "global FLAKY\nFLAKY = False\nr = await replay_request()\nr.status, r.body"
        ),
        done("replayed"),
    )
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    status, headers, body = await call(
        app, "PUT", "/fail-first", chunks=(b"one,", b"two,", b"three"),
        headers=[(b"authorization", b"Bearer sekrit-token-123"), (b"content-length", b"13")],
    )  # fmt: skip
    assert (status, headers[b"x-echo"], body) == (200, b"1", b"one,two,three")
    assert "(200, b'one,two,three')" in tool_outputs(model)[0]


async def test_a_client_disconnect_ends_the_recovery(anyio_backend: str) -> None:
    model = script(exec_python("await anyio.sleep(1.5)\nrespond(200, 'too late')"), done())
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    began = time.monotonic()
    # The body is declared, so the middleware reads it and then listens for the disconnect (a
    # request without one is never read: see test_asgi_containment).
    with capture_logs() as logs, pytest.raises(LookupError) as caught:
        await call(
            app, "POST", "/fail-first", chunks=(b"one,", b"two"),
            headers=[(b"content-length", b"7")], disconnect_after=0.3,
        )  # fmt: skip
    assert time.monotonic() - began < 1.4
    [cancelled] = [e for e in logs if e["event"] == "recovery.cancelled"]
    assert cancelled["reason"] == "the client disconnected"
    assert any("client disconnected" in note for note in caught.value.__notes__)


async def test_a_replay_routes_from_the_scope_the_server_sent(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Mount, Route

    from tests.integrations import asgi_apps

    monkeypatch.setattr(asgi_apps, "read_price", asgi_apps.read_price)
    model = script(
        exec_python(
            "def read_price(item):\n    return PRICES[item]['cost']\n"
            "globals()['read_price'] = read_price\nr = await replay_request()\nr.status"
        ),
        done("patched and replayed"),
    )
    # Routing through a Mount rewrites root_path in the scope: replaying that mutated scope
    # would route to /api/api/... and 404.
    app = Starlette(
        routes=[Mount("/api", routes=[Route("/price/{item}", asgi_apps.price)])],
        middleware=[Middleware(CrashOverrideMiddleware, crash_override=CrashOverride(model=model))],
    )
    status, _, body = await call(app, "GET", "/api/price/pear")
    assert (status, body) == (200, b'{"item":"pear","price":5}')
    assert tool_outputs(model)[0] == "200"


async def test_background_work_runs_in_the_lifespan_group(anyio_backend: str) -> None:
    model = script(
        exec_python(
            "from crashoverride import followups\n"
            "assert followups.current_runner() is background\n"
            "async def warm_again():\n"
            "    await anyio.sleep(0.05)\n"
            "    SEEN.append('follow-up done')\n"
            "job = spawn_background(warm_again)\n"
            "respond(202, 'accepted')\n"
            "job"
        ),
        done("answered; follow-up queued"),
    )
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    with capture_logs() as logs:
        async with lifespan(app):
            assert isinstance(app.background, TaskGroupRunner)
            status, _, body = await call(app, "POST", "/echo")
            assert (status, body) == (202, b"accepted")
    assert app.background is None
    # Drained before the app's own shutdown ran.
    assert SEEN == ["follow-up done", "app shutdown"]
    job_id = tool_outputs(model)[0].strip("'")
    assert [e["job_id"] for e in logs if e["event"] == "background.succeeded"] == [job_id]


async def test_follow_ups_of_a_request_recovery_run_in_the_lifespan_group(
    anyio_backend: str,
) -> None:
    model = (
        Script(
            exec_python("spawn_followup('write the permanent fix as a patch file')"),
            exec_python("respond(503, 'try again shortly')"),
            done("answered 503; follow-up queued"),
        )
        .run(
            done("follow-up: nothing to do in a test")  # the follow-up's own agent run
        )
        .model()
    )
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    with capture_logs() as logs:
        async with lifespan(app):
            assert (await call(app, "GET", "/fail-first"))[0] == 503
    [submitted] = [e for e in logs if e["event"] == "followup.submitted"]
    assert submitted["runner"] == "TaskGroupRunner"
    assert [e["event"] for e in logs if e["event"].startswith("background.")] == [
        "background.submitted",
        "background.succeeded",
    ]
    assert model.remaining_steps == 0


async def test_shutdown_cancels_background_work_after_the_grace_period(
    anyio_backend: str,
) -> None:
    app = CrashOverrideMiddleware(
        raw_app, crash_override=CrashOverride(model=script()), shutdown_grace=0.2
    )

    async def forever() -> None:
        try:
            await anyio.sleep(60)
        finally:
            SEEN.append("cancelled")

    def fails() -> None:
        raise RuntimeError("follow-up broke")

    began = time.monotonic()
    with capture_logs() as logs:
        async with lifespan(app):
            runner = app.background
            assert runner is not None
            stuck = runner.submit(forever, name="forever")
            # From a worker thread, as a follow-up runner may be called; a plain function
            # runs in a thread of its own, and its failure stays contained.
            broken = await anyio.to_thread.run_sync(lambda: runner.submit(fails, name="fails"))
            await anyio.sleep(0.1)
            assert runner.status(broken) == "failed"
            assert runner.status(stuck) == "running"
    assert time.monotonic() - began < 5
    assert runner.status(stuck) == "cancelled"
    assert SEEN == ["cancelled", "app shutdown"]
    assert [e["job"] for e in logs if e["event"] == "background.failed"] == ["fails"]
    assert [e["job"] for e in logs if e["event"] == "background.cancelled"] == ["forever"]
    with pytest.raises(RuntimeError, match="shutting down"):
        runner.submit(forever, name="late")


async def test_without_a_lifespan_background_work_is_refused(anyio_backend: str) -> None:
    model = script(
        exec_python("async def later():\n    pass\nspawn_background(later)"),
        exec_python("respond(200, 'ok')"),
        done(),
    )
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    assert (await call(app, "GET", "/fail-first"))[0] == 200
    assert "no background runner" in tool_outputs(model)[0]


async def test_only_the_configured_requests_and_exceptions_are_recovered(
    anyio_backend: str,
) -> None:
    model = script()  # any agent run would fail the test: no steps
    co = CrashOverride(model=model)
    apps = [
        CrashOverrideMiddleware(raw_app, crash_override=co, methods=["post"]),
        CrashOverrideMiddleware(raw_app, crash_override=co, include=["/api/*"]),
        CrashOverrideMiddleware(raw_app, crash_override=co, exclude=[re.compile(r"/fail-.*")]),
        CrashOverrideMiddleware(raw_app, crash_override=co, catch=(ValueError,)),
    ]
    for app in apps:
        with pytest.raises(LookupError, match="flaky"):
            await call(app, "GET", "/fail-first")
    assert model.calls == ()


class BodyTooLarge(Exception):
    """What an outer body-limit middleware raises from ``receive``."""


async def test_errors_of_the_outer_channel_are_not_recovered(anyio_backend: str) -> None:
    model = script()  # any agent run would fail the test: no steps
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model))
    error = BodyTooLarge("413")
    with capture_logs() as logs, pytest.raises(BodyTooLarge) as caught:
        await call(app, "POST", "/echo", receive_error=error)
    assert caught.value is error
    assert model.calls == ()
    assert not logs


async def test_a_failure_after_the_client_left_is_skipped(anyio_backend: str) -> None:
    model = script()

    async def gone(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.disconnect"
        raise ConnectionError("the client went away")

    app = CrashOverrideMiddleware(gone, crash_override=CrashOverride(model=model))
    with capture_logs() as logs, pytest.raises(ConnectionError):
        await call(app, "GET", "/", chunks=(), disconnect_after=0)
    assert model.calls == ()
    [skipped] = [e for e in logs if e["event"] == "recovery.skipped"]
    assert "disconnected" in skipped["reason"]


async def test_the_request_budget_bounds_a_stuck_recovery(anyio_backend: str) -> None:
    model = script(exec_python("await anyio.sleep(30)"))
    app = CrashOverrideMiddleware(raw_app, crash_override=CrashOverride(model=model), timeout=0.3)
    began = time.monotonic()
    with capture_logs() as logs, pytest.raises(LookupError) as caught:
        await call(app, "GET", "/fail-first")
    assert time.monotonic() - began < 3
    # The core's agent deadline or, if the wait around it is longer, the request's budget.
    [ended] = [e for e in logs if e["event"] in ("recovery.failed", "recovery.cancelled")]
    assert re.search(r"timed out|budget", ended["reason"])
    assert any(re.search(r"timed out|budget", note) for note in caught.value.__notes__)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"crash_override": object()}, "crash_override"),
        ({"prompt": 3}, "prompt"),
        ({"include": [3]}, "include"),
        ({"exclude": 5}, "exclude"),
        ({"methods": ["GET", "not a method"]}, "methods"),
        ({"methods": []}, "methods"),
        ({"catch": KeyboardInterrupt}, "catch"),
        ({"timeout": 0}, "timeout"),
        ({"max_replay_body": -1}, "max_replay_body"),
        ({"max_replay_body": 1.5}, "max_replay_body"),
        ({"shutdown_grace": -1}, "shutdown_grace"),
        ({"request_id_header": ""}, "request_id_header"),
        ({"tools": "not tools"}, "tools"),
        ({"name": 7}, "name"),
        ({"followups": [""]}, "followups"),
        ({"websockets": "yes"}, "websockets"),
        ({"max_message": -1}, "max_message"),
    ],
)
def test_invalid_options_fail_at_construction(options: dict[str, Any], argument: str) -> None:
    kwargs: dict[str, Any] = {"crash_override": CrashOverride(), **options}
    with pytest.raises(ConfigurationError) as caught:
        CrashOverrideMiddleware(raw_app, **kwargs)
    assert caught.value.argument == argument


@pytest.mark.parametrize(
    ("headers", "version", "replayable"),
    [
        ([], "1.1", True),  # HTTP/1.x without a length or chunking has no body
        ([(b"content-length", b"11")], "1.1", False),  # known to be over the limit
        ([(b"content-length", b"5")], "1.1", None),  # to be read by the recovery
        ([(b"transfer-encoding", b"chunked")], "1.1", None),
        ([], "2", True),  # HTTP/2 may stream a body with neither header; a GET has none
        ([(b"content-length", b"x")], "1.1", False),  # a length nobody can trust
    ],
)
def test_an_unread_body_is_judged_from_the_headers(
    headers: list[tuple[bytes, bytes]], version: str, replayable: bool | None
) -> None:
    scope = {"type": "http", "http_version": version, "headers": headers}
    exchange = Exchange(scope, raw_app, raw_app, 10)  # type: ignore[arg-type]
    settle_body(exchange)
    assert exchange.replayable is replayable


def test_respond_builds_complete_responses() -> None:
    as_json = build_response(201, {"a": "é"}, {"X-Id": "7", "Content-Length": "999"}, None)
    assert as_json.body == '{"a":"é"}'.encode()
    assert as_json.raw_headers == [
        (b"x-id", b"7"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(as_json.body)).encode()),
    ]
    text = build_response(503, "later", [("content-type", "text/x-custom")], None)
    assert text.header("content-type") == "text/x-custom"
    raw = build_response(200, b"\x00", None, "application/x-thing")
    assert raw.header("Content-Type") == "application/x-thing"
    with pytest.raises(ValueError, match="status"):
        build_response(99, "", None, None)


async def test_other_scopes_pass_straight_through(anyio_backend: str) -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    middleware = CrashOverrideMiddleware(app, crash_override=CrashOverride())
    scope, receive, send = {"type": "webtransport", "path": "/wt"}, object(), object()
    await middleware(scope, receive, send)  # type: ignore[arg-type]
    assert seen == [(scope, receive, send)]
    # Websockets, when told not to recover them, or when their path is excluded.
    for options in ({"websockets": False}, {"exclude": ["/ws"]}):
        seen.clear()
        middleware = CrashOverrideMiddleware(app, crash_override=CrashOverride(), **options)
        scope = {"type": "websocket", "path": "/ws"}
        await middleware(scope, receive, send)  # type: ignore[arg-type]
        assert seen == [(scope, receive, send)]


def test_importing_the_middleware_does_not_import_the_sdk() -> None:
    code = (
        "import sys, crashoverride.integrations.asgi\n"
        "heavy = [m for m in ('agents', 'openai') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_request_is_a_unit_of_work_once_an_effect_is_declared() -> None:
    # Whether an effect was declared is the process's (it never goes back), hence a fresh
    # interpreter: before any, the middleware opens no unit (its happy path skips that); after
    # one, each request is a unit its recovery's replays would consult.
    code = (
        "import asyncio\n"
        "from crashoverride import CrashOverride, integration\n"
        "from crashoverride.integrations.asgi import CrashOverrideMiddleware\n"
        "seen = []\n"
        "async def app(scope, receive, send):\n"
        "    seen.append(integration.current_unit() is not None)\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': b''})\n"
        "co = CrashOverride()\n"
        "middleware = CrashOverrideMiddleware(app, crash_override=co)\n"
        "async def request():\n"
        "    async def receive():\n"
        "        return {'type': 'http.request', 'body': b'', 'more_body': False}\n"
        "    async def send(message):\n"
        "        pass\n"
        "    scope = {'type': 'http', 'method': 'GET', 'path': '/', 'headers': []}\n"
        "    await middleware(scope, receive, send)\n"
        "before = integration.effects_declared()\n"
        "asyncio.run(request())\n"
        "co.effect(print)\n"
        "asyncio.run(request())\n"
        "print(before, integration.effects_declared(), seen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )
    assert done.stdout.split() == ["False", "True", "[False,", "True]"]


def test_the_runner_is_a_followup_runner() -> None:
    from crashoverride import followups

    # The follow-up module submits jobs to the lifespan's runner through this protocol.
    assert issubclass(TaskGroupRunner, followups.FollowupRunner)
