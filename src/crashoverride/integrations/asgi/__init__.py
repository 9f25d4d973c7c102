"""ASGI middleware: a request whose endpoint raises is repaired and answered instead of a 500.

Usage with Starlette or FastAPI::

    app.add_middleware(CrashOverrideMiddleware, crash_override=co, prompt="...")

What it does:

* ``http`` requests: the endpoint runs untouched (same task, same context). If it raises a
  ``catch``-matching exception before ``http.response.start`` was sent, and the request is not
  being cancelled, a recovery runs with request tools (``request``, ``replay_request()``,
  ``respond(...)``, ``spawn_background(...)``). Only a trustworthy response (a captured replay
  or ``respond``) is sent, marked: the request's id header echoed back and
  ``crashoverride-recovery: <recovery id>`` (``CrashOverride(recovery_header=False)``: no such
  header); otherwise the original exception propagates, with a note, and the app's normal 500
  follows. Nothing that fails inside crashoverride or on the client's channel
  meanwhile replaces that exception.
* Each protected request is a unit of work: a replay of it (``replay_request()``, a
  single-flight waiter's, a background task's ``rerun()``) finds the declared effects
  (``CrashOverride.effect``) its failed run made and does not make them again; so does a
  client's retry carrying the same ``Idempotency-Key`` (``idempotency_header``; see
  ``integrations.asgi._units`` for what scopes a key).
* The request body is recorded as it is read, up to ``max_replay_body`` bytes, so the request
  can be replayed. Larger bodies still stream to the app unchanged; they are just not replayable.
* If the response had already started, nothing more is sent. A Starlette/FastAPI background
  task that raised after the response is recovered as a task call, then the tasks queued after
  it run; a stream that failed is logged as ``recovery.skipped``, or, with
  ``repair_after_start``, the agent repairs the code for later requests while the exception
  propagates. See ``integrations.asgi._after``.
* ``lifespan``: passed through; the middleware also opens the task group background work
  spawned by recoveries runs in, and drains it (bounded) at shutdown. With ``warm_up`` (the
  default) startup first imports the Agents SDK in a worker thread, so a server's first failure
  does not stall its event loop with that import (see ``CrashOverride.awarm_up``); not when no
  recovery could run (no credentials), where the import would buy nothing.
* ``websocket``: when the endpoint raises while handling a received message, a recovery runs
  with message tools (``message``, ``connection``, ``replay_message()``, ``send_text(...)``);
  a recovered connection stays open, in a restarted run of the endpoint (its handshake already
  done; the state local to the failed run is lost). Not recovered, the exception and the close
  code are what they are without crashoverride. See ``_websocket`` and ``_ws_session``, and
  docs/guides/websockets.md.
* Other scope types: passed straight through.

Installed with ``add_middleware`` it sits inside Starlette's ``ServerErrorMiddleware`` (which
turns a propagated exception into the 500) and outside ``ExceptionMiddleware`` (so handled
``HTTPException`` responses never reach it). Do not wrap a whole Starlette or FastAPI app from
the outside instead: its own ``ServerErrorMiddleware`` would have sent the 500 already, and the
middleware only logs ``recovery.skipped``.
"""

from __future__ import annotations

from crashoverride.followups import TaskGroupRunner
from crashoverride.integrations.asgi._exchange import CapturedResponse, NotReplayable

# Also importable from here, as before the subpackage was split, though not in ``__all__``: the
# options' defaults and the header a recovered response carries.
from crashoverride.integrations.asgi._http import RECOVERY_HEADER  # noqa: F401
from crashoverride.integrations.asgi._middleware import (
    DEFAULT_MAX_MESSAGE,  # noqa: F401
    DEFAULT_MAX_REPLAY_BODY,  # noqa: F401
    CrashOverrideMiddleware,
)

__all__ = ["CapturedResponse", "CrashOverrideMiddleware", "NotReplayable", "TaskGroupRunner"]
