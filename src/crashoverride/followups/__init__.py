"""Follow-up jobs: background agent runs a recovery asks for, and the runners that own them.

A recovery agent calls ``spawn_followup(objective, context="")`` (a tool, and a function in its
namespace); a handler declares ``followups=[...]`` objectives that run after every recovery that
ran an agent. Each becomes a ``FollowupJob`` submitted when the recovery ends, to a runner chosen
by where the code runs:

* ``TaskGroupRunner``: an anyio task group the application owns (its lifespan, ``main``).
* ``ThreadRunner``: a supervised thread per job, joined with a bounded grace period at exit;
  the process-wide default, so a follow-up is never a task nobody holds.
* ``SubprocessRunner``: a detached process, for work that must outlive this one.
* ``crashoverride.integrations.celery.CeleryRunner``: the ``crashoverride.followup`` task.

The runner is the handler's or application's ``followup_runner``, else the one made current with
``using(runner)`` (integrations do this), else the default ``ThreadRunner``. Every job emits
``followup.submitted``, ``followup.started`` and ``followup.succeeded`` / ``followup.failed``.
"""

from __future__ import annotations

from crashoverride._core.followup import run_job, run_job_sync, run_payload
from crashoverride._followups.job import FollowupJob, FollowupResult, render_report
from crashoverride._followups.runners import (
    FollowupRunner,
    JobRunner,
    SubprocessRunner,
    ThreadRunner,
    current_runner,
    default_runner,
    resolve_runner,
    using,
)
from crashoverride._followups.taskgroup import TaskGroupRunner

__all__ = [
    "FollowupJob",
    "FollowupResult",
    "FollowupRunner",
    "JobRunner",
    "SubprocessRunner",
    "TaskGroupRunner",
    "ThreadRunner",
    "current_runner",
    "default_runner",
    "render_report",
    "resolve_runner",
    "run_job",
    "run_job_sync",
    "run_payload",
    "using",
]
