"""The journal of declared effects in Redis: what a unit of work with an id did, for its next
run on any process of the fleet (a Celery retry or redelivery, a client retry).

One hash per unit (``co:NAMESPACE:effects:<digest of the unit id>``), one field per call
(``n:key``), kept ``journal_ttl`` seconds after its last write. A call is written as started
before the effect runs and as done or failed after it; a process killed in between leaves it
started, which the next run settles with the effect's probe or refuses as ``EffectUncertain``.

What is stored is what may be shown: the label and the error redacted. A result is stored only
when JSON gives it back as it was and the redactor leaves it unchanged; otherwise the call is
stored as done with its result withheld, which another process treats like an interrupted call
(probe, else ``EffectUncertain``): it never returns a value that is not the one the effect
returned. The process that made the call keeps the result itself.

Every value is signed (HMAC-SHA256 under the fleet key) together with the namespace, unit id,
key and n it was written for: anyone who can write to Redis can delete entries (the effect then
runs again, as after ``journal_ttl``) but cannot make one, nor move one to another call. A value
that does not verify is no entry (``effect.refused``). Without a fleet key the journal stays in
each process.

Redis errors never reach the application's call: the journal goes on in this process
(``coordination.degraded``) and Redis is left alone for ``retry_after`` seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from crashoverride._config.coordination import RedisCoordination
from crashoverride._effects.journal import DONE, FAILED, STARTED, Entry, Journal, MemoryStore
from crashoverride._fleet.link import Link
from crashoverride._observe import events
from crashoverride._security.redact import Redactor, fixed, scanned

if TYPE_CHECKING:
    from crashoverride._security.redact import RunSettings

_DOMAIN: Final = b"crashoverride effect journal entry\x00"  # never a fix record's signature
_MAX_RESULT: Final = 64 * 1024  # characters of JSON a stored result may take
_STATES: Final = (STARTED, DONE, FAILED)


class RedisStore:
    """The ``Store`` of an application with ``RedisCoordination``: each unit's journal lives in
    this process (bounded, as ``MemoryStore``) and is written through to Redis."""

    def __init__(self, option: RedisCoordination, settings: RunSettings) -> None:
        self.option = option
        self.link = Link(option)
        self.redact = Redactor.for_settings(settings)
        self._down_until = 0.0
        self._told = False
        self._memory = MemoryStore(ttl=option.journal_ttl, make=self._new)
        if option.key is not None:
            # Made for the first unit with an id: connect now, while its code starts, so its
            # first effect call does not wait for the connection (TCP, TLS, AUTH) as well.
            self.link.fire(lambda client: client.ping())

    def _new(self, unit_id: str) -> Journal:
        if self.option.key is None:
            return Journal()
        return RedisJournal(self, unit_id)

    def journal(self, unit_id: str) -> Journal:
        journal = self._memory.journal(unit_id)
        if isinstance(journal, RedisJournal):
            journal.stale = True  # a new run: read what other processes did since
        elif not self._told:
            self._told = True  # once per process: the configuration does not change
            self._down(unit_id, "no fleet key (apply_fixes='never' without key=): the journal "
                       "of declared effects stays in each process", retry=False)  # fmt: skip
        return journal

    def hash_key(self, unit_id: str) -> str:
        digest = hashlib.sha256(unit_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"co:{self.option.namespace}:effects:{digest}"

    # -- talking to Redis: never an error for the application's call --------------------------

    def available(self) -> bool:
        # Not from the link's own thread (nothing of ours calls an effect there; waiting on
        # it from it would never end).
        return time.monotonic() >= self._down_until and (
            threading.current_thread().name != "crashoverride-fleet"
        )

    def call(self, unit_id: str, operation: Any) -> Any:
        """``operation(client)`` from synchronous code: its answer, or None when Redis did not
        give one in time (then the journal goes on here)."""
        if not self.available():
            return None
        bound = self.option.op_timeout
        try:
            return self.link.submit(operation, bound).result(bound + 1.0)
        except Exception as problem:  # redis errors, OSError, time-outs: all mean "not now"
            self._down(unit_id, f"{type(problem).__name__}: {problem}")
            return None

    async def acall(self, unit_id: str, operation: Any) -> Any:
        """``call`` from async code, on any backend, without blocking its loop."""
        if not self.available():
            return None
        try:
            return await self.link.run(operation)
        except Exception as problem:  # ``Unavailable``, or a bug of ours: not the app's
            self._down(unit_id, str(problem))
            return None

    def _down(self, unit_id: str, reason: str, *, retry: bool = True) -> None:
        if retry:
            self._down_until = time.monotonic() + self.option.retry_after
        events.emit("warning", events.COORDINATION_DEGRADED,
                    reason=scanned(f"the journal of declared effects: {reason}"[:300]),
                    retry_after=self.option.retry_after if retry else None,
                    unit=scanned(unit_id))  # fmt: skip

    # -- the stored form ------------------------------------------------------------------------

    def sign(self, unit_id: str, entry: Entry) -> tuple[str, str]:
        """(field, value) of ``entry`` in its unit's hash."""
        body: dict[str, Any] = {
            "ns": self.option.namespace, "unit": unit_id, "key": entry.key, "n": entry.n,
            "state": entry.state, "label": str(self.redact(entry.label)),
            "error": str(self.redact(entry.error)), "at": time.time(),
        }  # fmt: skip
        if entry.state == DONE:
            kept = self._storable(entry.result)
            body["withheld"] = kept is None
            body["result"] = None if kept is None else entry.result
        assert self.option.key is not None
        return f"{entry.n}:{entry.key}", json.dumps({"entry": body, "sig": _mac(self, body)})

    def _storable(self, result: Any) -> str | None:
        """The result as JSON, if JSON gives it back as it is and redaction leaves it alone."""
        if not _faithful(result, 0):
            return None
        try:
            text = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError):
            return None
        if len(text) > _MAX_RESULT or self.redact.data({"r": result})["r"] != result:
            return None
        return text

    def entry_of(self, unit_id: str, field: Any, value: Any) -> Entry | None:
        """The entry in ``value`` if it verifies and was written for this field of this unit;
        else None, with an ``effect.refused`` event."""
        try:
            name = field.decode() if isinstance(field, bytes) else str(field)
            number, key = name.split(":", 1)
            envelope = json.loads(value)
            body, signature = envelope["entry"], envelope["sig"]
            expected = _mac(self, body)
        except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as exc:
            return self._refused(unit_id, f"not a journal entry ({type(exc).__name__})")
        if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
            return self._refused(unit_id, "bad signature (not signed with this fleet's key)")
        bound = (body.get("ns"), body.get("unit"), body.get("key"), body.get("n"))
        if bound != (self.option.namespace, unit_id, key, _int(number)):
            return self._refused(unit_id, "written for another call, unit or namespace")
        at, state = body.get("at"), body.get("state")
        if not isinstance(at, int | float) or not 0 <= time.time() - at <= self.option.journal_ttl:
            return self._refused(unit_id, "expired, or from no time it could have been written")
        if state not in _STATES:
            return self._refused(unit_id, "malformed entry")
        label, error = str(body.get("label", "")), str(body.get("error", ""))
        if state == DONE and body.get("withheld", True):
            # Done, but its result could not be stored: like an interrupted call here.
            state, error = STARTED, ""
        return Entry.stored(key, int(number), label, state, body.get("result"), error)

    def _refused(self, unit_id: str, reason: str) -> Entry | None:
        events.emit("warning", events.EFFECT_REFUSED, reason=fixed(reason),
                    unit=scanned(unit_id))  # fmt: skip
        return None


