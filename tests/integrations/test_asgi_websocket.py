"""Websocket recovery per message, against a real uvicorn server and a real websocket client."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up, script, tool_outputs
from tests.integrations import websocket_apps
from tests.integrations.asgi_support import first_input, named, serve

pytestmark = pytest.mark.slow

FIX = """
def read_price(item):
    return PRICES[item]["cost"]
replace_function(read_price_before, read_price)
"""
PATCH = 'read_price_before = globals()["read_price"]\n' + FIX
REPLAY = "r = await replay_message()\nr"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Agents patch ``read_price`` in the app module: put the broken one back after each test.
    monkeypatch.setattr(websocket_apps, "read_price", websocket_apps.read_price)
    code = websocket_apps.read_price.__code__
    monkeypatch.setattr(websocket_apps, "SETUPS", [])
    websocket_apps.RECOVERING.clear()
    yield
    websocket_apps.read_price.__code__ = code


def _url(server: Any, path: str) -> str:
    return server.url.replace("http", "ws") + path


def _json(ws: ClientConnection) -> Any:
    return json.loads(ws.recv(timeout=30))


def _closed(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the client received."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    rcvd = closed.value.rcvd
    return (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)


@pytest.mark.parametrize("flavour", ["starlette", "fastapi"])
def test_a_repaired_message_is_replayed_and_the_connection_goes_on(
    flavour: str, logs: list[dict[str, Any]]
) -> None:
    model = script(
        exec_python("message, connection"),
        exec_python(PATCH),
        exec_python(REPLAY),
        done("read_price reads 'cost' now; the message was handled again"),
    )
    build = websocket_apps.app if flavour == "starlette" else websocket_apps.fastapi_app
    app = build(crash_override=CrashOverride(model=model), prompt="Real prices.")
    with serve(app) as server, ws_connect(_url(server, "/prices?token=hunter2")) as ws:
        assert ws.recv(timeout=30) == "welcome"
        ws.send("apple")
        # The replay's answer: the restarted endpoint's count starts again (its state is lost).
        assert _json(ws) == {"item": "apple", "price": 3, "n": 1}
        ws.send("pear")  # the repaired, restarted endpoint handles the next messages
        assert _json(ws) == {"item": "pear", "price": 5, "n": 2}
        ws.send("bye")
        assert _closed(ws) == (4000, "bye")
    # The setup ran twice, but the client got its greeting once (the restart's is swallowed).
    assert websocket_apps.SETUPS == ["/prices", "/prices"]
    assert model.remaining_steps == 0
    shown, _, replayed = tool_outputs(model)
    assert "apple" in shown and "/prices" in shown
    assert "hunter2" not in shown  # the query's secret is masked
    assert "handled=True" in replayed and '"price":3' in replayed
    brief = first_input(model)
    assert "replay_message()" in brief and "lost with it" in brief
    [succeeded] = named(logs, "recovery.succeeded")
    assert succeeded["path"] == "/prices" and succeeded["websocket"] is True
    assert succeeded["handler"] == "message"


def test_a_reply_of_the_agent_is_sent_and_the_endpoint_restarts_for_the_next_message() -> None:
    model = script(
        exec_python(PATCH + "send_json({'item': 'apple', 'price': PRICES['apple']['cost']})"),
        done("answered from PRICES and repaired read_price"),
    )
    app = websocket_apps.app(crash_override=CrashOverride(model=model))
    with serve(app) as server, ws_connect(_url(server, "/prices")) as ws:
        assert ws.recv(timeout=30) == "welcome"
        ws.send("apple")
        assert _json(ws) == {"item": "apple", "price": 3}
        ws.send("pear")
        assert _json(ws) == {"item": "pear", "price": 5, "n": 1}
    assert model.remaining_steps == 0


def _conversation(app: Any, path: str, messages: list[str]) -> tuple[list[Any], Any]:
    """What a client received, and how the connection ended (close code and reason, or the
    handshake's refusal)."""
    received: list[Any] = []
    with serve(app) as server:
        try:
            with ws_connect(_url(server, path)) as ws:
                for text in messages:
                    ws.send(text)
                while True:
                    received.append(ws.recv(timeout=30))
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
            return received, (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)
        except InvalidStatus as refused:
            return received, ("refused", refused.response.status_code)
    raise AssertionError("unreachable")  # pragma: no cover


def _errors(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [
        (r.name, r.getMessage(), repr(r.exc_info[1]) if r.exc_info else "")
        for r in caplog.records
        if r.levelno >= logging.WARNING
    ]


# How uvicorn's websocket implementation ends a connection whose app raised: it drops it
# without a close frame (the client reports no code: 1006). Its legacy implementation, which
# sent 1011, is deprecated by the websockets package.
CLOSED_ON_ERROR = (None, None)


@pytest.mark.parametrize(
    ("path", "messages", "expected", "errors"),
    [
        # Given up: the exception leaves the app as it was raised.
        ("/prices", ["apple", "pear"], (["welcome"], CLOSED_ON_ERROR), 1),
        ("/prices", ["bye"], (["welcome"], (4000, "bye")), 0),  # no failure at all
        ("/after-close", ["hi"], ([], (4001, "")), 1),  # failed after its close: skipped
        ("/before-accept", [], ([], ("refused", 500)), 1),  # failed in the handshake: skipped
    ],
)
def test_not_recovered_the_client_and_the_log_see_what_they_see_without_crashoverride(
    path: str,
    messages: list[str],
    expected: tuple[list[Any], Any],
    errors: int,
    caplog: pytest.LogCaptureFixture,
    logs: list[dict[str, Any]],
) -> None:
    with caplog.at_level(logging.INFO):
        plain = _conversation(websocket_apps.app(), path, messages)
    without = _errors(caplog)
    caplog.clear()
    model = script(give_up("no price field I can trust"))
    with caplog.at_level(logging.INFO):
        app = websocket_apps.app(crash_override=CrashOverride(model=model))
        protected = _conversation(app, path, messages)
    assert protected == plain == expected
    assert _errors(caplog) == without
    assert [e[1] for e in without] == ["Exception in ASGI application\n"] * errors
    # The give-up case did run a recovery; the others had nothing to recover.
    assert len(named(logs, "recovery.failed")) == (expected[1] == CLOSED_ON_ERROR)


def test_a_later_failure_of_the_restarted_endpoint_is_recovered_or_ends_the_connection(
    logs: list[dict[str, Any]],
) -> None:
    model = script(
        exec_python(PATCH + REPLAY),
        done("repaired"),
        give_up("boom is deliberate"),
    )
    app = websocket_apps.app(crash_override=CrashOverride(model=model))
    with serve(app) as server, ws_connect(_url(server, "/prices")) as ws:
        assert ws.recv(timeout=30) == "welcome"
        ws.send("apple")
        assert _json(ws) == {"item": "apple", "price": 3, "n": 1}
        ws.send("boom")
        assert _closed(ws) == CLOSED_ON_ERROR
    assert model.remaining_steps == 0
    [failed] = named(logs, "recovery.failed")
    assert failed["exc_type"] == "builtins.RuntimeError"


@pytest.mark.parametrize(
    ("path", "reason"),
    [("/before-accept", "not been accepted"), ("/after-close", "had closed")],
)
def test_a_failure_outside_a_message_is_skipped(
    path: str, reason: str, logs: list[dict[str, Any]]
) -> None:
    model = script()
    app = websocket_apps.app(crash_override=CrashOverride(model=model))
    with serve(app) as server:
        try:
            with ws_connect(_url(server, path)) as ws:
                ws.send("hi")
                ws.recv(timeout=30)
        except Exception:
            pass  # the handshake refused, or the connection closed: what the test is not about
    assert model.calls == ()
    [skipped] = named(logs, "recovery.skipped")
    assert reason in skipped["reason"]


def test_a_disconnect_cancels_the_recovery(
    logs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    model = script(
        exec_python("import anyio\nRECOVERING.set()\nawait anyio.sleep(120)"),
        done("never reached"),
    )
    app = websocket_apps.app(crash_override=CrashOverride(model=model))
    with caplog.at_level(logging.ERROR), serve(app) as server:
        with ws_connect(_url(server, "/prices")) as ws:
            assert ws.recv(timeout=30) == "welcome"
            ws.send("apple")
            assert websocket_apps.RECOVERING.wait(30)
    [cancelled] = named(logs, "recovery.cancelled")
    assert "disconnected" in str(cancelled)
    errors = [r for r in caplog.records if r.exc_info]
    assert len(errors) == 1
    notes = getattr(errors[0].exc_info[1] if errors[0].exc_info else None, "__notes__", [])
    assert any("the client disconnected" in note for note in notes)
