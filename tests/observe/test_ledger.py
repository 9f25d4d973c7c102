"""The ledger sinks: every report, redacted and schema-versioned, in a JSON Lines file
(rotation-safe) or a Redis stream (bounded); and their readers. Redis is the real one on
127.0.0.1:6379, database 11."""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from crashoverride import CrashOverride, JsonLinesLedger, RedisStreamLedger
from crashoverride._observe.ledger import open_ledger
from crashoverride._observe.record import SCHEMA, from_record, to_record
from crashoverride._observe.report import RecoveryReport, Usage
from crashoverride._security.audit import ToolCallRecord
from crashoverride.testing import Script, done, exec_python, give_up, script

REDIS = "redis://127.0.0.1:6379/11"  # 13 belongs to the fleet tests, which flush it
SECRET = "ghp_Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jj0Ii9Hh8Gg7"


def report(number: int, **fields: object) -> RecoveryReport:
    values: dict[str, object] = {
        "recovery_id": f"rec_{number:012x}", "handler": "h", "fingerprint": "f",
        "exc_type": "builtins.KeyError", "exception": "builtins.KeyError: 'x'",
        "traceback": "Traceback ...", "outcome": "recovered", "reason": "held", "via": "agent",
        "model": "m", "tool_calls": (ToolCallRecord("exec_python", "x = 1", "", True, 1.5),),
        "usage": Usage(1, 10, 2), "turns": 2, **fields,
    }  # fmt: skip
    return RecoveryReport(**values)  # type: ignore[arg-type]


def test_records_round_trip_and_are_masked() -> None:
    original = report(1, diagnosis=f"the token was {SECRET}")
    record = to_record(original)
    assert record["schema"] == SCHEMA == "crashoverride.recovery/1"
    assert SECRET not in json.dumps(record)
    back = from_record(json.loads(json.dumps(record)))
    assert back.tool_calls == original.tool_calls and back.usage == original.usage
    assert back.diagnosis == "the token was [REDACTED]"
    assert from_record({**record, "added_later": 1}).recovery_id == original.recovery_id
    with pytest.raises(ValueError, match="schema"):
        from_record({**record, "schema": "crashoverride.recovery/2"})


def test_json_lines_ledger_keeps_each_recovery_and_survives_rotation(tmp_path: Path) -> None:
    path = tmp_path / "recoveries.jsonl"
    co = CrashOverride(
        model=Script(exec_python("caller['n'] = 1"), done("set n")).run(give_up("no way")).model(),
        on_recovery=JsonLinesLedger(path),
    )  # fmt: skip
    token = SECRET  # a secret-named local: masked wherever it appears
    n = 0
    with co.handler():
        raise KeyError(f"missing for {token}")
    first = path.read_text()
    path.rename(tmp_path / "recoveries.jsonl.1")  # what logrotate does, then the next write
    with pytest.raises(ValueError), co.handler():
        raise ValueError("second")
    assert n == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    [old] = [json.loads(line) for line in first.splitlines()]
    [new] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (old["outcome"], new["outcome"]) == ("recovered", "failed")
    assert old["schema"] == new["schema"] == SCHEMA
    assert old["tool_calls"][0]["code"] == "caller['n'] = 1"
    assert SECRET not in first and "missing for" in old["exception"]
    assert open_ledger(str(path)).find(new["recovery_id"]) == new


def test_json_lines_appends_from_threads_stay_whole_lines(tmp_path: Path) -> None:
    sink = JsonLinesLedger(tmp_path / "ledger.jsonl")
    big = "y" * 50_000  # larger than a pipe buffer: still one line per record

    def write(start: int) -> None:
        for number in range(start, start + 25):
            sink(report(number, diagnosis=big))

    threads = [threading.Thread(target=write, args=(k * 100,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = open_ledger(str(tmp_path / "ledger.jsonl")).last(1_000)
    assert len(records) == 100 and all(r["diagnosis"] == big for r in records)


@pytest.fixture
def stream() -> Iterator[str]:
    import redis

    name = f"test-ledger:{uuid.uuid4().hex}"
    yield name
    redis.Redis.from_url(REDIS).delete(name)


def test_redis_stream_ledger_is_bounded_and_readable(stream: str) -> None:
    import redis

    sink = RedisStreamLedger(REDIS, stream=stream, maxlen=5)
    for number in range(20):
        sink(report(number))
    assert sink.flush()
    assert redis.Redis.from_url(REDIS).xlen(stream) == 5
    reader = open_ledger(f"{REDIS}?stream={stream}")
    assert [r["recovery_id"] for r in reader.last(10)] == [
        report(n).recovery_id for n in range(15, 20)
    ]
    assert reader.last(2)[-1]["recovery_id"] == report(19).recovery_id
    assert reader.find(report(17).recovery_id)["turns"] == 2  # type: ignore[index]
    assert reader.find(report(3).recovery_id) is None  # trimmed


def test_a_recovery_reaches_the_redis_ledger(stream: str) -> None:
    sink = RedisStreamLedger(f"{REDIS}?stream={stream}")
    co = CrashOverride(model=script(exec_python("caller['v'] = 3"), done()), on_recovery=sink)
    handler = co.handler()
    v = 0
    with handler:
        raise KeyError("v")
    assert v == 3 and handler.report is not None and sink.flush()
    [record] = open_ledger(f"{REDIS}?stream={stream}").last(5)
    assert from_record(record) == handler.report


def test_an_unreachable_redis_is_an_event_not_an_error() -> None:
    sink = RedisStreamLedger("redis://127.0.0.1:1/0")
    with structlog.testing.capture_logs() as logs:
        sink(report(1))
        assert sink.flush(timeout=30)
    [failed] = [e for e in logs if e["event"] == "ledger.write_failed"]
    assert failed["recovery_id"] == report(1).recovery_id
