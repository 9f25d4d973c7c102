"""``RedisCoordination``: the fleet backend's configuration, validated at construction.

Only a description: nothing connects, and ``redis`` is not imported, until a protected block
fails (see ``_fleet.backend``). The happy path never talks to Redis. Whether redis-py is
installed is asked at construction (found, not imported), so a missing extra is one
``ConfigurationError`` at start-up rather than a degraded recovery every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from crashoverride._errors import ConfigurationError

APPLY_FIXES: Final = ("on-failure", "eager", "never")
_SCHEMES: Final = ("redis", "rediss", "unix")


def _url(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigurationError("url", f"expected a str, got {type(value).__name__}")
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        valid = parts.scheme in _SCHEMES and (bool(parts.hostname) or parts.scheme == "unix")
        valid = valid and parts.port != 0  # ``port`` raises ValueError when out of range
    except ValueError:
        valid = False
    if not valid or any(char.isspace() for char in value):
        shown = "a URL with credentials" if "@" in value else repr(value[:80])
        raise ConfigurationError(
            "url", f"expected a redis://, rediss:// or unix:// URL with a host, got {shown}"
        )
    return value


def _number(name: str, value: object, *, upper: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(name, f"expected a number, got {type(value).__name__}")
    if not 0 < value <= upper or math.isnan(value):
        raise ConfigurationError(name, f"must be greater than 0 and at most {upper:g}")
    return float(value)


class RedisCoordination:
    """Coordinate recoveries across processes (a fleet) through Redis.

    Pass it as ``CrashOverride(coordination=RedisCoordination(...))``. Then (with
    ``single_flight=True``, the default) one failure fingerprint runs at most one agent
    fleet-wide at a time; the other processes wait for its
    outcome and replay their unit; a recovery that changed code publishes a signed fix record
    the others apply before replaying (see the docs, "Running a fleet").

    Args:
        url: ``redis://``, ``rediss://`` (TLS; e.g. ``?ssl_ca_certs=/path/ca.pem``) or
            ``unix://`` URL, read by redis-py.
        namespace: Prefix of every key and channel: one per application (and deployment).
        key: The fleet key (str or bytes, at least 16 bytes) that signs and verifies fix
            records (HMAC-SHA256). Required unless ``apply_fixes="never"``.
        apply_fixes: ``"on-failure"`` (when the fixed failure happens here: apply the fix and
            replay, no model call), ``"eager"`` (also apply records as they are published)
            or ``"never"`` (records are neither published nor applied).
        lease: Seconds a leader's lease lasts without renewal: a dead leader is replaced after
            at most this (plus one second).
        op_timeout: Seconds a recovery waits for Redis at any step, the process's first
            connection included (TCP, TLS, AUTH); then it goes on in this process alone
            (``coordination.degraded``). A connection attempt that takes longer goes on in the
            background (up to five times as long) for later recoveries to use.
        retry_after: Seconds before a degraded process tries Redis again.
        max_agent_runs_per_minute: A fleet-wide ceiling on agent runs (cost control); None:
            no ceiling.
        record_ttl: Seconds fix records are kept for processes that start later.
        journal_ttl: Seconds the journal of a unit of work with an id (a Celery task id, an
            ``Idempotency-Key``) is kept in Redis after its last write: what its declared
            effects did, for a retry or redelivery on any process (the docs, "Declared effects
            across a fleet"). A run later than this finds nothing and makes its effects again.
            Journal entries are signed with ``key``: without one the journal stays in each
            process.
        cluster: ``url`` is the address of any node of a Redis Cluster (``redis://`` or
            ``rediss://``, database 0, the only one a Cluster has): the client is redis-py's
            ``redis.asyncio.RedisCluster``, built as ``RedisCluster.from_url(url)`` and with the
            fleet's bounds (no retries, ``op_timeout``). It finds the other nodes and follows
            slots as they move; every key of one failure shares a hash tag, so each step is one
            node's. The URL's query string is read as for a single server
            (``?ssl_ca_certs=...``).
        client_factory: Builds the ``redis.asyncio`` client instead of ``from_url``: a
            Sentinel-managed master (``redis.asyncio.sentinel.Sentinel([...]).master_for(name)``;
            the Sentinel's own connections are closed with the client), a Cluster client of
            your own making, custom TLS. Called on coordination's own thread for each
            connection attempt (once per process while Redis answers).

    Raises:
        ConfigurationError: An argument is invalid; the error names it. Or redis-py is not
            installed (``pip install 'crashoverride[redis]'``).
    """

    __slots__ = (
        "apply_fixes", "client_factory", "cluster", "journal_ttl", "key", "lease",
        "max_agent_runs_per_minute", "namespace", "op_timeout", "record_ttl", "retry_after", "url",
    )  # fmt: skip

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = "crashoverride",
        key: str | bytes | None = None,
        apply_fixes: str = "on-failure",
        lease: float = 5.0,
        op_timeout: float = 0.1,
        retry_after: float = 5.0,
        max_agent_runs_per_minute: int | None = None,
        record_ttl: float = 7 * 86_400,
        journal_ttl: float = 86_400,
        cluster: bool = False,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.url = _url(url)
        if client_factory is not None and not callable(client_factory):
            raise ConfigurationError("client_factory", "expected a callable or None")
        if (self.url is None) == (client_factory is None):
            raise ConfigurationError("url", "pass exactly one of url and client_factory")
        self.client_factory = client_factory
        self.cluster = _cluster(cluster, self.url)
        if not isinstance(namespace, str) or not namespace.strip():
            raise ConfigurationError("namespace", "must be a non-empty str")
        if any(char in namespace for char in "{}") or any(c.isspace() for c in namespace):
            raise ConfigurationError("namespace", "must not contain braces or whitespace")
        self.namespace = namespace
        if apply_fixes not in APPLY_FIXES:
            expected = ", ".join(map(repr, APPLY_FIXES))
            raise ConfigurationError("apply_fixes", f"expected one of {expected}")
        self.apply_fixes = apply_fixes
        self.key = _key(key, apply_fixes)
        self.lease = _number("lease", lease, upper=3_600)
        self.op_timeout = _number("op_timeout", op_timeout, upper=60)
        self.retry_after = _number("retry_after", retry_after, upper=3_600)
        budget = max_agent_runs_per_minute
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise ConfigurationError("max_agent_runs_per_minute", "expected an int or None")
        if budget is not None and budget < 1:
            raise ConfigurationError("max_agent_runs_per_minute", "must be at least 1")
        self.max_agent_runs_per_minute = budget
        self.record_ttl = _number("record_ttl", record_ttl, upper=365 * 86_400)
        self.journal_ttl = _number("journal_ttl", journal_ttl, upper=30 * 86_400)
        _require_redis()

    def __repr__(self) -> str:
        where = "client_factory" if self.url is None else "url=<hidden>"
        where += ", cluster=True" if self.cluster else ""
        return f"RedisCoordination({where}, namespace={self.namespace!r})"


def _cluster(cluster: object, url: str | None) -> bool:
    if not isinstance(cluster, bool):
        raise ConfigurationError("cluster", f"expected a bool, got {type(cluster).__name__}")
    if not cluster:
        return False
    if url is None:
        raise ConfigurationError(
            "cluster", "needs url= (any node's address): a client_factory builds its own client"
        )
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "unix":
        raise ConfigurationError("cluster", "a Cluster is reached over TCP: redis:// or rediss://")
    if parts.path.strip("/") not in ("", "0"):  # redis-py would refuse it at the first failure
        raise ConfigurationError("cluster", "a Cluster has database 0 only: drop the /N from url")
    return True


def _require_redis() -> None:
    # Found, not imported: importing redis-py costs start-up time the happy path never needs.
    from importlib.util import find_spec

    try:
        found = find_spec("redis") is not None
    except ImportError:  # an import hook refusing it, a broken installation
        found = False
    if not found:
        raise ConfigurationError(
            "RedisCoordination",
            "needs redis-py, which is not installed: pip install 'crashoverride[redis]'",
        )


def _key(key: object, apply_fixes: str) -> bytes | None:
    if key is None:
        if apply_fixes != "never":
            raise ConfigurationError(
                "key",
                "fix propagation needs a fleet key: unsigned code distributed through Redis would "
                "let anyone who can write to Redis run code in every process. Pass key=... (at "
                'least 16 bytes, the same in every process) or apply_fixes="never"',
            )
        return None
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise ConfigurationError("key", f"expected str or bytes, got {type(key).__name__}")
    if len(key) < 16:
        raise ConfigurationError("key", "must be at least 16 bytes")
    return key
