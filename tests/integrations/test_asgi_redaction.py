"""Secret request headers never reach the model, the events or the report (real uvicorn)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from structlog.testing import capture_logs

from crashoverride import CrashOverride, Redaction
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.testing import MockServer, done, eval_python, exec_python
from tests.integrations.asgi_support import serve

TOKEN = "Bearer header-secret-123456"
TENANT = "tenant-key-abcdef"


async def whoami(request: Request) -> JSONResponse:
    token = request.headers["authorization"]
    raise PermissionError(f"token {token} rejected for {request.headers['x-tenant-pin']}")


def test_secret_headers_are_masked_everywhere() -> None:
    reports: list[Any] = []
    steps = [
        eval_python("request.headers"),
        eval_python("str(error)"),
        exec_python("respond(200, {'ok': True})"),
        done(),
    ]
    with MockServer(steps) as model_server:
        co = CrashOverride(
            model="m",
            base_url=model_server.base_url,
            api_key="k",
            on_recovery=reports.append,
            redaction=Redaction(names=[r"^x-tenant-pin$"]),
        )
        app = Starlette(routes=[Route("/whoami", whoami)])
        app.add_middleware(CrashOverrideMiddleware, crash_override=co)
        with capture_logs() as logs, serve(app) as served:
            response = httpx.get(
                f"{served.url}/whoami",
                headers={"Authorization": TOKEN, "X-Tenant-Pin": TENANT},
                timeout=60,
            )
        model_traffic = json.dumps([r.body for r in model_server.requests])
    assert response.status_code == 200 and response.json() == {"ok": True}
    everything = model_traffic + json.dumps(logs, default=str) + repr(reports)
    assert "header-secret-123456" not in everything
    assert TENANT not in everything
    assert "[REDACTED]" in model_traffic
    assert "authorization" in model_traffic.lower()  # the header is listed, its value is not


PASSWORD = "correct-horse-battery-staple"  # a pass phrase: words, nothing the value scan knows


async def login(request: Request) -> JSONResponse:
    await request.body()
    raise PermissionError("login failed")


def test_a_multipart_login_form_reaches_the_model_masked() -> None:
    steps = [eval_python("request.body"), exec_python("respond(200, {'ok': True})"), done()]
    with MockServer(steps) as model_server:
        co = CrashOverride(model="m", base_url=model_server.base_url, api_key="k")
        app = Starlette(routes=[Route("/login", login, methods=["POST"])])
        app.add_middleware(CrashOverrideMiddleware, crash_override=co)
        with serve(app) as served:
            response = httpx.post(
                f"{served.url}/login",
                data={"user": "ada", "password": PASSWORD},
                files={"avatar": ("a.txt", b"not a secret", "text/plain")},
                timeout=60,
            )
        model_traffic = json.dumps([r.body for r in model_server.requests])
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert PASSWORD not in model_traffic
    assert "ada" in model_traffic and "not a secret" in model_traffic  # the rest is kept
    assert "[REDACTED]" in model_traffic
