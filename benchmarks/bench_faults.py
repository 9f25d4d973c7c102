"""The fault table: fault → outcome → time until the original exception is back (measured).

Wire faults come from ``MockServer`` (real openai client and HTTP on loopback); the others from
scripted agents. Each row: value = seconds from the failure to the re-raise; note = the outcome
and the note the exception carried. The same faults are asserted in ``tests/core/test_faults*.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
from agents.testing import assistant_message, function_call

from benchmarks._common import Row, row
from benchmarks.bench_recovery import InstantModel, _quiet_logs
from crashoverride import CrashOverride
from crashoverride.testing import (
    MockServer,
    StepLike,
    eval_python,
    give_up,
    hang,
    http_error,
    junk_arguments,
    malformed,
    rate_limited,
    unknown_tool,
)

WIRE: dict[str, tuple[list[StepLike] | None, float]] = {
    "model endpoint down (connection refused)": (None, 4.0),
    "HTTP 500 on every attempt": ([http_error(500, times=2)], 3.0),
    "HTTP 429 on every attempt": ([rate_limited(0.2, times=2)], 3.0),
    "endpoint hangs longer than the budget": ([hang()], 1.0),
    "malformed JSON completion": ([malformed()], 3.0),
    "junk tool arguments (then the model gives up)": (
        [junk_arguments(), give_up("arguments keep failing")], 3.0),
    "unknown tool name": ([unknown_tool()], 3.0),
    "scripted model exhausted": ([eval_python("1")], 3.0),
}  # fmt: skip

RELEASE = threading.Event()


def lookup_inventory() -> str:
    """Look up the inventory (stuck until released)."""
    RELEASE.wait(10)
    return "released"


def _outcome(block: Callable[[], Any]) -> tuple[float, str]:
    began = time.perf_counter()
    try:
        block()
    except KeyError as exc:
        notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith("crashoverride:")]
        note = notes[0].split(": ", 2)[-1] if notes else "no note"
        return time.perf_counter() - began, f"original re-raised: {note}"
    except BaseException as exc:
        return time.perf_counter() - began, f"{type(exc).__name__} propagated"
    return time.perf_counter() - began, "suppressed (unexpected)"


def _with_block(co: CrashOverride) -> Callable[[], None]:
    def block() -> None:
        with co.handler():
            raise KeyError("article_text")

    return block


def _async_block(co: CrashOverride, backend: str) -> Callable[[], None]:
    async def main() -> None:
        async with co.handler():
            raise KeyError("article_text")

    return lambda: anyio.run(main, backend=backend)


def _wire_rows() -> list[Row]:
    rows = []
    for name, (steps, timeout) in WIRE.items():
        server = MockServer(steps).start()
        url = server.base_url
        if steps is None:
            server.close()
        co = CrashOverride(model="scripted", base_url=url, api_key="k", timeout=timeout)
        seconds, note = _outcome(_with_block(co))
        server.close()
        rows.append(row(f"fault: {name}", seconds, "s", target=f"<= {timeout + 1:g} s",
                        note=f"timeout={timeout:g}s; {note}"))  # fmt: skip
    return rows


def _scripted(steps: list[Any], **settings: Any) -> CrashOverride:
    return CrashOverride(model=InstantModel(steps), **settings)


def _exec(code: str) -> list[Any]:
    return [function_call("exec_python", {"statements": code}, call_id="f1")]


def _control_rows() -> list[Row]:
    done = [assistant_message("done")]
    tool = [function_call("lookup_inventory", "{}", call_id="t1")]
    cases: list[tuple[str, float | None, Callable[[], Any]]] = [
        ("agent code calls sys.exit(3)", None,
         _with_block(_scripted([_exec("import sys; sys.exit(3)"), done]))),
        ("agent code awaits forever (asyncio)", 0.5, _async_block(
            _scripted([_exec("await anyio.Event().wait()"), done], timeout=0.5), "asyncio")),
        ("agent code awaits forever (trio)", 0.5, _async_block(
            _scripted([_exec("await anyio.Event().wait()"), done], timeout=0.5), "trio")),
        ("sync app tool deadlocked (with, owner thread)", 0.5, _with_block(
            _scripted([tool, done], tools=[lookup_inventory], timeout=0.5))),
        ("sync app tool deadlocked (async with, trio)", 0.5, _async_block(
            _scripted([tool, done], tools=[lookup_inventory], timeout=0.5), "trio")),
        ("agent code spins in pure Python on the owner thread (with)", 0.5, _with_block(
            _scripted([_exec("while True:\n    pass"), done], timeout=0.5))),
        ("agent code spins in pure Python on the app loop (asyncio)", 0.5, _async_block(
            _scripted([_exec("while True:\n    pass"), done], timeout=0.5), "asyncio")),
        ("agent code raises KeyboardInterrupt (with)", None,
         _with_block(_scripted([_exec("raise KeyboardInterrupt"), done]))),
        ("agent code raises KeyboardInterrupt (async with, asyncio)", None, _async_block(
            _scripted([_exec("raise KeyboardInterrupt"), done]), "asyncio")),
    ]  # fmt: skip
    rows = []
    for name, timeout, block in cases:
        RELEASE.clear()
        seconds, note = _outcome(block)
        RELEASE.set()
        target = f"<= {timeout + 1:g} s" if timeout is not None else ""
        extra = f"timeout={timeout:g}s; " if timeout is not None else ""
        rows.append(row(f"fault: {name}", seconds, "s", target=target, note=extra + note))
    return rows


def run() -> list[Row]:
    _quiet_logs()
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    return _wire_rows() + _control_rows()


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
