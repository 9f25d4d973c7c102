"""What the recovery of a failed unit of the middleware is shown, an HTTP request (``_block``)
or a websocket message (``_ws_block``) alike: the scope with its secrets masked, and the
``Block``, whose frame, globals and locals are those of the application's code that raised.

Imported only after a failure.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable, Mapping
from types import FrameType, MappingProxyType
from typing import Any, Protocol

from crashoverride.integration import MASK, Block, Brief, mask_query
from crashoverride.integrations.asgi._exchange import Scope


class ScopeInfo:
    """A connection's scope as the agent sees it: path, query, client and headers, with
    secret-looking headers and query parameters masked."""

    __slots__ = ("client", "headers", "path", "query", "secret_values")

    def __init__(self, scope: Scope, is_secret: Callable[[str], bool]) -> None:
        self.path: str = scope.get("path", "")
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        self.query, hidden = mask_query(query, is_secret)
        client = scope.get("client")
        self.client = f"{client[0]}:{client[1]}" if client else None
        raw = [
            (bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
            for k, v in scope.get("headers", ())
        ]
        # Masked here, and handed to the recovery's redactor so the values are masked wherever
        # else they show up (an echoing replay, an exception message, a log line).
        self.secret_values = (*(value for name, value in raw if is_secret(name)), *hidden)
        self.headers = [(name, MASK if is_secret(name) else value) for name, value in raw]

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


class Recovers(Protocol):
    """What a failed unit's recovery object gives its block (``RequestRecovery``,
    ``MessageRecovery``)."""

    def brief(self) -> Brief: ...
    def check(self, state: Any) -> bool | str: ...
    async def replay_for_waiter(self) -> Any: ...
    def why_cancelled(self) -> str | None: ...


def failed_block(
    kind: str,
    exc: BaseException,
    live_scope: Scope,
    recovery: Recovers,
    *,
    bindings: Mapping[str, Any],
    fields: Mapping[str, Any],
    secrets: tuple[str, ...],
    unit: Any = None,
) -> Block:
    """The block of a failed request or message: the agent's code runs in the globals of the
    innermost application frame, whose locals it reads as ``caller`` (the endpoint has ended);
    ``endpoint`` is what routing chose, when the application's router says
    (``scope["endpoint"]``)."""
    frame = app_frame(exc)
    endpoint = live_scope.get("endpoint")
    globals_: dict[str, Any] = {}
    if frame is not None:
        globals_ = frame.f_globals
    elif endpoint is not None:
        # A decorated endpoint (``functools.wraps``) names the decorator's module in its own
        # ``__globals__``: the code the application wrote is the wrapped function's.
        globals_ = getattr(_unwrap(endpoint), "__globals__", None) or {}
    return Block(
        kind=kind,
        frame=frame,
        globals_=globals_,
        caller=MappingProxyType(dict(frame.f_locals)) if frame is not None else None,
        bindings={**bindings, "endpoint": endpoint},
        brief=recovery.brief(),
        check=recovery.check,
        replay=recovery.replay_for_waiter,
        fields=fields,
        secrets=secrets,
        why_cancelled=recovery.why_cancelled,
        unit=unit,
    )


def _library_dirs() -> tuple[str, ...]:
    # String operations only (no realpath, no abspath): this runs on the event loop, and a
    # filesystem call there blocks every other request.
    paths = sysconfig.get_paths()
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    import crashoverride

    dirs.add(os.path.dirname(__file__))
    dirs.add(os.path.dirname(crashoverride.__file__ or ""))
    return tuple(os.path.join(os.path.normpath(d), "") for d in dirs if os.path.isabs(d))


_LIBRARY_DIRS: tuple[str, ...] | None = None


def app_frame(exc: BaseException) -> FrameType | None:
    """The innermost traceback frame in application code (not the stdlib, a package, or us)."""
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:
        _LIBRARY_DIRS = _library_dirs()
    chosen: FrameType | None = None
    innermost: FrameType | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        innermost = frame
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not os.path.normpath(filename).startswith(
            _LIBRARY_DIRS
        ):
            chosen = frame
        tb = tb.tb_next
    return chosen if chosen is not None else innermost


def _unwrap(func: Any) -> Any:
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func
