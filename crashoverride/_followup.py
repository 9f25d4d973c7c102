"""Follow-up jobs: how a recovery asks for them, how one runs, how it travels between processes.

The public face (job types, runners) is ``crashoverride.followups``; this module holds what the
core recovery and the runners share. A follow-up is an agent run of its own, with a larger
budget, that receives the text of the ``RecoveryReport`` and never blocks the application.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from . import _log
from ._report import RecoveryReport, SourceChange, ToolCallRecord, Usage
from ._text import clip

if TYPE_CHECKING:
    from ._settings import Settings

STARTED = "followup.started"
SUCCEEDED = "followup.succeeded"
FAILED = "followup.failed"
SUBMITTED = "followup.submitted"
TOOL_CALLED = "followup.tool_called"

# An agent that asks for dozens of follow-ups is looping; the first few carry the signal.
MAX_PER_RECOVERY = 5
OBJECTIVE_LIMIT = 2_000
CONTEXT_LIMIT = 8_000

FOLLOWUP_PROMPT = """\
You are a follow-up agent of a running Python application. Earlier, a recovery agent handled a
failure in this application; its report is your input. That failure is settled (recovered or
re-raised): nothing waits for you, and you run in the background, off the critical path.

Tools:
- eval_python(expression) / exec_python(statements): run Python in this process, REPL-style;
  top-level `await` works. `report` is the RecoveryReport, `objective` your objective.
- give_up(reason): stop; your objective is recorded as not achieved, with your reason.
- Any application tools listed.

How to work:
1. Restate the objective as a concrete end state before acting.
2. Work from the evidence in the report and what you can observe; never invent facts.
3. Do not change the running application's state unless the objective says so.
4. Make persistent changes (files, tickets, messages, queued work) only as the objective and the
   application's prompts authorise, and each at most once.
5. If the objective cannot be achieved, call give_up with the reason.
When done, answer with one short line saying what you did."""


@dataclass(frozen=True, slots=True)
class FollowupJob:
    """One follow-up: an objective plus the report of the recovery that asked for it.

    Attributes:
        id: Unique id (``fu_...``), in every event of the job.
        objective: What the follow-up agent must achieve.
        origin: ``"handler"`` (declared with ``followups=``) or ``"agent"`` (``spawn_followup``).
        context: Notes from the recovery agent (what it found), may be empty.
        report: The recovery's report (text only).
        timeout: Wall-clock budget of the follow-up agent, in seconds.
        max_turns: Model turns the follow-up agent may take.
    """

    id: str
    objective: str
    origin: str
    context: str
    report: RecoveryReport
    timeout: float
    max_turns: int

    def to_payload(self) -> dict[str, Any]:
        """A JSON-safe dict, for runners that hand the job to another process."""
        data = dataclasses.asdict(self)
        data["report"]["tool_calls"] = [dict(call) for call in data["report"]["tool_calls"]]
        data["report"]["source_changes"] = [dict(c) for c in data["report"]["source_changes"]]
        return data

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> FollowupJob:
        raw = dict(data["report"])
        raw["tool_calls"] = tuple(ToolCallRecord(**call) for call in raw.get("tool_calls", ()))
        raw["usage"] = Usage(**raw.get("usage", {}))
        raw["source_changes"] = tuple(
            SourceChange(**change) for change in raw.get("source_changes", ())
        )
        return cls(
            id=str(data["id"]),
            objective=str(data["objective"]),
            origin=str(data.get("origin", "handler")),
            context=str(data.get("context", "")),
            report=RecoveryReport(**raw),
            timeout=float(data["timeout"]),
            max_turns=int(data["max_turns"]),
        )


@dataclass(frozen=True, slots=True)
class FollowupResult:
    """How a follow-up ended. ``summary`` is the agent's last line or the failure reason."""

    id: str
    outcome: Literal["succeeded", "failed"]
    summary: str
    duration_ms: float

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"


def new_id() -> str:
    return "fu_" + os.urandom(6).hex()


