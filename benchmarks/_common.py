"""Shared helpers: rows, medians of repeated timings, and the table format."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict


class Row(TypedDict):
    name: str
    value: float
    baseline: float | None
    ratio: float | None
    unit: str
    target: str
    note: str


def row(
    name: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    target: str = "",
    note: str = "",
) -> Row:
    ratio = value / baseline if baseline else None
    return Row(
        name=name, value=value, baseline=baseline, ratio=ratio, unit=unit, target=target, note=note
    )


def per_call_ns(fn: Callable[[int], Any], loops: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the time per loop iteration, in nanoseconds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn(loops)
        samples.append((time.perf_counter_ns() - start) / loops)
    return statistics.median(samples)


def interleaved(
    fns: dict[str, Callable[[int], Any]],
    loops: int | dict[str, int],
    rounds: int = 9,
    pick: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """ns per iteration of each function, measured in alternation (noisy machine): the median
    of the rounds, or what ``pick`` takes (``min``: the run the machine disturbed least).
    ``loops`` may differ by function (a dict), so that a slow one does not make a round long."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = loops if isinstance(loops, int) else loops[name]
            start = time.perf_counter_ns()
            fn(n)
            samples[name].append((time.perf_counter_ns() - start) / n)
    return {name: pick(values) for name, values in samples.items()}


async def ainterleaved(
    fns: dict[str, Callable[[int], Awaitable[Any]]],
    loops: int | dict[str, int],
    rounds: int = 9,
    pick: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """``interleaved`` for coroutine functions, awaited in turn on the running loop."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = loops if isinstance(loops, int) else loops[name]
            start = time.perf_counter_ns()
            await fn(n)
            samples[name].append((time.perf_counter_ns() - start) / n)
    return {name: pick(values) for name, values in samples.items()}


def format_table(rows: list[Row]) -> str:
    lines = [
        "| benchmark | value | baseline | ratio | target | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = f"{r['baseline']:.4g} {r['unit']}" if r["baseline"] is not None else "-"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['name']} | {r['value']:.4g} {r['unit']} | {base} | {ratio} | "
            f"{r['target'] or '-'} | {r['note'] or ''} |"
        )
    return "\n".join(lines)
