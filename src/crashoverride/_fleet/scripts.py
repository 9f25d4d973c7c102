"""The fleet's Redis layout and its scripts: one place that says what lives where.

Every key of one fingerprint shares a hash tag (``{...}``), so a Redis Cluster keeps them in one
slot and each script touches one node. Channels are not keys (Cluster broadcasts them).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from crashoverride._config.coordination import RedisCoordination

# KEYS: lease, fence. ARGV: holder, lease ms. -> {1, token} or {0, "token|holder" held}
ACQUIRE: Final = """
local held = redis.call('GET', KEYS[1])
if held then return {0, held} end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
return {1, tostring(token)}
"""
# KEYS: lease. ARGV: lease value, lease ms.
RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: lease. ARGV: lease value, channel. The waiters wake, find no lease and take over.
RELEASE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
"""
# KEYS: lease, fence, outcome, fix. ARGV: lease value, token, outcome, channel, signed record
# or '', outcome ms, record ms[, the message published: the outcome with the record, which the
# waiters then need not read]. Fenced: nothing is written unless the token is the newest.
LAND: Final = """
if tonumber(redis.call('GET', KEYS[2])) ~= tonumber(ARGV[2]) then return 0 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[5] ~= '' then redis.call('SET', KEYS[4], ARGV[5], 'PX', ARGV[7]) end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[6])
redis.call('PUBLISH', ARGV[4], ARGV[8] or ARGV[3])
return 1
"""
# KEYS: fails, open. ARGV: window ms, threshold, cool-down ms.
FAILED: Final = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
if n >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
  redis.call('DEL', KEYS[1])
end
return n
"""
# KEYS: the namespace's budget. ARGV: runs allowed per minute, a unique member. A sliding
# minute on the server's clock (no window edge to slip through, no clock skew between hosts).
# -> 1: this run counts and may go; 0: the budget is spent.
BUDGET: Final = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - 60000)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ms, ARGV[2])
redis.call('PEXPIRE', KEYS[1], 60000)
return 1
"""
# KEYS: the namespace's fix index. ARGV: fix key, retention ms, most records kept. One script,
# not a pipeline: a Cluster client refuses PUBLISH in a pipeline, and this is one slot.
ANNOUNCE: Final = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - tonumber(ARGV[2]))
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""
# KEYS: fix. ARGV: the record revoked (as stored), the signed revocation, record ms. The record
# is replaced by its revocation, unless a newer record took its place meanwhile.
REVOKE: Final = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
MAX_INDEXED: Final = 1_000  # records a late process catches up on, newest kept
OUTCOME_MS: Final = 60_000  # an outcome only matters to the waiters of its episode
MAX_WAKE: Final = 1.0  # a waiter re-checks the lease at least this often (no hot polling)


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def keys_for(namespace: str, fingerprint: str) -> dict[str, str]:
    """The keys (and the outcome channel) of one fingerprint in one namespace."""
    tag = hashlib.sha256(fingerprint.encode()).hexdigest()[:20]
    base = f"co:{namespace}:{{{tag}}}"
    names = ("lease", "fence", "outcome", "fix", "fails", "open")
    return {name: f"{base}:{name}" for name in names} | {"channel": f"{base}:done"}


async def release(client: Any, keys: dict[str, str], value: str) -> int:
    released: int = await client.eval(RELEASE, 1, keys["lease"], value, keys["channel"])
    return released


async def outcome_and_lease(client: Any, keys: dict[str, str]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    pipe.get(keys["outcome"])
    pipe.pttl(keys["lease"])
    found: list[Any] = await pipe.execute()
    return found


def newer(raw: Any, token: int) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        outcome = json.loads(raw)
        return outcome if int(outcome["token"]) >= token else None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def token_of(held: Any) -> int | None:
    """The fencing token in a lease value (``token|holder``); None for a value no process of
    ours wrote (anyone who can write to Redis can put anything there)."""
    try:
        token = int(bytes(held).split(b"|", 1)[0])
    except (TypeError, ValueError):
        return None
    return token if token > 0 else None


def index_key(namespace: str) -> str:
    return f"co:{namespace}:fixes"


async def announce(client: Any, option: RedisCoordination, fix_key: str) -> None:
    """After a record (or its revocation) is stored: index it (bounded by age and count) and
    announce it."""
    index = index_key(option.namespace)
    await client.eval(ANNOUNCE, 1, index, fix_key, ms(option.record_ttl), MAX_INDEXED)
