"""Apps whose background tasks fail after the response was sent, and a stream that fails.

The mail configuration "renamed" a key: ``CONFIG`` has ``mail_host`` while ``mail_host()`` still
reads ``smtp_host``. A recovery repairs ``mail_host`` in this module and re-runs the task.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
from fastapi import BackgroundTasks, FastAPI
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.background import BackgroundTasks as StarletteTasks
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from crashoverride.integrations.asgi import CrashOverrideMiddleware

CONFIG = {"mail_host": "smtp.example.test"}
QUOTAS = {"per_day": 3}


def mail_host() -> str:
    return CONFIG["smtp_host"]  # the configuration now says "mail_host"


def daily_quota() -> int:
    return QUOTAS["daily"]  # the configuration now says "per_day"


class Probe:
    """What the background tasks did, in order, observed from the test thread."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.lock = threading.Lock()
        # The first task waits for this: the test sets it once it holds the response.
        self.release = threading.Event()
        self.done = threading.Event()
        self.failures = 0

    def record(self, what: str) -> None:
        with self.lock:
            self.ran.append(what)

    def failed(self) -> None:
        with self.lock:
            self.failures += 1

    async def wait_for_failures(self, count: int) -> None:
        """Agent code awaits this so that every request of a burst has failed before the repair."""
        with anyio.fail_after(20):
            while self.failures < count:  # noqa: ASYNC110  (counted from other tasks)
                await anyio.sleep(0.01)


PROBE = Probe()


# -- the queued functions --------------------------------------------------------------------


def audit(email: str) -> None:
    """Sync, first: runs only after the client has its response (the test releases it)."""
    if not PROBE.release.wait(10):
        raise TimeoutError("the test never released the first background task")
    PROBE.record(f"audit {email}")


def send_welcome(email: str, *, subject: str) -> None:
    PROBE.record(f"welcome {email} via {mail_host()}: {subject}")


async def asend_welcome(email: str, *, subject: str) -> None:
    await anyio.lowlevel.checkpoint()
    PROBE.record(f"welcome {email} via {mail_host()}: {subject}")


def check_quota(email: str) -> None:
    PROBE.record(f"quota {email}: {daily_quota()}")


def count_signup(email: str) -> None:
    PROBE.record(f"count {email}")
    PROBE.done.set()


# -- FastAPI: BackgroundTasks ----------------------------------------------------------------


def fastapi_app(**options: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/signup")
    async def signup(email: str, background_tasks: BackgroundTasks) -> dict[str, str]:
        background_tasks.add_task(audit, email)
        background_tasks.add_task(send_welcome, email, subject="Welcome!")
        background_tasks.add_task(count_signup, email)
        return {"queued": email}

    @app.post("/asignup")
    async def asignup(email: str, background_tasks: BackgroundTasks) -> dict[str, str]:
        background_tasks.add_task(audit, email)
        background_tasks.add_task(asend_welcome, email, subject="Welcome!")
        background_tasks.add_task(count_signup, email)
        return {"queued": email}

    app.add_middleware(CrashOverrideMiddleware, **options)
    return app


# -- Starlette: Response(background=...) -----------------------------------------------------


async def welcome_one(request: Request) -> Response:
    email = request.query_params["email"]
    queued = send_welcome if request.query_params.get("sync") else asend_welcome
    return PlainTextResponse("queued", background=BackgroundTask(queued, email, subject="Hi"))


async def welcome_many(request: Request) -> Response:
    email = request.query_params["email"]
    tasks = StarletteTasks()
    tasks.add_task(audit, email)
    tasks.add_task(asend_welcome, email, subject="Hi")
    tasks.add_task(count_signup, email)
    return PlainTextResponse("queued", background=tasks)


async def welcome_all(request: Request) -> Response:
    """Two tasks that fail in turn, then one that works."""
    email = request.query_params["email"]
    tasks = StarletteTasks()
    tasks.add_task(asend_welcome, email, subject="Hi")
    tasks.add_task(check_quota, email)
    tasks.add_task(count_signup, email)
    return PlainTextResponse("queued", background=tasks)


async def digest(request: Request) -> Response:
    async def lines() -> AsyncIterator[bytes]:
        yield b"digest for\n"
        await anyio.sleep(0.05)
        try:
            host = mail_host()  # fails mid-body, after the response started
        except KeyError:
            PROBE.failed()
            raise
        yield f"host {host}\n".encode()

    return StreamingResponse(lines(), media_type="text/plain")


def starlette_app(**options: Any) -> Starlette:
    return Starlette(
        routes=[
            Route("/welcome", welcome_one, methods=["POST"]),
            Route("/welcome-many", welcome_many, methods=["POST"]),
            Route("/welcome-all", welcome_all, methods=["POST"]),
            Route("/digest", digest),
        ],
        middleware=[Middleware(CrashOverrideMiddleware, **options)],
    )
