"""pytest plugin: put a middleware outermost in every Starlette / FastAPI app a test suite builds.

Loaded with ``-p inject`` (this directory on ``PYTHONPATH``); the middleware is chosen by the
``CRASHOVERRIDE_TRANSPARENCY`` environment variable:

* ``off`` (default): nothing is patched; the suite runs unchanged.
* ``noop``: a pass-through pure-ASGI middleware, the baseline for "any middleware at all".
* ``crashoverride``: ``CrashOverrideMiddleware`` with a model that gives up on every failure, so
  every failing request goes through a whole recovery and then must look exactly as if the
  middleware were not there.

The middleware goes where ``app.add_middleware(...)`` puts it when called last: first of the
user middleware, inside ``ServerErrorMiddleware`` (and FastAPI's body limit), outside every
other user middleware and ``ExceptionMiddleware``. ``user_middleware`` itself is left as the
test set it, so tests that inspect it see what they expect.

``CRASHOVERRIDE_TRANSPARENCY_RESULTS=<dir>`` makes the plugin write each test's outcome
(``outcomes-<mode>.json``, by the controlling process) and the recovery events it saw
(``events-<mode>-<pid>.json``, by every process) there.
"""

from __future__ import annotations

import collections
import importlib
import itertools
import json
import os
import pkgutil
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

MODE = os.environ.get("CRASHOVERRIDE_TRANSPARENCY", "off")
MODES = ("off", "noop", "crashoverride")
RESULTS = os.environ.get("CRASHOVERRIDE_TRANSPARENCY_RESULTS", "")
# Import crashoverride's modules and the SDK before the tests (the documented warm-up), so the
# suites' blocking-call detector lets recoveries run instead of stopping them at the first
# import; "0" leaves the imports to the recovery (then they are reported as internal failures).
WARM = os.environ.get("CRASHOVERRIDE_TRANSPARENCY_WARM", "1") != "0"


class PassThrough:
    """The do-nothing middleware: what "transparent" means."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _give_up_model() -> Any:
    from agents.testing import ScriptedModel, function_call

    ids = itertools.count(1)

    class AlwaysGivesUp(ScriptedModel):
        """Answers every turn with ``give_up``; keeps no history (thousands of recoveries)."""

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            reason = {"reason": "transparency run: always give up"}
            self.enqueue([function_call("give_up", reason, call_id=f"g{next(ids)}")])
            try:
                return await super().get_response(*args, **kwargs)
            finally:
                self._calls.clear()

    return AlwaysGivesUp()


_CRASH_OVERRIDE: Any = None
_EVENTS: collections.Counter[str] = collections.Counter()
_OUTCOMES: dict[str, str] = {}


def _middleware() -> Any:
    from starlette.middleware import Middleware

    if MODE == "noop":
        return Middleware(PassThrough)
    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    return Middleware(CrashOverrideMiddleware, crash_override=_CRASH_OVERRIDE)


def _patch(cls: type) -> None:
    original = cls.__dict__["build_middleware_stack"]

    def build_middleware_stack(self: Any) -> Any:
        saved = self.user_middleware
        injected = _middleware()
        if saved and saved[0].cls is injected.cls:  # a subclass calling super(): once only
            return original(self)
        self.user_middleware = [injected, *saved]
        try:
            return original(self)
        finally:
            self.user_middleware = saved

    cls.build_middleware_stack = build_middleware_stack  # type: ignore[attr-defined]


def _warm_up() -> None:
    import crashoverride
    import crashoverride.integrations

    for package in (crashoverride, crashoverride.integrations):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.rsplit(".", 1)[-1].startswith("__"):
                continue  # __main__ runs the CLI
            try:
                importlib.import_module(module.name)
            except Exception:  # an optional integration (celery) may be missing
                _EVENTS[f"warm-up import failed: {module.name}"] += 1
    _CRASH_OVERRIDE.warm_up()


def _record_event(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    import structlog

    name = str(event.get("event", ""))
    if name.startswith(("recovery.", "background.")):
        reason = str(event.get("reason", ""))
        # Internal errors keep what broke; other reasons (the agent's words) are not counted.
        detail = reason[:240] if reason.startswith("internal error") else ""
        _EVENTS[f"{name} {detail}".strip()] += 1
    raise structlog.DropEvent


def _crashoverride_setup() -> None:
    global _CRASH_OVERRIDE
    # Built before any test runs: importing the SDK for the model reads files, which the
    # suites' blocking-call detector would rightly report if it happened on the loop. One
    # instance for the whole process, as in production; the breaker is disabled so that every
    # failure of the suites really goes through a recovery.
    import structlog

    import crashoverride.integrations.asgi  # noqa: F401
    from crashoverride import CrashOverride

    _CRASH_OVERRIDE = CrashOverride(
        model=_give_up_model(), timeout=10.0, breaker_threshold=1_000_000_000
    )
    if WARM:
        _warm_up()
    # The harness (not the library) owns logging here: count the events, print none.
    structlog.configure(processors=[_record_event])


def pytest_configure(config: Any) -> None:
    if MODE not in MODES:
        raise ValueError(f"CRASHOVERRIDE_TRANSPARENCY must be one of {MODES}, got {MODE!r}")
    if MODE == "off":
        return
    if MODE == "crashoverride":
        _crashoverride_setup()
    from starlette.applications import Starlette

    _patch(Starlette)
    try:
        from fastapi import FastAPI
    except ImportError:
        return
    if "build_middleware_stack" in FastAPI.__dict__:  # FastAPI restates it (no super() call)
        _patch(FastAPI)


def pytest_report_header(config: Any) -> str:
    return f"transparency injection: {MODE}"


def pytest_runtest_logreport(report: Any) -> None:
    # In the controlling process, xdist replays every worker's reports through this hook.
    previous = _OUTCOMES.get(report.nodeid)
    if report.failed:
        outcome = "failed"
    elif hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    if previous != "failed":  # a failed setup or teardown fails the test
        _OUTCOMES[report.nodeid] = outcome


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    if not RESULTS:
        return
    out = Path(RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    if not hasattr(session.config, "workerinput"):
        (out / f"outcomes-{MODE}.json").write_text(json.dumps(_OUTCOMES, indent=0))
    if _EVENTS:
        (out / f"events-{MODE}-{os.getpid()}.json").write_text(json.dumps(dict(_EVENTS)))
