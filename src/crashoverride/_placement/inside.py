"""Which recovery's agent code is running in this context, if any.

Set by the pipeline around every job it runs for a recovery (``_core.pipeline.inside``); read by
the pipeline (a failure raised there is part of that recovery's work, never a new recovery) and
by the change journal (``_repair.journal.note`` files a change under the recovery that made it).
"""

from __future__ import annotations

import contextvars

INSIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crashoverride_inside", default=None
)


def current_recovery() -> str | None:
    """The recovery whose agent code is running here, if any."""
    return INSIDE.get()
