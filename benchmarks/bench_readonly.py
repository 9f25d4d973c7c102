"""Diagnose mode's cost per ``inspect_python`` call: a forked snapshot against evaluating in place.

The snapshot forks, confines the child (shared memory read-only, descriptors closed, audit hook),
evaluates, renders and sends the text back; fork time grows with the process's page tables, so
it is measured twice, in this small benchmark process and after touching a large heap. The
baseline is what inspection cost before: ``eval`` in the process (``Workspace.evaluate``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import Row, row
from crashoverride._agent.namespace import Workspace
from crashoverride._diagnose import snapshot as _snapshot

EXPRESSION = "sorted(orders, key=len)[:3]"
HEAP_MB = 512


def _workspace() -> Workspace:
    orders = [{"id": i, "total": i * 3} for i in range(200)]
    return Workspace(globals_={"__builtins__": __builtins__}, caller={"orders": orders},
                     bindings={})  # fmt: skip


def _median_us(call: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def run() -> list[Row]:
    ws = _workspace()
    in_place = _median_us(lambda: ws.evaluate(EXPRESSION), 2_000)
    snapshot = _median_us(lambda: ws.inspect(EXPRESSION), 200)
    heap = bytearray(HEAP_MB * 1024 * 1024)
    heap[::4096] = b"x" * len(heap[::4096])  # touch every page: it is mapped, as a real heap
    big = _median_us(lambda: ws.inspect(EXPRESSION), 60)
    del heap
    _snapshot.FORK_ENABLED = False
    try:
        static = _median_us(lambda: ws.inspect(EXPRESSION), 2_000)
    finally:
        _snapshot.FORK_ENABLED = True
    return [
        row("inspect_python in a forked snapshot (small process)", snapshot / 1000, "ms",
            baseline=in_place / 1000, target="< 10 ms",
            note="baseline: the same expression evaluated in place (no isolation)"),
        row(f"inspect_python in a forked snapshot ({HEAP_MB} MB heap touched)", big / 1000, "ms",
            baseline=snapshot / 1000, target="< 50 ms", note="fork copies page tables"),
        row("inspect_python without fork (static evaluator)", static / 1000, "ms",
            baseline=in_place / 1000, note="where fork is unavailable; refuses more"),
    ]  # fmt: skip


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