class RedisJournal(Journal):
    """One unit's journal in this process, written through to Redis, and read from it once per
    run (``stale``): what other processes did before this run began."""

    def __init__(self, store: RedisStore, unit_id: str) -> None:
        super().__init__()
        self.store = store
        self.unit_id = unit_id
        self.name = store.hash_key(unit_id)
        self.stale = True

    def _adopt(self, found: Any) -> None:
        if found is None:
            return  # Redis did not answer: what this process knows stands
        self.stale = False
        for field, value in found.items():
            entry = self.store.entry_of(self.unit_id, field, value)
            if entry is not None:
                self.adopt(entry)

    def _write(self, entry: Entry) -> Any:
        field, value = self.store.sign(self.unit_id, entry)
        name, ttl = self.name, max(1, math.ceil(self.store.option.journal_ttl * 1000))

        async def write(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.hset(name, field, value)
            pipe.pexpire(name, ttl)
            return await pipe.execute()

        return write

    def _read(self, client: Any) -> Any:
        return client.hgetall(self.name)

    def find(self, key: str, n: int) -> Entry | None:
        if self.stale:
            self._adopt(self.store.call(self.unit_id, self._read))
        return super().find(key, n)

    def entries(self) -> list[Entry]:
        if self.stale:
            self._adopt(self.store.call(self.unit_id, self._read))
        return super().entries()

    def begin(self, entry: Entry) -> None:
        super().begin(entry)
        self.store.call(self.unit_id, self._write(entry))

    def ended(self, entry: Entry) -> None:
        self.store.call(self.unit_id, self._write(entry))

    async def afind(self, key: str, n: int) -> Entry | None:
        if self.stale:
            self._adopt(await self.store.acall(self.unit_id, self._read))
        return super().find(key, n)

    async def abegin(self, entry: Entry) -> None:
        super().begin(entry)
        await self.store.acall(self.unit_id, self._write(entry))

    async def aended(self, entry: Entry) -> None:
        await self.store.acall(self.unit_id, self._write(entry))


def _mac(store: RedisStore, body: Any) -> str:
    key = store.option.key
    assert key is not None
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, _DOMAIN + text.encode(), hashlib.sha256).hexdigest()


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _faithful(value: Any, depth: int) -> bool:
    """Whether JSON gives ``value`` back equal and of the same types (no tuple, no int key)."""
    if depth > 32:
        return False
    if value is None or type(value) in (bool, int, str):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(_faithful(item, depth + 1) for item in value)
    if type(value) is dict:
        return all(type(k) is str and _faithful(v, depth + 1) for k, v in value.items())
    return False
