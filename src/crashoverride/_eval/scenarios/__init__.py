"""The scenario families, one module each; every module exports ``SCENARIOS``.

A family's application is the module of the same name under ``apps/`` (each trial runs in a
fresh copy of it, so its functions, globals and "upstream" data start pristine every time).
What the agent must not see stays here: the ground truth, the oracles, the scripted agents.
"""

from __future__ import annotations

MODULES = (
    "crashoverride._eval.scenarios.asgi_data",
    "crashoverride._eval.scenarios.asgi_code",
    "crashoverride._eval.scenarios.websocket",
    "crashoverride._eval.scenarios.tasks",
    "crashoverride._eval.scenarios.tasks_data",
    "crashoverride._eval.scenarios.scrapers",
    "crashoverride._eval.scenarios.scrapy_spider",
    "crashoverride._eval.scenarios.traps_tasks",
    "crashoverride._eval.scenarios.traps_asgi",
    "crashoverride._eval.scenarios.effects",
    "crashoverride._eval.scenarios.revert",
)
