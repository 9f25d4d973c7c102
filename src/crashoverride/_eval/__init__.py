"""``crashoverride eval``: measure how well a model recovers real failures.

Scenarios (``scenarios/``) are small applications with real failures, each with hidden oracles,
a scripted reference agent the oracles accept and scripted bad agents they must reject.
``_runner`` plays them against a model, ``_results`` renders the table and the JSON,
``_command`` is the command line. ``evaluate`` is the Python entry point (also
``crashoverride.evaluate``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from crashoverride._eval._runner import Progress, Target, Trial, run_suite

__all__ = ["Trial", "evaluate"]


def evaluate(
    model: Any = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    scenarios: Iterable[str] = ("*",),
    repeat: int = 1,
    timeout: float = 120.0,
    max_turns: int = 20,
    system_prompt: str | None = None,
    progress: Progress | None = None,
) -> list[Trial]:
    """Run the recovery scenarios against a model and return every trial's verdict.

    Args:
        model: A model name (with ``base_url`` for a local server) or an Agents SDK ``Model``
            instance, exactly as ``CrashOverride(model=...)`` takes it.
        base_url: An OpenAI-compatible endpoint.
        api_key: Its key; default ``OPENAI_API_KEY``.
        scenarios: Globs over scenario names (``"trap.*"``).
        repeat: Trials per scenario.
        timeout: Seconds one recovery may take.
        max_turns: Model turns per recovery.
        system_prompt: Instructions to try instead of the built-in ones.
        progress: Called with ``(done, total, label)`` before every trial.
    """
    target = Target(model, base_url, api_key, timeout, max_turns, system_prompt)
    return run_suite(target, patterns=scenarios, repeat=repeat, progress=progress)
