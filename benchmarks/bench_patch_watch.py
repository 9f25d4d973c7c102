"""The patch watch on the happy path: what a live-patched function's call costs while watched.

A recovery (scripted model) patches ``price`` live with ``replace_function``; for
``patch_watch`` seconds crashoverride watches it and would revert it if it made things worse.
The watch looks only at failures (``_repair.watch``): a patched call that succeeds should run
exactly the agent's code, no wrapper, no hook. Measured in three phases, each interleaved with a
never-patched function of the same source as the code ``price`` runs then, each figure the
minimum over the rounds (the machine is shared and loaded: the minimum is the run it disturbed
least):

- before any patch (``price`` runs its original code);
- after the patch, while the watch is active (the phase must end inside the window, or the
  module fails rather than report a row it did not measure);
- after the window has passed.

    python -m benchmarks bench_patch_watch
"""

from __future__ import annotations

import sys
import time
from typing import Any

import structlog.testing
from agents.testing import ScriptedModel, assistant_message, function_call

from benchmarks._common import Row, interleaved, row
from crashoverride import CrashOverride

LOOPS = 200_000
ROUNDS = 25
WINDOW = 10.0  # patch_watch, seconds: long enough for one phase on a loaded machine

FIXED = "def price(n):\n    return 100 // n if n else 0\n"


def price(n: int) -> int:  # patched live by the recovery below
    return 100 // n


def price_original(n: int) -> int:  # never patched: the source ``price`` starts with
    return 100 // n


def price_fixed(n: int) -> int:  # never patched: the source the recovery gives ``price``
    return 100 // n if n else 0


def _calls(fn: Any) -> Any:
    def loop(n: int) -> None:
        for _ in range(n):
            fn(7)

    return loop


def _phase(control: Any) -> dict[str, float]:
    found = interleaved({"price": _calls(price), "control": _calls(control)}, LOOPS, ROUNDS, min)
    return {**found, "ratio": found["price"] / found["control"]}


def _patch_by_a_recovery() -> tuple[float, float]:
    """Run one recovery that patches ``price``: monotonic times before and after it (the
    watch is armed as it ends: its window ends between the two plus ``WINDOW``)."""
    statements = f"replace_function(globals()['price'], {FIXED!r})\ncaller['value'] = price(0)"
    model = ScriptedModel(
        [
            [function_call("exec_python", {"statements": statements}, call_id="c1")],
            [assistant_message("price(0) returns 0 now.")],
        ]
    )
    co = CrashOverride(model=model, patch_watch=WINDOW, single_flight=False)
    began = time.monotonic()
    value = None
    with structlog.testing.capture_logs() as logs, co.handler(prompt="Leave `value` set."):
        value = price(0)
    events = [e["event"] for e in logs]
    if value != 0 or price(0) != 0 or "recovery.succeeded" not in events:
        raise RuntimeError(f"the recovery did not patch price: {value!r}, {events}")
    return began, time.monotonic()


def run() -> list[Row]:
    original = price
    before = _phase(price_original)
    began, ended = _patch_by_a_recovery()
    watched = _phase(price_fixed)
    hooked = sys.gettrace() or sys.getprofile()
    if price is not original or price.__code__.co_filename == __file__ or hooked is not None:
        raise RuntimeError(f"not the watch as it should be: {price.__code__}, {hooked}")
    if time.monotonic() >= began + WINDOW:
        raise RuntimeError(f"the watched phase outlasted patch_watch={WINDOW}s: raise WINDOW")
    time.sleep(max(0.0, ended + WINDOW + 0.5 - time.monotonic()))  # past the window for sure
    after = _phase(price_fixed)
    patched = "a never-patched function of the same source"
    return [
        row("price() before any patch vs a never-patched copy of its source", before["price"],
            "ns", baseline=before["control"], note="min of rounds"),
        row("live-patched price() while the patch watch is active vs a never-patched copy",
            watched["price"], "ns", baseline=watched["control"], target="~1 (nothing added)",
            note=f"within patch_watch={WINDOW:g}s of the recovery; same function object, its "
            f"code the agent's, no trace or profile hook; baseline: {patched}"),
        row("live-patched price() after the watch window vs a never-patched copy",
            after["price"], "ns", baseline=after["control"], note="min of rounds"),
        row("patched call's ratio to its copy: watched over after the window",
            watched["ratio"], "x", baseline=after["ratio"], target="~1",
            note="the watch's cost on a patched call, net of the phases' machine load"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