def render_report(report: RecoveryReport, *, limit: int = 20_000) -> str:
    """The report as the text a follow-up agent reads: traceback, executed code, diagnosis."""
    lines = [
        f"Recovery {report.recovery_id} of handler {report.handler!r}: {report.outcome}"
        f" ({report.reason}).",
        f"Exception: {report.exception}",
        f"Fingerprint: {report.fingerprint}",
        "",
        "Traceback:",
        report.traceback.rstrip(),
        "",
        f"What the recovery agent executed ({len(report.tool_calls)} tool calls):",
    ]
    for number, call in enumerate(report.tool_calls, 1):
        state = "ok" if call.ok else "error"
        lines.append(f"--- {number}. {call.tool} [{state}]")
        lines.append(clip(call.code, 1_500))
        lines.append(f">>> {clip(call.result, 1_000)}")
    lines += ["", f"Diagnosis: {report.diagnosis or '(none given)'}"]
    return clip("\n".join(lines), limit)


# --------------------------------------------------------------------------- the session hook


class FollowupSession:
    """The follow-ups of one recovery; the core creates one per agent run.

    ``spawn`` is what the recovery agent calls (as a tool or from its namespace); the jobs are
    submitted by ``conclude`` once the report exists, in the recovery's owner context.
    """

    def __init__(self, settings: Settings, recovery_id: str) -> None:
        self._settings = settings
        self._recovery_id = recovery_id
        self._lock = threading.Lock()
        self._requested: list[tuple[str, str, str]] = []  # (id, objective, context)

    def spawn(self, objective: str, context: str = "") -> str:
        if not isinstance(objective, str) or not objective.strip():
            raise ValueError("spawn_followup() needs a non-empty objective string")
        with self._lock:
            if len(self._requested) >= MAX_PER_RECOVERY:
                raise RuntimeError(f"at most {MAX_PER_RECOVERY} follow-ups per recovery")
            job_id = new_id()
            self._requested.append(
                (
                    job_id,
                    clip(objective.strip(), OBJECTIVE_LIMIT),
                    clip(str(context), CONTEXT_LIMIT),
                )
            )
        return (
            f"Follow-up {job_id} queued; it starts in the background when this recovery ends "
            "and receives the recovery report. Do not wait for it."
        )

    def tools(self) -> tuple[Any, ...]:
        """Plain callables the core turns into agent tools."""

        def spawn_followup(objective: str, context: str = "") -> str:
            """Queue a background follow-up agent run that starts when this recovery ends.

            Use it for work that must not block the application: a permanent fix written as a
            patch file, a ticket with the diagnosis, an alert, a deeper investigation. It gets
            the recovery report (traceback, what you executed, your final message).

            Args:
                objective: What the follow-up must achieve, as a concrete end state.
                context: What you found that the follow-up needs, beyond the report.
            """
            return self.spawn(objective, context)

        return (spawn_followup,)

    def conclude(self, report: RecoveryReport) -> list[str]:
        """Submit the declared and requested follow-ups; returns their ids. Never raises."""
        try:
            return self._conclude(report)
        except Exception as problem:
            _log.emit("error", FAILED, recovery_id=report.recovery_id,
                      reason=f"internal error: {problem!r}")  # fmt: skip
            return []

    def _conclude(self, report: RecoveryReport) -> list[str]:
        settings = self._settings
        wanted: list[tuple[str, str, str, str]] = []
        if report.outcome != "skipped":
            wanted += [(new_id(), objective, "", "handler") for objective in settings.followups]
        with self._lock:
            wanted += [
                (i, objective, context, "agent") for i, objective, context in self._requested
            ]
            self._requested.clear()
        if not wanted:
            return []
        from .followups import resolve_runner

        runner = resolve_runner(settings.followup_runner)
        ids = []
        for job_id, objective, context, origin in wanted:
            job = FollowupJob(
                id=job_id,
                objective=objective,
                origin=origin,
                context=context,
                report=report,
                timeout=settings.followup_timeout,
                max_turns=settings.max_turns * 2,
            )
            if submit(runner, job, settings):
                ids.append(job_id)
        return ids


def _fields(job: FollowupJob) -> dict[str, Any]:
    return {
        "followup_id": job.id,
        "recovery_id": job.report.recovery_id,
        "origin": job.origin,
        "objective": clip(job.objective, 200),
    }


def submit(runner: Any, job: FollowupJob, settings: Settings) -> bool:
    """Hand ``job`` to ``runner``; False (and a ``followup.failed`` event) when it refused."""
    label = type(runner).__name__
    # Before the hand-over: an in-process job may start (and log) before ``submit`` returns.
    _log.emit("info", SUBMITTED, runner=label, **_fields(job))
    try:
        if callable(getattr(runner, "submit_job", None)):
            runner.submit_job(job)
        else:

            async def fn() -> None:
                await run_job(job, settings, label)

            runner.submit(fn, name=job.id)
    except Exception as problem:
        _log.emit("error", FAILED, runner=label, reason=f"could not submit: {problem!r}",
                  **_fields(job))  # fmt: skip
        return False
    return True


