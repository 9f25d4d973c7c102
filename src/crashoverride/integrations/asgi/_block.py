"""What a failed request looks like to the recovery: the ``Block``, its tools and its brief.

Imported only after a request failed, so nothing here is on the happy path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from crashoverride.integration import (
    Block,
    Brief,
    clip,
    is_secret_name,
    mask_fields,
    mask_multipart,
    mask_query,
)
from crashoverride.integrations.asgi._exchange import ASGIApp, CapturedResponse, Exchange, replay
from crashoverride.integrations.asgi._failed import ScopeInfo, failed_block

if TYPE_CHECKING:
    from crashoverride.followups import TaskGroupRunner

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
IDEMPOTENT_METHODS = SAFE_METHODS | {"PUT", "DELETE"}

# The brief of a failed request. Its parts are fixed here; the method and target the client
# sent are values, fenced: a known method is named by the note chosen for it, never echoed.
REQUEST_BRIEF = """\
This block is the HTTP request shown above, in an ASGI application. It raised before
any part of the response was sent. Execution does not resume inside the endpoint: the client
receives the response you produce, or the application's normal 500 error if you produce none.
`request` describes it (method, path, query, headers with secrets masked, body, json())."""

# The declared ones are the exception (``CrashOverride.effect``): the prompt lists them.
DECLARED_NOTE = (
    "Not the declared side effects listed above, if any: a replay gets their recorded results."
)
METHOD_NOTES = {
    **{m: f"{m} is a safe method: replaying it has no side effects to fear." for m in SAFE_METHODS},
    **{
        m: f"{m} is idempotent but not safe: the failed attempt may already have changed state; "
        "replaying it should converge to the same state."
        for m in IDEMPOTENT_METHODS - SAFE_METHODS
    },
    **{
        m: f"{m} is NOT idempotent: the failed attempt may already have performed side effects "
        "(a write, a charge, a message). Check what happened before replaying; a replay "
        f"performs them again. {DECLARED_NOTE}"
        for m in ("POST", "PATCH", "CONNECT")
    },
}
UNKNOWN_METHOD_NOTE = (
    "Its method (in `request` above) is not a standard one, so it is NOT idempotent: the failed "
    "attempt may already have performed side effects (a write, a charge, a message). Check what "
    f"happened before replaying; a replay performs them again. {DECLARED_NOTE}"
)

BODY_NOTES = {
    "not replayable": "The request body is NOT replayable (larger than max_replay_body, shown "
    "above, of unknown length, or the client stopped sending it): replay_request() will fail; "
    "answer with respond(...) or give up.",
    "unread": "The app had not read the whole request body; it is being read now and will be "
    "replayable if it fits in max_replay_body (shown above).",
    "kept": "The request body (its size is shown above) is kept: the request is replayable.",
}

REQUEST_FINISH = """\
Postcondition: a trustworthy response was produced, in one of two ways:
- Repair the code first (patch the failing function in its module, e.g. with a `global`
  statement or setattr on the module, so later requests work too), then
  `r = await replay_request()`: the request runs again through the application and its
  response is captured, not sent (r.status, r.headers, r.text, r.json()). The last successful
  replay is what the client receives; check it is right.
- `respond(status, body, headers=None, media_type=None)` sets the response directly (body:
  bytes, str, or a JSON-serialisable value). Only with data from a real source, or an honest
  error status (e.g. 503); never invent content.
