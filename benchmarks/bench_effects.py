"""Declared effects on the happy path: what a ``with`` block and an effect call cost.

Once an effect is declared (``co.effect``), every effect call is journaled: in its unit of
work, or, outside any, in its thread's short list, from which a failing ``with`` block's unit
is made (a ``with`` opens no unit: it notes where the journal's numbering stood). Measured in
one process, interleaved with their baselines, each figure the minimum over the rounds (the
machine is shared and loaded: the minimum is the run it disturbed least):

- a ``with co.handler(...)`` block with effects declared, and one that calls a declared
  effect, against ``contextlib.suppress`` (the issue's goal: <= 1.25x);
- an effect call's overhead over the plain function, outside any unit (kept for its thread) and
  inside one (recorded in its journal) (goal: under 2 us).

Declaring an effect is for the whole process, so this module runs last in ``python -m
benchmarks`` (the rows before it measure a process without effects).

    python -m benchmarks bench_effects
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

from benchmarks._common import Row, interleaved, row
from crashoverride import CrashOverride

LOOPS = 200_000
ROUNDS = 15


def run() -> list[Row]:
    co = CrashOverride(project_prompt="benchmark", model="unused")
    suppress = contextlib.suppress

    def plain_charge(order: int) -> int:
        return order

    def with_suppress(n: int) -> None:
        for _ in range(n):
            with suppress(Exception):
                pass

    def with_handler(n: int) -> None:
        for _ in range(n):
            with co.handler(prompt="Leave `x` set."):
                pass

    before = interleaved({"handler": with_handler, "suppress": with_suppress}, LOOPS, ROUNDS, min)

    charge = co.effect(plain_charge)  # from here on, every effect call is journaled
    handler = co.handler(prompt="Leave `x` set.")

    def with_handler_charging(n: int) -> None:
        for _ in range(n):
            with co.handler(prompt="Leave `x` set."):
                charge(1)

    def reused_with(n: int) -> None:
        for _ in range(n):
            with handler:
                pass

    def reused_with_charging(n: int) -> None:
        for _ in range(n):
            with handler:
                charge(1)

    var: ContextVar[object] = ContextVar("floor", default=None)

    def context_variable(n: int) -> None:  # what any unit scoped to a context costs at least
        for _ in range(n):
            var.set(var.get())
            var.set(None)

    def call_plain(n: int) -> None:
        for _ in range(n):
            plain_charge(1)

    def call_effect(n: int) -> None:
        for _ in range(n):
            charge(1)

    t = interleaved(
        {
            "handler": with_handler,
            "charging": with_handler_charging,
            "suppress": with_suppress,
            "reused": reused_with,
            "reused charging": reused_with_charging,
            "plain": call_plain,
            "effect": call_effect,
            "context variable": context_variable,
        },
        LOOPS,
        ROUNDS,
        min,
    )
    outside = t["effect"] - t["plain"]
    inside = t["reused charging"] - t["reused"] - t["plain"]
    return [
        row("with co.handler(...) vs contextlib.suppress, no effect declared", before["handler"],
            "ns", baseline=before["suppress"], target="<= 1.25", note="min of rounds"),
        row("with co.handler(...) vs contextlib.suppress, effects declared", t["handler"], "ns",
            baseline=t["suppress"], target="<= 1.25",
            note="min of rounds; the with notes a number, opens no unit"),
        row("a context variable set and restored (what a unit per block would add) vs suppress",
            t["context variable"], "ns", baseline=t["suppress"],
            note="why a with opens no unit of work"),
        row("with co.handler(...) calling one declared effect vs contextlib.suppress",
            t["charging"], "ns", baseline=t["suppress"], note="min of rounds"),
        row("declared effect call outside any unit (kept for its thread), over the plain call",
            outside, "ns",
            target="< 2000 ns", note=f"plain call {t['plain']:.0f} ns; min of rounds"),
        row("declared effect call inside a unit (journaled), overhead over the plain call",
            inside, "ns", target="< 2000 ns",
            note="with <handler>: charge() minus with <handler>: pass minus the plain call"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
