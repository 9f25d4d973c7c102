"""Which unit of work a request is, for the journal of its declared effects.

Every protected request is a unit of work (``integration.unit_of_work``): the replays of its
recovery (``replay_request()``, a single-flight waiter's, a background task's ``rerun()``) find
the declared effects (``CrashOverride.effect``) its failed run made instead of repeating them.

A request that carries an idempotency key (``Idempotency-Key``, or the header the middleware is
given) is a unit with an id beyond this run: a client's retry with the same key is a later
attempt of the same unit, and finds what the earlier ones did. The id is a digest of the key and
of what scopes it, so that a key names one request of one client, as at Stripe (whose keys
belong to the account whose API key sent them):

- the method, the path (``root_path`` + ``path``) and the query string: the same key sent to
  another route is another request;
- the client's credentials, the ``Authorization`` and ``Cookie`` headers (all of them, in
  order); a request with neither is scoped by the client's address instead (behind a proxy,
  that is the proxy's: the key's randomness is then what keeps two clients apart).

A digest, so that neither the key nor the credentials appear where the id is shown (events, the
agent's brief, ``EffectUncertain``), and the same in every process (a fleet's shared journal).
The body is not part of it: it is read by the application, after the unit began. A retry whose
body differs is matched effect by effect instead: an effect call's default key is a digest of
its arguments, so a charge of another amount is another call, and runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

PREFIX: Final = "http-idempotency:"
_CREDENTIALS: Final = (b"authorization", b"cookie")


def unit_id(scope: Mapping[str, Any], header: bytes | None) -> str | None:
    """The unit id of a request carrying ``header`` (lowercased, as ASGI gives names); None
    when it does not (or no header is configured): the request is then a unit of its own."""
    if header is None:
        return None
    headers = scope.get("headers") or ()
    for name, value in headers:  # the happy path: one comparison a header
        if name == header:
            key = bytes(value).strip()
            break
    else:
        return None
    if not key:
        return None
    parts = [
        str(scope.get("method", "")).encode("latin-1", "replace"),
        f"{scope.get('root_path', '')}{scope.get('path', '')}".encode("utf-8", "surrogatepass"),
        bytes(scope.get("query_string", b"")),
    ]
    credentials = [bytes(n) + b":" + bytes(v) for n, v in headers if n in _CREDENTIALS]
    if not credentials:
        client = scope.get("client")
        credentials = [b"client:" + str(client[0] if client else "").encode("latin-1", "replace")]
    digest = hashlib.sha256()
    for part in (*parts, *credentials, b"key:" + key):
        digest.update(b"%d:" % len(part) + part)  # length-prefixed: no two splits collide
    return PREFIX + digest.hexdigest()[:32]