`spawn_background(async_fn)` runs follow-up work after the response, in the app's lifespan.
If no trustworthy response is possible, call give_up(reason)."""

NO_RESPONSE = (
    "no response was produced: after repairing, `await replay_request()` to capture the "
    "application's own response, or set one with respond(...), or call give_up(reason)"
)


class RequestInfo(ScopeInfo):
    """The failed request as the agent sees it.

    Secret-looking headers, query parameters and form or JSON fields are masked; the replay
    (``replay_request``) still sends the request as it came.
    """

    __slots__ = ("_exchange", "_is_secret", "method", "scheme")

    def __init__(self, exchange: Exchange, is_secret: Callable[[str], bool] = is_secret_name):
        scope = exchange.scope
        super().__init__(scope, is_secret)
        self._exchange = exchange
        self._is_secret = is_secret
        self.method: str = scope.get("method", "GET")
        self.scheme: str = scope.get("scheme", "http")

    @property
    def body(self) -> bytes | None:
        """The body (secret-named form or JSON fields masked) when it was kept; else None."""
        body = self._exchange.body
        if body is None:
            return None
        kind = (self.header("content-type") or "").lower()
        if kind.startswith("application/x-www-form-urlencoded"):
            return mask_query(body.decode("latin-1"), self._is_secret)[0].encode("latin-1")
        if kind.startswith("multipart/form-data"):
            # The boundary is case-sensitive: read it from the header as sent.
            return mask_multipart(body, self.header("content-type") or "", self._is_secret)
        try:
            data = json.loads(body)
        except ValueError:
            return body
        return json.dumps(mask_fields(data, self._is_secret)).encode()

    @property
    def replayable(self) -> bool | None:
        return self._exchange.replayable

    def json(self) -> Any:
        body = self.body
        if body is None:
            raise ValueError("the request body was not kept (see request.replayable)")
        return json.loads(body)

    @property
    def target(self) -> str:
        """The path and (masked) query string."""
        return self.path + ("?" + self.query if self.query else "")

    def __repr__(self) -> str:
        body = self.body
        shown = "not kept" if body is None else clip(body.decode("utf-8", "replace"), 300)
        return f"<request {self.method} {self.target} body={shown!r}>"


class RequestRecovery:
    """Builds the ``Block`` for one failed request and holds the response the agent produced."""

    def __init__(
        self,
        *,
        app: ASGIApp,
        exc: BaseException,
        exchange: Exchange,
        runner: TaskGroupRunner | None,
        request_id_header: bytes | None,
        is_secret: Callable[[str], bool] = is_secret_name,
    ) -> None:
        self.app = app
        self.exchange = exchange
        self.runner = runner
        self.response: CapturedResponse | None = None
        self.replayed: CapturedResponse | None = None  # the last replay's response
        self.info = RequestInfo(exchange, is_secret)
        self.fields = request_fields(exchange, request_id_header)
        settle_body(exchange)
        self.block = self._block(exc)

    # -- the agent's request tools ---------------------------------------------------------

    async def replay_request(self) -> CapturedResponse:
        """Run the request again through the (repaired) app; the response becomes the answer."""
        response = await replay(self.app, self.exchange)
        self.response = self.replayed = response
        return response

    def respond(
        self,
        status: int,
        body: Any = b"",
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        media_type: str | None = None,
    ) -> str:
        """Set the response to send: bytes, str, or a JSON-serialisable value."""
        self.response = build_response(status, body, headers, media_type)
        return (
            f"Response set: {self.response.status}, {len(self.response.body)} bytes. It is "
            "sent when you finish."
        )

    async def replay_for_waiter(self) -> CapturedResponse:
        """Single-flight: another request's recovery of this failure succeeded; try again."""
        return await replay(self.app, self.exchange)

    def check(self, state: Any) -> bool | str:
        if self.response is None:
            return NO_RESPONSE
        if self.response is self.replayed and self.replayed.status < 500:
            state.verified_by = "replay_request"  # the request ran through the repaired app
        return True

    def spawn_unavailable(self, fn: Any, name: str | None = None) -> str:
        if hasattr(fn, "close"):
            fn.close()  # a coroutine object that will never run
        raise RuntimeError(
            "no background runner: the server did not run this app's lifespan, so there is no "
            "task group for work that outlives the request"
        )

    # -- the block -------------------------------------------------------------------------

    def _block(self, exc: BaseException) -> Block:
        runner = self.runner
        spawn: Callable[..., str] = runner.spawn if runner is not None else self.spawn_unavailable
        return failed_block(
            "request",
            exc,
            self.exchange.live_scope,
            self,
            bindings={
                "request": self.info,
                "replay_request": self.replay_request,
                "respond": self.respond,
                "spawn_background": spawn,
                "background": runner,
            },
            fields=self.fields,
            secrets=self.info.secret_values,
        )

    def why_cancelled(self) -> str | None:
        return "the client disconnected" if self.exchange.disconnected else None

    def brief(self) -> Brief:
        method = self.info.method
        replayable = self.exchange.replayable
        body = "kept" if replayable else ("unread" if replayable is None else "not replayable")
        return Brief(
            REQUEST_BRIEF,
            METHOD_NOTES.get(method, UNKNOWN_METHOD_NOTE),
            BODY_NOTES[body],
            REQUEST_FINISH,
            # The client chose the target (a decoded path may hold line breaks) and the method.
            request=f"{method} {self.info.target}",
            **(
                {"body_bytes": self.exchange.size}
                if replayable
                else {"max_replay_body": self.exchange.limit}
            ),
        )


