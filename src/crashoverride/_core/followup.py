"""Running one follow-up: the same pipeline as a recovery, with a follow-up's record.

A follow-up is not coordinated with recoveries (no breaker, single-flight or slot: it runs off
the critical path, in a runner the application owns) and it has no exception; otherwise it
takes the pipeline's steps: prepare, agent run under one deadline (the watchdog included),
verdict, outcome, release. Its events are ``followup.*``.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

from crashoverride._agent.state import AgentRun, RunState
from crashoverride._core.block import Block
from crashoverride._effects.journal import Unit
from crashoverride._followups.job import FollowupJob, FollowupResult, render_report
from crashoverride._followups.session import job_fields
from crashoverride._observe import events
from crashoverride._placement.deadline import Deadline
from crashoverride._security.audit import ToolCallRecord
from crashoverride._security.notes import internal_error
from crashoverride._security.redact import Redactor, fixed
from crashoverride._security.text import clip

if TYPE_CHECKING:
    from crashoverride._agent.run import AgentJob
    from crashoverride._config.settings import Settings


class FollowupRecord:
    """The pipeline's record of one follow-up (see ``_core.recovery.Recovery`` for a recovery's)."""

    def __init__(self, job: FollowupJob, settings: Settings, runner: str) -> None:
        from crashoverride._followups.inherit import Refused, run_settings

        self.job = job
        # What it runs under comes from its recovery, for every runner (``_followups.inherit``).
        self.refused = ""
        try:
            self.settings = run_settings(job, settings)
        except Refused as why:
            self.settings, self.refused = settings, str(why)
        self.deadline = Deadline(job.timeout)
        self.unit = Unit()  # a follow-up is a unit of work of its own
        self.id: str = job.id
        self.state = RunState()
        # The application's redaction policy covers follow-ups too.
        self.redact = Redactor.for_settings(settings)
        self.running = False
        self.workspace: Any = None
        self.block: Block | None = Block(
            kind="followup",
            frame=None,
            globals_={"__name__": "__crashoverride_followup__", "__builtins__": builtins},
            # A follow-up has no block to restore: finishing without giving up is its evidence.
            check=lambda _: True,
            bindings={"report": job.report, "objective": job.objective, "followup_id": job.id},
        )
        self._fields = self.redact.data({"runner": runner, **job_fields(job)})
        self._began = time.monotonic()
        self._result: FollowupResult | None = None

    def fields(self) -> dict[str, Any]:
        return dict(self._fields)

    def prepare(self) -> AgentJob:
        from crashoverride._agent.namespace import Workspace
        from crashoverride._agent.prompt import Fence, followup_instructions
        from crashoverride._agent.run import AgentJob

        job, state, block = self.job, self.state, self.block
        assert block is not None
        self.workspace = Workspace(
            globals_=block.globals, caller=None,
            bindings={**block.bindings, "give_up": state.give_up},
        )  # fmt: skip
        self.workspace.deadline = self.deadline.at
        # The report carries the failure's text (messages, values, tool results), and what the
        # recovery agent wrote (its notes, an objective it asked for) may repeat it: all are
        # fenced as data. Only an objective the developers declared is their instruction.
        fence = Fence()
        if job.origin == "handler":
            text = f"Follow-up {job.id}. Your objective (from the application's developers):\n"
            text += f"{job.objective}\n\n"
        else:
            text = f"Follow-up {job.id}. Your objective, written by the recovery agent:\n"
            text += f"{fence(job.objective, 'objective')}\n\n"
        if job.context:
            text += f"Notes from the recovery agent:\n{fence(job.context, 'notes')}\n\n"
        text += "The recovery report:\n" + fence(render_report(job.report), "recovery report")
        settings = self.settings
        return AgentJob(
            settings=settings,
            instructions=self.redact(
                followup_instructions(settings.mode, settings.project_prompt, fence=fence)
            ),
            input_text=self.redact(text),
            workspace=self.workspace,
            state=state,
            check=None,
            deadline=self.deadline.at,
            redact=self.redact,
            on_tool=self._on_tool,
            approve=settings.approve,
            mode=settings.mode,
            fence=fence,
        )

    def _on_tool(self, record: ToolCallRecord) -> None:
        # The same fields as ``recovery.tool_called``, and the recovery it follows.
        events.emit("info", events.FOLLOWUP_TOOL_CALLED, **record.event_fields(),
                    followup_id=self.job.id, recovery_id=self.job.report.recovery_id)  # fmt: skip

    def started(self, placement: str) -> None:
        self.running = True
        events.emit("info", events.FOLLOWUP_STARTED, placement=fixed(placement), **self._fields)

    # -- conclusions -------------------------------------------------------------------------

    def concluded(self, run: AgentRun | None, verdict: str | None) -> FollowupResult:
        state = self.state
        failure = run.failure if run is not None else "the agent did not run"
        if state.gave_up is not None:
            failure = f"the agent gave up: {state.gave_up}"
        elif state.aborted is not None:
            failure = state.aborted
        elif failure is None:
            failure = verdict
        if failure is not None:
            return self._finish("failed", failure)
        summary = run.final_output if run is not None else ""
        return self._finish("succeeded", summary or "done")

    def timed_out(self, what: str = "") -> FollowupResult:
        return self._finish("failed", self.deadline.message(what))

    def skipped(self, reason: str) -> FollowupResult:
        return self._finish("failed", reason)

    def cancelled(self, reason: str = "cancelled before it finished") -> None:
        if self._result is None:
            self._result = FollowupResult(
                self.job.id, "failed", self.redact(reason), self._ms(), tuple(self.state.records)
            )
            events.emit("warning", events.FOLLOWUP_FAILED, reason=self._result.summary,
                      cut_off=True, duration_ms=self._ms(), **self._fields)  # fmt: skip
        self.abandon()

    def _finish(self, outcome: str, text: str) -> FollowupResult:
        if self._result is not None:
            return self._result
        result = self._result = FollowupResult(
            self.job.id,
            "succeeded" if outcome == "succeeded" else "failed",
            clip(self.redact(text), 1_000),
            self._ms(),
            tuple(self.state.records),
        )
        if result.succeeded:
            events.emit("info", events.FOLLOWUP_SUCCEEDED, summary=result.summary,
                      duration_ms=result.duration_ms, **self._fields)  # fmt: skip
        else:
            events.emit("warning", events.FOLLOWUP_FAILED, reason=result.summary,
                      duration_ms=result.duration_ms, **self._fields)  # fmt: skip
        self.abandon()
        return result

    def _ms(self) -> float:
        return round((time.monotonic() - self._began) * 1000, 3)

    def abandon(self) -> None:
        from crashoverride._core.recovery import drop_references

        drop_references(self)


async def run_job(job: FollowupJob, settings: Settings, runner: str) -> FollowupResult:
    """Run one follow-up through the pipeline. Never raises, except cancellation (reported)."""
    import anyio

    from crashoverride._core import pipeline
    from crashoverride._core.entry import admit
    from crashoverride._placement import bridge

    rec = FollowupRecord(job, settings, runner)
    try:
        if rec.refused:
            return rec.skipped(rec.refused)
        refused: FollowupResult | None = admit(rec)
        if refused is not None:
            return refused
        result: FollowupResult = await pipeline.run(rec, bridge.placement())
        return result
    except anyio.get_cancelled_exc_class():
        rec.cancelled()
        raise
    except Exception as problem:
        return rec.skipped(internal_error(problem, rec.redact))
    finally:
        rec.abandon()


def run_job_sync(job: FollowupJob, settings: Settings, runner: str) -> FollowupResult:
    """``run_job`` from synchronous code (a Celery worker, a subprocess)."""
    from crashoverride._placement.bridge import loop_running_here

    if not loop_running_here():
        return asyncio.run(run_job(job, settings, runner))
    # Called from code running on an event loop: a fresh loop needs a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1, "crashoverride-followup") as pool:
        return pool.submit(asyncio.run, run_job(job, settings, runner)).result()


def run_payload(payload: dict[str, Any], app: Any, *, runner: str) -> FollowupResult:
    """Run a serialised follow-up with the ``CrashOverride`` ``app`` (Celery task, subprocess)."""
    return run_job_sync(FollowupJob.from_payload(payload), app._settings, runner)
