"""The processes of the fleet tests: the model, an ASGI app for ``uvicorn --workers``, a plain
worker process, and a Celery app for a prefork worker.

Configured through the environment (``FLEET_MODEL_URL``, ``FLEET_REDIS_URL``, ``FLEET_NS``,
``FLEET_LEASE``, ``FLEET_CLUSTER``: the URL is a Redis Cluster node's), since uvicorn and
Celery import the app themselves in every process.

    python -m tests.integrations.fleet_procs mock SCENARIO   # prints the base URL; on stdin EOF
                                                             # prints the requests as JSON
    python -m tests.integrations.fleet_procs worker N        # one failing call; JSON lines out
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from crashoverride import CrashOverride, RedisCoordination

KEY = "fleet-test-key-0123456789"
PRICES: dict[str, dict[str, int]] = {"apple": {"cost": 3}, "pear": {"cost": 5}}
FIXED_PRICE = "def read_price(item):\n    return PRICES[item]['cost']\n"
PATCH_TRANSFORM = (
    "import time\n"
    "time.sleep(0.5)\n"  # a recovery that takes a while: the other processes fail meanwhile
    "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
    "rerun()"
)


def read_price(item: str) -> int:
    return PRICES[item]["price"]  # the data source renamed the field to "cost"


def transform(value: int) -> int:
    raise NotImplementedError("transform")


def crash_override(**options: Any) -> CrashOverride:
    env = os.environ
    fleet = RedisCoordination(
        env["FLEET_REDIS_URL"], namespace=env["FLEET_NS"], key=KEY,
        lease=float(env.get("FLEET_LEASE", "5")), op_timeout=1.0,  # a loaded machine, not slow
        cluster=bool(env.get("FLEET_CLUSTER")),
    )  # fmt: skip
    return CrashOverride(
        model="fleet-model", base_url=env["FLEET_MODEL_URL"], api_key="sk-fleet", timeout=30,
        max_concurrent_recoveries=64, concurrency_wait=30, breaker_threshold=10**6,
        coordination=fleet, **options,
    )  # fmt: skip


def _quiet_structlog(stream: Any = None) -> None:
    # An application decision (the library never configures logging): events as JSON lines.
    import structlog

    if stream is None:
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
        return
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper("iso"),
                    _wall_clock, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(stream),
    )  # fmt: skip


def _wall_clock(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event["t"] = time.time()
    event["pid"] = os.getpid()
    return event


# ----------------------------------------------------------------------------------- ASGI app


def create_app() -> Any:
    """``uvicorn --factory tests.integrations.fleet_procs:create_app``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    _quiet_structlog(sys.stdout if os.environ.get("FLEET_LOG") else None)

    async def price(request: Request) -> JSONResponse:
        item = request.query_params.get("item", "apple")
        return JSONResponse({"item": item, "price": read_price(item)})

    async def health(_: Request) -> PlainTextResponse:
        return PlainTextResponse(str(os.getpid()))

    app = Starlette(routes=[Route("/price", price), Route("/health", health)])
    app.add_middleware(
        CrashOverrideMiddleware, crash_override=crash_override(),
        prompt="Answer with the item's price.", warm_up=False,
    )  # fmt: skip
    return app


# ------------------------------------------------------------------------------ Celery app


def celery_app() -> Any:
    from celery import Celery

    from crashoverride.integrations.celery import CrashOverrideTask, install

    url = os.environ["FLEET_BROKER_URL"]
    app = Celery("fleet", broker=url, backend=url, task_cls=CrashOverrideTask)
    app.conf.update(task_default_queue=os.environ["FLEET_NS"], result_expires=600,
                    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    worker_prefetch_multiplier=1)  # fmt: skip
    install(app, crash_override())

    @app.task(name="fleet.transform", recovery_prompt="Return the transformed value.")
    def transform_task(value: int) -> int:
        return transform(value)

    return app


if os.environ.get("FLEET_CELERY"):
    celery = celery_app()
    _quiet_structlog()


# ------------------------------------------------------------------------------- entry points


def _mock(scenario: str) -> None:
    from crashoverride.testing import MockServer, done, exec_python, hang
    from crashoverride.testing.asgi import patch, replay_request

    steps: dict[str, list[Any]] = {
        "asgi": [patch("read_price", FIXED_PRICE), replay_request(), done("renamed field")],
        "kill": [hang(30), exec_python(PATCH_TRANSFORM), done("patched transform")],
        "celery": [exec_python(PATCH_TRANSFORM), done("patched transform")],
    }
    with MockServer(steps[scenario], max_hang=30) as server:
        print(server.base_url, flush=True)
        threading.Thread(target=_announce, args=(server,), daemon=True).start()
        sys.stdin.read()
        requests = [request.body for request in server.requests]
    print(json.dumps({"requests": requests, "errors": server.errors}), flush=True)


def _announce(server: Any) -> None:
    """Say when each request arrives, so a test can act while the model is being asked."""
    served = 0
    while True:
        count = len(server.requests)
        if count > served:
            served = count
            print(json.dumps({"served": served}), flush=True)
        time.sleep(0.01)


def _worker(value: int) -> None:
    _quiet_structlog(sys.stdout)
    co = crash_override()

    @co.handler(prompt="Return the transformed value.")
    def job(i: int) -> int:
        return transform(i)

    print(json.dumps({"ready": os.getpid()}), flush=True)
    sys.stdin.readline()  # every worker starts failing at once
    try:
        result: Any = job(value)
    except NotImplementedError as exc:
        result = {"error": repr(exc), "notes": getattr(exc, "__notes__", [])}
    print(json.dumps({"result": result}), flush=True)


def agent_runs(requests: list[Any]) -> int:
    """How many agent runs a mock served: a run's first request carries no tool output yet."""
    return sum(1 for body in requests if not any(m.get("role") == "tool" for m in body["messages"]))


if __name__ == "__main__":
    if sys.argv[1] == "mock":
        _mock(sys.argv[2])
    else:
        _worker(int(sys.argv[2]))