# ------------------------------------------------------------------------------- running one


async def run_job(job: FollowupJob, settings: Settings, runner: str) -> FollowupResult:
    """Run one follow-up with its events. Never raises, except cancellation (reported first)."""
    import anyio

    fields = {"runner": runner, **_fields(job)}
    _log.emit("info", STARTED, **fields)
    began = time.monotonic()
    try:
        result = await execute(job, settings)
    except anyio.get_cancelled_exc_class():
        _log.emit("warning", FAILED, reason="cancelled before it finished", cut_off=True,
                  duration_ms=_ms(began), **fields)  # fmt: skip
        raise
    except Exception as problem:
        result = FollowupResult(job.id, "failed", f"internal error: {problem!r}", _ms(began))
    if result.succeeded:
        _log.emit("info", SUCCEEDED, summary=result.summary, duration_ms=result.duration_ms,
                  **fields)  # fmt: skip
    else:
        _log.emit("warning", FAILED, reason=result.summary, duration_ms=result.duration_ms,
                  **fields)  # fmt: skip
    return result


def run_job_sync(job: FollowupJob, settings: Settings, runner: str) -> FollowupResult:
    """``run_job`` from synchronous code (a Celery worker, a subprocess)."""
    from ._bridge import loop_running_here

    if not loop_running_here():
        return asyncio.run(run_job(job, settings, runner))
    # Called from code running on an event loop: a fresh loop needs a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1, "crashoverride-followup") as pool:
        return pool.submit(asyncio.run, run_job(job, settings, runner)).result()


def _ms(began: float) -> float:
    return round((time.monotonic() - began) * 1000, 3)


async def execute(job: FollowupJob, settings: Settings) -> FollowupResult:
    """The follow-up agent run itself, on any anyio backend."""
    from . import _bridge
    from ._agent import AgentJob, AgentRun, import_sdk_async, run_agent
    from ._prompt import build_instructions
    from ._redact import Redactor
    from ._state import RunState
    from ._tools import Workspace

    began = time.monotonic()
    derived = settings.for_handler(
        {"prompt": "", "timeout": job.timeout, "max_turns": job.max_turns}
    )
    if _bridge.on_asyncio():
        # ``import agents`` takes seconds: keep it off the loop the application runs on.
        await import_sdk_async()
    state = RunState()
    redact = Redactor()
    workspace = Workspace(
        globals_={"__name__": "__crashoverride_followup__", "__builtins__": builtins},
        caller=None,
        bindings={"report": job.report, "objective": job.objective, "followup_id": job.id,
                  "give_up": state.give_up},
    )  # fmt: skip
    text = f"Follow-up {job.id}. Your objective:\n{job.objective}\n\n"
    if job.context:
        text += f"Notes from the recovery agent:\n{job.context}\n\n"
    text += "The recovery report:\n" + render_report(job.report)

    def on_tool(record: ToolCallRecord) -> None:
        _log.emit("info", TOOL_CALLED, tool=record.tool, ok=record.ok,
                  code=clip(record.code, 1_000), followup_id=job.id)  # fmt: skip

    agent_job = AgentJob(
        settings=derived,
        instructions=redact(build_instructions(FOLLOWUP_PROMPT, derived.project_prompt, "")),
        input_text=redact(text),
        workspace=workspace,
        state=state,
        check=None,
        deadline=time.monotonic() + job.timeout,
        redact=redact,
        on_tool=on_tool,
        approve=derived.approve,  # the application's approval gate covers follow-ups too
    )
    run: AgentRun | None = None
    failure: str | None
    try:
        run = await _bridge.run_async(
            lambda dispatch: run_agent(agent_job, dispatch), agent_job.deadline
        )
        failure = run.failure
    except TimeoutError:
        failure = f"timed out after {job.timeout:g}s"
    finally:
        workspace.close()
    if state.gave_up is not None:
        failure = f"the agent gave up: {state.gave_up}"
    elif state.aborted is not None:
        failure = state.aborted
    if failure is not None:
        return FollowupResult(job.id, "failed", clip(failure, 1_000), _ms(began))
    summary = run.final_output if run is not None else ""
    return FollowupResult(job.id, "succeeded", summary or "done", _ms(began))
