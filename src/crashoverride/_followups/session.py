"""How a recovery asks for follow-ups, and how they are handed to a runner when it ends."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from crashoverride._followups.job import (
    CONTEXT_LIMIT,
    MAX_PER_RECOVERY,
    OBJECTIVE_LIMIT,
    FollowupJob,
    FollowupResult,
    new_id,
)
from crashoverride._observe import events
from crashoverride._observe.report import RecoveryReport
from crashoverride._security.notes import internal_error
from crashoverride._security.redact import EMPTY, Redacted, clip, fixed, scanned

if TYPE_CHECKING:
    from crashoverride._config.settings import Settings

# How a job runs once its runner starts it: ``_core.followup.run_job``, handed in by the core.
Run = Callable[[FollowupJob, "Settings", str], Awaitable[FollowupResult]]


class FollowupSession:
    """The follow-ups of one recovery; the core creates one per agent run.

    ``spawn`` is what the recovery agent calls (as a tool or from its namespace); the jobs are
    submitted by ``conclude`` once the report exists, in the recovery's owner context.
    """

    def __init__(
        self,
        settings: Settings,
        recovery_id: str,
        redact: Callable[[str], Redacted] | None = None,
        *,
        run: Run,
    ) -> None:
        from crashoverride._security.redact import Redactor

        self._settings = settings
        self._recovery_id = recovery_id
        self._run = run  # the core's ``run_job``: this layer sits below the pipeline
        # Agent code may hand on process state (``spawn_followup(..., context=os.environ[...])``);
        # a job can travel through a broker or a subprocess's arguments: masked before it leaves.
        self._redact = redact if redact is not None else Redactor.for_settings(settings)
        self._lock = threading.Lock()
        self._requested: list[tuple[Redacted, Redacted, Redacted]] = []  # id, objective, context

    def spawn(self, objective: str, context: str = "") -> str:
        if not isinstance(objective, str) or not objective.strip():
            raise ValueError("spawn_followup() needs a non-empty objective string")
        with self._lock:
            if len(self._requested) >= MAX_PER_RECOVERY:
                raise RuntimeError(f"at most {MAX_PER_RECOVERY} follow-ups per recovery")
            job_id = self._redact(new_id())
            self._requested.append(
                (job_id, self._bounded(objective.strip(), OBJECTIVE_LIMIT),
                 self._bounded(str(context), CONTEXT_LIMIT))
            )  # fmt: skip
        return (
            f"Follow-up {job_id} queued; it starts in the background when this recovery ends "
            "and receives the recovery report. Do not wait for it."
        )

    def _bounded(self, text: str, limit: int) -> Redacted:
        # Redacted, then clipped: a cut must not halve a secret the scan would then miss. The
        # first cut only bounds the scan's cost.
        return clip(self._redact(clip(text, 2 * limit)), limit)

    def conclude(self, report: RecoveryReport) -> list[str]:
        """Submit the declared and requested follow-ups; returns their ids. Never raises."""
        try:
            return self._conclude(report)
        except Exception as problem:
            events.emit("error", events.FOLLOWUP_FAILED, recovery_id=report.recovery_id,
                      reason=internal_error(problem, self._redact))  # fmt: skip
            return []

    def _conclude(self, report: RecoveryReport) -> list[str]:
        settings = self._settings
        redact = self._redact
        wanted: list[tuple[Redacted, Redacted, Redacted, Redacted]] = []
        if report.outcome != "skipped":
            wanted += [(redact(new_id()), redact(o), EMPTY, HANDLER) for o in settings.followups]
        with self._lock:
            wanted += [(i, objective, context, AGENT) for i, objective, context in self._requested]
            self._requested.clear()
        if not wanted:
            return []
        from crashoverride._followups.inherit import from_recovery
        from crashoverride._followups.runners import resolve_runner

        runner = resolve_runner(settings.followup_runner)
        inherited = from_recovery(settings)
        ids: list[str] = []
        for job_id, objective, context, origin in wanted:
            job = FollowupJob(
                id=job_id, objective=objective, origin=origin, context=context, report=report,
                **inherited,
            )  # fmt: skip
            if submit(runner, job, settings, self._run):
                ids.append(job_id)
        return ids


AGENT, HANDLER = fixed("agent"), fixed("handler")


def job_fields(job: FollowupJob) -> dict[str, Redacted]:
    return {
        "followup_id": job.id,
        "recovery_id": job.report.recovery_id,
        "origin": job.origin,
        "objective": clip(job.objective, 200),
    }


def submit(runner: Any, job: FollowupJob, settings: Settings, run: Run) -> bool:
    """Hand ``job`` to ``runner``; False (and a ``followup.failed`` event) when it refused."""
    label = scanned(type(runner).__name__)
    # Before the hand-over: an in-process job may start (and log) before ``submit`` returns.
    events.emit("info", events.FOLLOWUP_SUBMITTED, runner=label, **job_fields(job))
    try:
        if callable(getattr(runner, "submit_job", None)):
            runner.submit_job(job)
        else:

            async def fn() -> None:
                await run(job, settings, label)

            runner.submit(fn, name=job.id)
    except Exception as problem:
        events.emit("error", events.FOLLOWUP_FAILED, runner=label,
                  reason=scanned(f"could not submit: {problem!r}"),
                  **job_fields(job))  # fmt: skip
        return False
    return True
