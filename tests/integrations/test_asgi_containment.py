"""Whatever goes wrong inside crashoverride, or on the client's channel while it recovers, the
application's own exception is what propagates: never an internal error, never an exception
group of the middleware's task group."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from crashoverride import CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.integrations.asgi._block import settle_body
from crashoverride.integrations.asgi._exchange import Exchange
from crashoverride.testing import done, exec_python, give_up, script
from tests.integrations import asgi_apps
from tests.integrations.asgi_support import serve
from tests.integrations.asgi_transparency_support import call, imports_fail_on_the_loop

pytestmark = pytest.mark.anyio

Receive = Callable[[], Awaitable[dict[str, Any]]]


class PriceMissing(LookupError):
    pass


class Unusual(BaseException):
    """A BaseException that is neither an interrupt nor a cancellation."""


def failing_app(
    raised: list[BaseException], *, started: bool = False, reads_body: bool = False
) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if reads_body:  # the app opens the channel: after the body, it may be listened to
            while (await receive()).get("more_body"):
                pass
        if started:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        error = PriceMissing("apple")
        raised.append(error)
        raise error

    return app


def channel(*, then: BaseException | None = None, counter: list[int] | None = None) -> Receive:
    """The server's receive: the (empty) body, then ``then`` raised, or (a server that does not
    wait for the disconnect) more empty bodies."""
    calls = counter if counter is not None else []

    async def receive() -> dict[str, Any]:
        calls.append(1)
        await anyio.lowlevel.checkpoint()
        if len(calls) > 1 and then is not None:
            raise then
        return {"type": "http.request", "body": b"", "more_body": False}

    return receive


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


# -- internal failures (imports included) -------------------------------------------------------


@pytest.mark.parametrize("started", [False, True], ids=["recovery", "skip"])
async def test_an_import_failing_on_the_loop_never_replaces_the_exception(
    anyio_backend: str, started: bool
) -> None:
    raised: list[BaseException] = []
    co = CrashOverride(model=script(give_up("unused")))
    middleware = CrashOverrideMiddleware(failing_app(raised, started=started), crash_override=co)
    with imports_fail_on_the_loop() as refused, pytest.raises(PriceMissing) as caught:
        await call(middleware)
    assert caught.value is raised[0]
    assert refused, "no import was attempted: the test no longer exercises the failure"
    assert "crashoverride: recovery failed, internal error" in notes(caught.value)


async def test_the_happy_path_imports_nothing(anyio_backend: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = CrashOverrideMiddleware(app, crash_override=CrashOverride(model=script()))
    with imports_fail_on_the_loop() as refused:
        assert (await call(middleware)).body == b"ok"
    assert refused == []


def test_under_a_blocking_call_detector_the_server_gets_the_application_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import blockbuster  # in the dev extra; it watches asyncio loops: uvicorn's here

    model = script(give_up("the price source has no usable field"))
    app = asgi_apps.starlette_app(crash_override=CrashOverride(model=model))
    detector = blockbuster.BlockBuster(["crashoverride", "crashoverride.integrations"])
    with caplog.at_level(logging.ERROR), serve(app) as server:
        detector.activate()
        try:
            response = httpx.get(server.url + "/price/apple", timeout=30)
        finally:
            detector.deactivate()
    assert response.status_code == 500
    errors = [r.exc_info[1] for r in caplog.records if r.name == "uvicorn.error" and r.exc_info]
    assert [type(e) for e in errors] == [KeyError]
    # Recovered and gave up, or an internal error: either way the note says so.
    assert "gave up" in notes(errors[0]) or "internal error" in notes(errors[0])


async def test_a_recovered_response_that_cannot_be_sent_leaves_the_exception(
    anyio_backend: str,
) -> None:
    raised: list[BaseException] = []
    model = script(exec_python("respond(200, 'recovered')"), done("answered"))
    co = CrashOverride(model=model)
    middleware = CrashOverrideMiddleware(failing_app(raised), crash_override=co)

    async def gone(message: Any) -> None:
        raise ConnectionResetError("the client went away")

    with pytest.raises(PriceMissing) as caught:
        await call(middleware, send=gone)
    assert caught.value is raised[0]
    assert "the response was not sent: ConnectionResetError" in notes(caught.value)


async def test_an_internal_failure_inside_the_recovery_never_escapes_as_a_group(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any) -> Any:
        raise RuntimeError("routing follow-ups broke")

    # Runs inside the task group that also listens to the client's channel.
    monkeypatch.setattr(CrashOverrideMiddleware, "_followups_here", broken)
    raised: list[BaseException] = []
    co = CrashOverride(model=script(give_up("unused")))
    middleware = CrashOverrideMiddleware(failing_app(raised), crash_override=co)
    with pytest.raises(PriceMissing) as caught:
        await call(middleware)
    assert caught.value is raised[0]
    assert "internal error" in notes(caught.value)


async def test_an_internal_failures_note_carries_no_secret(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-proj-4fG7hJ2kL9mN3pQ8rS1tU6vW0xY5zA2b"
    configured = "corp-7Q2mXk9Lp4Rt8Vw3Zb6N"  # the api_key: no format the value scan knows

    def broken(self: Any) -> Any:
        raise RuntimeError(f"routing follow-ups broke at {key} / {configured}")

    monkeypatch.setattr(CrashOverrideMiddleware, "_followups_here", broken)
    raised: list[BaseException] = []
    co = CrashOverride(model=script(give_up("unused")), api_key=configured)
    middleware = CrashOverrideMiddleware(failing_app(raised), crash_override=co)
    with pytest.raises(PriceMissing) as caught:
        await call(middleware)
    assert caught.value is raised[0]
    said = notes(caught.value)
    assert "internal error" in said and "routing follow-ups broke" in said
    assert key not in said and configured not in said


# -- the client's channel during a recovery -----------------------------------------------------


async def test_a_declared_body_too_large_to_keep_is_never_read(anyio_backend: str) -> None:
    reads: list[int] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        await anyio.lowlevel.checkpoint()
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    model = script(exec_python("await anyio.sleep(0.1)\nrespond(503, 'later')"), done())
    middleware = CrashOverrideMiddleware(
        failing_app([]), crash_override=CrashOverride(model=model), max_replay_body=1024
    )
    headers = [(b"content-length", str(64 * 1024 * 1024).encode())]
    sent = await call(middleware, receive, method="POST", headers=headers)
    assert sent.status == 503
    assert reads == []


async def test_a_request_without_a_body_is_never_read(anyio_backend: str) -> None:
    reads: list[int] = []

    async def receive() -> dict[str, Any]:  # FastAPI's own suite fails the test here
        reads.append(1)
        raise AssertionError("no request body is needed")

    model = script(exec_python("await anyio.sleep(0.1)\nrespond(503, 'later')"), done())
    co = CrashOverride(model=model)
    middleware = CrashOverrideMiddleware(failing_app([]), crash_override=co)
    sent = await call(middleware, receive)
    assert sent.status == 503
    assert reads == []


async def test_nothing_is_read_after_the_end_of_the_body(anyio_backend: str) -> None:
    reads: list[int] = []
    model = script(exec_python("await anyio.sleep(0.2)\nrespond(503, 'later')"), done())
    co = CrashOverride(model=model)
    middleware = CrashOverrideMiddleware(failing_app([], reads_body=True), crash_override=co)
    sent = await call(middleware, channel(counter=reads))
    assert sent.status == 503
    # The app's own read, then one look for a disconnect that finds another body: no more.
    assert len(reads) <= 2


@pytest.mark.parametrize(
    "error", [RuntimeError("receive broke"), Unusual("receive broke")], ids=["error", "unusual"]
)
async def test_an_error_of_the_channel_never_replaces_the_exception(
    anyio_backend: str, error: BaseException
) -> None:
    raised: list[BaseException] = []
    model = script(exec_python("await anyio.sleep(0.2)"), give_up("no answer"))
    co = CrashOverride(model=model)
    middleware = CrashOverrideMiddleware(failing_app(raised, reads_body=True), crash_override=co)
    with pytest.raises(PriceMissing) as caught:
        await call(middleware, channel(then=error))
    assert caught.value is raised[0]


@pytest.mark.parametrize("anyio_backend", ["trio"])  # asyncio ends the loop on an interrupt
async def test_an_interrupt_inside_the_recovery_propagates_bare(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Any) -> Any:
        raise KeyboardInterrupt

    # Raised inside the task group that also listens to the client's channel.
    monkeypatch.setattr(CrashOverrideMiddleware, "_followups_here", interrupted)
    co = CrashOverride(model=script(give_up("unused")))
    middleware = CrashOverrideMiddleware(failing_app([], reads_body=True), crash_override=co)
    with pytest.raises(KeyboardInterrupt):
        await call(middleware)


@pytest.mark.parametrize(
    ("method", "replayable"), [("GET", True), ("POST", False)], ids=["safe", "unsafe"]
)
def test_an_http2_body_of_unknown_length_is_not_read(method: str, replayable: bool) -> None:
    scope = {"type": "http", "http_version": "2", "method": method, "headers": []}
    exchange = Exchange(scope, _unused, _unused, 1024)
    settle_body(exchange)
    assert (exchange.replayable, exchange.declared) == (replayable, False)


async def _unused(*args: Any) -> Any:
    raise AssertionError("not called")  # pragma: no cover