def request_fields(exchange: Exchange, request_id_header: bytes | None) -> dict[str, Any]:
    """Request context for every event of a recovery: method, path, request id if sent."""
    scope = exchange.scope
    fields: dict[str, Any] = {"method": scope.get("method", ""), "path": scope.get("path", "")}
    if request_id_header is not None:
        for key, value in scope.get("headers", ()):
            if bytes(key).lower() == request_id_header:
                fields["request_id"] = bytes(value).decode("latin-1")
                break
    return fields


def settle_body(exchange: Exchange) -> None:
    """Decide from the headers what the app's unread body means for replaying it.

    Only a body the request declared (``content-length`` > 0, or chunked), or one the app began
    to read, is read after a failure, and only if it fits in the replay buffer.
    """
    if exchange.complete or exchange.chunks is None:
        return
    if exchange.size:
        exchange.declared = True  # the app began reading it: the rest is still to come
        return
    length: int | None = None
    chunked = False
    for key, value in exchange.scope.get("headers", ()):
        name = bytes(key).lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = -1
        elif name == b"transfer-encoding":
            chunked = True
    if chunked or (length is not None and length > 0):
        exchange.declared = True
        if length is not None and length > exchange.limit:
            exchange.chunks = None  # known in advance: too large to keep, so never read
    elif length == 0 or (
        length is None
        and (
            str(exchange.scope.get("http_version", "1.1")).startswith("1")
            or exchange.scope.get("method", "GET") in SAFE_METHODS
        )
    ):
        # HTTP/1.x frames every body with one of those headers: this request has none. HTTP/2
        # and 3 may stream one without a length; a safe method has no body to speak of.
        exchange.complete = True
    else:
        exchange.chunks = None  # a body of unknown length nobody read: not replayable


def build_response(
    status: int,
    body: Any,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
    media_type: str | None,
) -> CapturedResponse:
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"status must be an int between 100 and 599, got {status!r}")
    if isinstance(body, bytes | bytearray | memoryview):
        payload, default_type = bytes(body), "application/octet-stream"
    elif isinstance(body, str):
        payload, default_type = body.encode("utf-8"), "text/plain; charset=utf-8"
    else:
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        default_type = "application/json"
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or ())
    raw: list[tuple[bytes, bytes]] = []
    has_type = media_type is not None
    for name, value in pairs:
        lowered = str(name).lower()
        if lowered == "content-length":
            continue  # computed below from the actual body
        has_type = has_type or lowered == "content-type"
        raw.append((lowered.encode("latin-1"), str(value).encode("latin-1")))
    if not has_type or media_type is not None:
        raw.append((b"content-type", (media_type or default_type).encode("latin-1")))
    raw.append((b"content-length", str(len(payload)).encode("latin-1")))
    return CapturedResponse(status, raw, payload, "respond()")
