"""Steps for rehearsing request and websocket message recoveries of ``CrashOverrideMiddleware``.

Each helper returns a step in the same contract as ``crashoverride.testing``'s, so a test reads
as the recovery it rehearses::

    script(patch("price_of", "def price_of(item):\\n    return PRICES[item]['amount']\\n"),
           replay_request(), done("renamed field; patched and replayed"))
"""

from __future__ import annotations

from typing import Any

from crashoverride.testing._steps import ToolCall, exec_python


def replay_request(*, call_id: str | None = None) -> ToolCall:
    """Replay the failed request through the (repaired) app; its response is the answer."""
    return exec_python("response = await replay_request()\nresponse.status", call_id=call_id)


def respond(
    status: int,
    body: Any = b"",
    *,
    headers: dict[str, str] | None = None,
    media_type: str | None = None,
    call_id: str | None = None,
) -> ToolCall:
    """Answer the failed request with this response (``body``: bytes, str or JSON value)."""
    code = f"respond({status!r}, {body!r}, headers={headers!r}, media_type={media_type!r})"
    return exec_python(code, call_id=call_id)


def replay_message(*, call_id: str | None = None) -> ToolCall:
    """Replay the failed websocket message through the (repaired) endpoint; what it sends is
    the reply, and the endpoint goes on with the connection."""
    return exec_python("replay = await replay_message()\nreplay", call_id=call_id)


def send_json(value: Any, *, call_id: str | None = None) -> ToolCall:
    """Reply to the failed websocket message with this JSON value."""
    return exec_python(f"send_json({value!r})", call_id=call_id)


def patch(function: str, source: str, *, call_id: str | None = None) -> ToolCall:
    """Replace the live function named ``function`` (module global) with ``source``."""
    code = f"replace_function(globals()[{function!r}], {source!r})"
    return exec_python(code, call_id=call_id)
