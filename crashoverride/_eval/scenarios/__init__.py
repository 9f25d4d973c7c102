"""The scenario families, one module each; every module exports ``SCENARIOS``.

A family module is the application under test: each trial runs in a fresh copy of it, so
its functions, globals and "upstream" data start pristine every time.
"""

from __future__ import annotations

MODULES = (
    "crashoverride._eval.scenarios.asgi_data",
    "crashoverride._eval.scenarios.asgi_code",
    "crashoverride._eval.scenarios.tasks",
    "crashoverride._eval.scenarios.tasks_data",
    "crashoverride._eval.scenarios.scrapers",
    "crashoverride._eval.scenarios.traps_tasks",
    "crashoverride._eval.scenarios.traps_asgi",
)
