"""The recovery ledger: ``on_recovery`` sinks that keep every report, and their readers.

A record is the whole report, redacted, with its schema (``_observe.record``). Two sinks:

- ``JsonLinesLedger``: one JSON object per line in a file. The file is opened for each record
  (``O_APPEND``, one ``write``), so a rotation (the file moved or removed) starts a new file
  instead of writing into the old one, and processes appending to one file do not interleave.
- ``RedisStreamLedger``: one Redis stream for a whole fleet, trimmed to ``maxlen`` entries.
  Written from a background thread: a recovery, which may end on an application's event loop,
  never waits for the network.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from crashoverride._observe import events
from crashoverride._observe.record import to_record
from crashoverride._security.redact import RedactedData, fixed, scanned

if TYPE_CHECKING:
    from crashoverride._observe.report import RecoveryReport

DEFAULT_STREAM: Final = "crashoverride:recoveries"
FIELD: Final = "record"
_PENDING_LIMIT: Final = 1_000  # records waiting for Redis; beyond: dropped, with an event
_BATCH: Final = 500


def _line(record: RedactedData) -> bytes:
    """What a ledger writes: a record, redacted (``to_record``)."""
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


class JsonLinesLedger:
    """Append every report to a JSON Lines file (``on_recovery=JsonLinesLedger(path)``).

    Args:
        path: The file; created with mode ``0o600`` (reports quote code and live values).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def __call__(self, report: RecoveryReport) -> None:
        data = _line(to_record(report))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)  # one write: appends from several processes stay whole lines
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"JsonLinesLedger({self.path!r})"


def _split_stream(url: str, stream: str | None) -> tuple[str, str]:
    """(the URL without ``?stream=``, the stream): ``redis://host/13?stream=name``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    named = [value for key, value in query if key == "stream"]
    rest = urlencode([(key, value) for key, value in query if key != "stream"])
    return urlunsplit(parts._replace(query=rest)), stream or (
        named[-1] if named else DEFAULT_STREAM
    )


class RedisStreamLedger:
    """Add every report to a Redis stream shared by a fleet (``XADD ... MAXLEN maxlen``).

    Args:
        url: ``redis://host:port/db`` (``?stream=name`` may name the stream).
        stream: The stream's key; default ``crashoverride:recoveries``.
        maxlen: How many records the stream keeps (the oldest are trimmed).
    """

    def __init__(
        self, url: str = "redis://localhost:6379/0", *, stream: str | None = None,
        maxlen: int = 10_000,
    ) -> None:  # fmt: skip
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise ValueError(f"maxlen must be a positive int, got {maxlen!r}")
        self.url, self.stream = _split_stream(url, stream)
        self.maxlen = maxlen
        self._reset()

    def _reset(self) -> None:
        # Per process: a child forked from a process that wrote has none of its thread.
        self._pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def __call__(self, report: RecoveryReport) -> None:
        self._enqueue((report.recovery_id, _line(to_record(report))))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every record so far was written (or failed); False on time-out."""
        done = threading.Event()
        self._enqueue(done)
        return done.wait(timeout)

    def _enqueue(self, item: Any) -> None:
        if self._pid != os.getpid():
            self._reset()
        if isinstance(item, tuple) and self._queue.qsize() >= _PENDING_LIMIT:
            error = fixed("too many records waiting for Redis; this one is dropped")
            events.emit("error", events.LEDGER_FAILED, recovery_id=item[0], error=error)
            return
        self._queue.put(item)
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._drain, name="crashoverride-ledger", daemon=True
                )
                self._worker.start()

    def _drain(self) -> None:
        client: Any = None
        try:
            while True:
                try:
                    item = self._queue.get(timeout=30)
                except queue.Empty:
                    with self._lock:  # idle: end, unless a record came meanwhile
                        if self._queue.empty():
                            self._worker = None
                            return
                    continue
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                recovery_id, line = item
                try:
                    if client is None:
                        import redis

                        client = redis.Redis.from_url(
                            self.url, socket_timeout=5, socket_connect_timeout=5
                        )
                    client.xadd(self.stream, {FIELD: line, "recovery_id": recovery_id},
                                maxlen=self.maxlen, approximate=False)  # fmt: skip
                except Exception as exc:
                    events.emit("error", events.LEDGER_FAILED, recovery_id=recovery_id,
                              error=scanned(repr(exc)))  # fmt: skip
        finally:
            if client is not None:
                client.close()

    def __repr__(self) -> str:
        return f"RedisStreamLedger(stream={self.stream!r}, maxlen={self.maxlen})"


# -- reading ---------------------------------------------------------------------------------


def _parsed(data: bytes | str) -> dict[str, Any] | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None  # a torn or foreign line: skipped
    return record if isinstance(record, dict) and "recovery_id" in record else None


class _FileReader:
    def __init__(self, path: str) -> None:
        self.path = path

    def records(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as file:
            found = (_parsed(line) for line in file if line.strip())
            return [record for record in found if record is not None]

    def last(self, count: int) -> list[dict[str, Any]]:
        return self.records()[-count:] if count > 0 else []

    def find(self, recovery_id: str) -> dict[str, Any] | None:
        matching = [r for r in self.records() if r.get("recovery_id") == recovery_id]
        return matching[-1] if matching else None


class _StreamReader:
    def __init__(self, url: str) -> None:
        import redis

        url, self.stream = _split_stream(url, None)
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def _newest_first(self) -> Iterator[dict[str, Any]]:
        high = "+"
        while True:
            batch: list[Any] = (
                self.client.xrevrange(self.stream, max=high, min="-", count=_BATCH) or []
            )
            for _, fields in batch:
                record = _parsed(fields.get(FIELD.encode(), b""))
                if record is not None:
                    yield record
            if len(batch) < _BATCH:
                return
            high = "(" + batch[-1][0].decode()

    def last(self, count: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for record in self._newest_first():
            if len(found) >= count:
                break
            found.append(record)
        return found[::-1]

    def find(self, recovery_id: str) -> dict[str, Any] | None:
        return next((r for r in self._newest_first() if r["recovery_id"] == recovery_id), None)


Reader = _FileReader | _StreamReader


def open_ledger(source: str) -> Reader:
    """A reader of the ledger at ``source``: a file path or a ``redis://`` URL."""
    if source.startswith(("redis://", "rediss://", "unix://")):
        return _StreamReader(source)
    return _FileReader(source)
