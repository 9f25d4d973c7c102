"""The middleware imports the Agents SDK at lifespan startup, so a first failure does not.

Each case starts a fresh uvicorn server process (a cold interpreter: nothing imported the SDK
yet) and asks it, over HTTP, which heavy modules are loaded once startup has finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from crashoverride import ConfigurationError, CrashOverride
from crashoverride.integrations.asgi import CrashOverrideMiddleware

SERVER = textwrap.dedent(
    """
    import socket, sys
    import structlog, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from crashoverride import CrashOverride
    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    events = []
    structlog.configure(processors=[lambda _, __, e: events.append(e) or ""],
                        logger_factory=structlog.ReturnLoggerFactory())

    class Broken(CrashOverride):
        async def awarm_up(self):
            raise RuntimeError("the SDK install is broken")

    async def modules(_):
        return JSONResponse({"agents": "agents" in sys.modules,
                             "events": [e["event"] for e in events]})

    kind = sys.argv[1]
    key = None if kind == "nokey" else "sk-test"
    co = (Broken if kind == "broken" else CrashOverride)(model="m", api_key=key)
    app = Starlette(routes=[Route("/modules", modules)])
    app.add_middleware(CrashOverrideMiddleware, crash_override=co, warm_up=kind != "lazy")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="critical", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    """
)


def _after_startup(kind: str) -> dict[str, object]:
    env = {name: value for name, value in os.environ.items() if name != "OPENAI_API_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, kind], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(600):  # the server answers once its lifespan startup is complete
                try:
                    answer = client.get("/modules")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            else:
                raise AssertionError("the server never answered")
        assert answer.status_code == 200
        return dict(json.loads(answer.text))
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_startup_imports_the_sdk_before_the_first_request() -> None:
    assert _after_startup("warm") == {"agents": True, "events": []}


def test_warm_up_false_keeps_the_import_lazy() -> None:
    assert _after_startup("lazy") == {"agents": False, "events": []}


def test_no_warm_up_when_no_recovery_could_run() -> None:
    # No API key, no client factory, no base_url: every recovery would be refused at once, so
    # importing the SDK (seconds of startup) would buy nothing.
    assert _after_startup("nokey") == {"agents": False, "events": []}


def test_a_failed_warm_up_is_reported_and_the_app_still_starts() -> None:
    assert _after_startup("broken") == {"agents": False, "events": ["recovery.warm_up_failed"]}


def test_warm_up_must_be_a_bool() -> None:
    co = CrashOverride(model="m", api_key="sk-test")
    with pytest.raises(ConfigurationError, match="warm_up"):
        CrashOverrideMiddleware(lambda *_: None, crash_override=co, warm_up="yes")
