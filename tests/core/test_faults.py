"""Fault suite, wire level: whatever the model endpoint does, the user's failure is never worse.

Each fault is injected by ``MockServer`` (only the model is scripted; the openai client, HTTP,
the SDK and our code are real). The promise under test: the ORIGINAL exception object comes
back with its traceback, within ``timeout`` + 1 s, carrying a note that says why; and the
application keeps working: the next failure recovers once the endpoint behaves again.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from crashoverride import CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.testing import (
    MockServer,
    Script,
    StepLike,
    done,
    eval_python,
    exec_python,
    give_up,
    hang,
    http_error,
    junk_arguments,
    malformed,
    rate_limited,
    unknown_tool,
)
from tests.integrations.asgi_support import serve


@dataclass(frozen=True)
class Fault:
    steps: tuple[StepLike, ...] | None  # None: nothing listens on the endpoint's port
    timeout: float
    why: str  # expected in the note on the re-raised exception


# The openai client makes two attempts for retryable statuses (500, 429) here, so those
# faults answer twice; a fault left unconsumed would poison the "next request" check.
FAULTS: dict[str, Fault] = {
    "endpoint down": Fault(None, 4.0, "APIConnectionError"),
    "HTTP 500": Fault((http_error(500, times=2),), 3.0, "InternalServerError"),
    "HTTP 429": Fault((rate_limited(0.2, times=2),), 3.0, "RateLimitError"),
    "hang beyond the budget": Fault((hang(),), 1.0, "timed out after 1s"),
    "malformed JSON": Fault((malformed(),), 3.0, "JSONDecodeError"),
    "junk tool arguments": Fault(
        (junk_arguments(), give_up("my tool arguments keep failing to parse")), 3.0, "gave up"
    ),
    "unknown tool": Fault((unknown_tool(),), 3.0, "Tool format_hard_drive not found"),
    "exhausted script": Fault((eval_python("1"),), 3.0, "the script has no turn left"),
}


def fetch_article(source: dict[str, str]) -> str:
    return source["article_text"]


@contextlib.contextmanager
def endpoint(fault: Fault) -> Iterator[tuple[MockServer, str]]:
    """A model endpoint showing ``fault`` first; yields the server that answers afterwards.

    For "endpoint down" the port is closed during the faulty recovery; a server comes back
    on the same port when the test asks for the next one (``revive``).
    """
    server = MockServer(Script(*fault.steps) if fault.steps else None).start()
    url = server.base_url
    if fault.steps is None:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        server.close()
        server = MockServer(port=port)
    try:
        yield server, url
    finally:
        server.close()


def revive(server: MockServer, script: list[StepLike]) -> None:
    server.start()  # no-op when already running
    assert server.remaining_turns == 0, "the fault was not consumed as expected"
    server.serve(script)


def assert_served_as_scripted(server: MockServer, name: str) -> None:
    if name == "exhausted script":
        # The one miss is the fault itself: the mock answers an error, never a made-up turn.
        assert server.errors == ["request 2: the script has no turn left"]
        server.errors.clear()
    server.assert_complete()


def our_note(exc: BaseException) -> str:
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith("crashoverride:")]
    assert len(notes) == 1, notes
    return notes[0]


@pytest.mark.parametrize("name", FAULTS)
def test_with_block_reraises_the_original_in_time_then_recovers(name: str) -> None:
    fault = FAULTS[name]
    with endpoint(fault) as (server, url):
        co = CrashOverride(model="scripted", base_url=url, api_key="k", timeout=fault.timeout)
        source = {"body": "The text."}
        original: list[BaseException] = []
        began = time.monotonic()
        with pytest.raises(KeyError) as info:
            with co.handler(prompt="Leave `article` set from `source`."):
                try:
                    fetch_article(source)
                except KeyError as exc:
                    original.append(exc)
                    raise
        elapsed = time.monotonic() - began
        assert elapsed <= fault.timeout + 1.0
        assert info.value is original[0]
        assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fetch_article"
        note = our_note(info.value)
        assert "failed" in note and fault.why in note

        # The application goes on: the next failure recovers once the endpoint behaves.
        revive(server, [exec_python("caller['article'] = source['body']"), done("from body")])
        article = None
        with co.handler(prompt="Leave `article` set from `source`."):
            article = fetch_article(source)
        assert article == "The text."
        assert_served_as_scripted(server, name)
    if name == "junk tool arguments":
        # The SDK told the model its arguments were not JSON instead of crashing the run.
        told = [m for m in server.requests[1].body["messages"] if m.get("role") == "tool"]
        assert "Invalid JSON input for tool exec_python" in told[0]["content"]


# -- the same faults through a served application -------------------------------------------


class Seen:
    def __init__(self) -> None:
        self.errors: list[BaseException] = []


def fault_app(co: CrashOverride, seen: Seen, timeout: float) -> Starlette:
    async def article(request: Request) -> Response:
        return PlainTextResponse(fetch_article({"body": "The text."}))

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def on_error(request: Request, exc: Exception) -> Response:
        seen.errors.append(exc)  # the exception the server error handler received
        return PlainTextResponse("Internal Server Error", status_code=500)

    return Starlette(
        routes=[Route("/article", article), Route("/health", health)],
        middleware=[Middleware(CrashOverrideMiddleware, crash_override=co, timeout=timeout)],
        exception_handlers={Exception: on_error},
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", FAULTS)
def test_request_gets_the_normal_500_in_time_and_the_app_keeps_serving(name: str) -> None:
    fault = FAULTS[name]
    seen = Seen()
    with endpoint(fault) as (server, url):
        co = CrashOverride(model="scripted", base_url=url, api_key="k")
        with serve(fault_app(co, seen, fault.timeout)) as app:
            answers: dict[str, Any] = {}

            def failing_request() -> None:
                began = time.monotonic()
                answers["failed"] = httpx.get(app.url + "/article", timeout=30)
                answers["elapsed"] = time.monotonic() - began

            client = threading.Thread(target=failing_request)
            client.start()
            time.sleep(0.05)
            # Other requests are served while that one's recovery struggles.
            health = httpx.get(app.url + "/health", timeout=5)
            client.join(30)
            assert health.status_code == 200
            assert answers["failed"].status_code == 500
            assert answers["elapsed"] <= fault.timeout + 1.0
            (error,) = seen.errors
            assert isinstance(error, KeyError)
            assert traceback.extract_tb(error.__traceback__)[-1].name == "fetch_article"
            note = our_note(error)
            assert "failed" in note and fault.why in note

            revive(server, [exec_python("respond(200, 'answered by the agent')"), done()])
            recovered = httpx.get(app.url + "/article", timeout=30)
            assert (recovered.status_code, recovered.text) == (200, "answered by the agent")
            assert httpx.get(app.url + "/health", timeout=5).status_code == 200
        assert_served_as_scripted(server, name)
