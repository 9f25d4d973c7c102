"""The record of one recovery: identity, redaction, events, the report and the outcome.

``_core.pipeline`` holds the algorithm and calls into this record at each step; everything here is
bookkeeping that must happen exactly once whatever path the algorithm took (a decision, a
time-out, a cancellation, an internal error): one terminal event, one note, the slot and the
flight handed on, and every reference into the failed frame dropped.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crashoverride._admission.limits import Flight, Limits
from crashoverride._agent.state import NO_RESULT, AgentRun, RunState
from crashoverride._config.settings import Settings
from crashoverride._core.block import Block
from crashoverride._effects.journal import Unit
from crashoverride._observe import events, observers
from crashoverride._observe.report import RecoveryReport, SourceChange, Usage
from crashoverride._placement.deadline import Deadline
from crashoverride._security.audit import ToolCallRecord
from crashoverride._security.notes import add_note, note_internal_error
from crashoverride._security.redact import EMPTY, Redacted, Redactor, fixed, name_rule, scanned
from crashoverride._security.text import clip, describe_exception, format_traceback

if TYPE_CHECKING:
    from crashoverride._agent.run import AgentJob
    from crashoverride._core.followup import FollowupRecord
    from crashoverride._followups.session import Run
    from crashoverride._placement.bridge import Dispatch
    from crashoverride._security.gate import Owner


class Decision:
    """The outcome an entry point acts on (public as ``crashoverride.integration.Outcome``).

    Attributes:
        report: The recovery's report (None when crashoverride failed internally).
        recovered: Execution continues after the block (the exception is suppressed).
        value: For blocks that produce a value: what the call returns.
        replacement: An exception the agent chose to raise instead (``raise_instead``).
        interrupt: A ``KeyboardInterrupt`` raised inside agent code, re-raised by ``settle``
            once the recovery has cleaned up.
    """

    __slots__ = ("interrupt", "recovered", "replacement", "report", "value")

    def __init__(self, report: RecoveryReport | None, *, recovered: bool, value: Any = None):
        self.report = report
        self.recovered = recovered
        self.value = value
        self.replacement: BaseException | None = None
        self.interrupt: BaseException | None = None

    def settle(self, exc: BaseException) -> bool:
        """Raise what must be raised instead of ``exc``; else whether to suppress it."""
        if self.interrupt is not None:
            interrupt, self.interrupt = self.interrupt, None
            # The user's exception stays reachable from the interrupt, as for any exception
            # raised while another is handled.
            interrupt.__context__ = exc
            raise interrupt
        if self.replacement is not None:
            replacement, self.replacement = self.replacement, None
            raise replacement from exc
        return self.recovered


def fingerprint(exc: BaseException) -> str:
    """Exception type plus the code location that raised it (innermost traceback entry)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    if tb is None:
        return kind
    code = tb.tb_frame.f_code
    return f"{kind}@{code.co_filename}:{tb.tb_lineno}({code.co_qualname})"


class Recovery:
    """One recovery's bookkeeping; the steps themselves are in ``_core.pipeline``."""

    def __init__(
        self,
        settings: Settings,
        limits: Limits,
        exc: BaseException,
        block: Block,
        run_followup: Run,
        began: float | None = None,
    ) -> None:
        self.settings = settings
        # How a follow-up this recovery asks for runs (``_core.followup.run_job``, handed in by
        # the composition root: the follow-up machinery sits above this record).
        self.run_followup = run_followup
        self.limits = limits
        self.exc: BaseException | None = exc
        self.block: Block | None = block
        # The unit of work the failed code ran in; the recovery's own when it ran in none.
        self.unit = block.unit if block.unit is not None else Unit()
        # When the failure entered (before any wait for the loop's lane): the budget starts
        # there, and a single flight that landed since still answers it.
        self.began = time.monotonic() if began is None else began
        self.deadline = Deadline(settings.timeout, self.began)
        self.id = "rec_" + os.urandom(6).hex()
        self.fingerprint = fingerprint(exc)
        self.started_at = time.time()
        self.t0 = time.monotonic()
        self.waited = 0.0
        self.state = RunState()
        policy = settings.redaction
        found = _secret_values(block, exc, name_rule(policy.names if policy is not None else ()))
        self.redact = Redactor.for_settings(settings, [*found, *block.secrets])
        self.exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.exception_text = self.redact(describe_exception(exc))
        self.traceback_text = self.redact(format_traceback(exc))
        self.handler = settings.name or block.kind
        self.repair_only = block.repair_only
        self.flight: Flight | None = None
        self.leading = False
        self.slot: Any = None
        self.workspace: Any = None
        self.editor: Any = None
        self.followups: Any = None
        self.running = False  # an agent run started: the breaker learns its result
        self.trial = 0  # a half-open breaker's trial this recovery holds (0: none)
        # What the coordination says of this recovery (fleet_role, fencing_token, fix_record):
        # in every event from then on, and in the report.
        self.fleet: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._decision: Decision | None = None
        # Every event's fields, and the report's names: redacted once, here.
        self._fields = self.redact.data(
            {
                "recovery_id": self.id,
                "fingerprint": self.fingerprint,
                "exc_type": self.exc_type,
                "handler": self.handler,
                "model": settings.model_label,
                **block.fields,
            }
        )
        self.occurrence = dict(block.fields)  # the report's, redacted when it is made
        self.watch = observers.start(self)  # here: the owner's context parents the span

    # -- events ----------------------------------------------------------------------------

    def fields(self) -> dict[str, Any]:
        return dict(self._fields)

    def tag(self, **fields: Any) -> None:
        """Coordination facts about this recovery, for its later events and its report."""
        self.fleet.update(fields)
        self._fields.update(self.redact.data(fields))

    def on_tool(self, record: ToolCallRecord) -> None:
        events.emit("info", events.TOOL_CALLED, **record.event_fields(), **self._fields)
        self.watch.tool(record)

    def code_owner(self, dispatch: Dispatch) -> Owner:
        """Who answers for agent code this recovery runs outside its agent's tool calls (a
        recipe, a fleet fix): its mode and approver, its audit trail, ``dispatch`` to reach it."""
        from crashoverride._security.gate import Owner

        settings = self.settings
        return Owner(mode=settings.mode, approve=settings.approve, dispatch=dispatch,
                     redact=self.redact, audit=self.on_tool, trail=self.state.records)  # fmt: skip

    def prepare(self) -> AgentJob:
        """Step 4, run in the owner's thread: the agent's namespace and texts."""
        from crashoverride._core.prepare import prepare

        return prepare(self)

    def started(self, placement: str) -> None:
        self.running = True
        events.emit("info", events.STARTED, placement=fixed(placement), **self._fields)

    # -- the report ------------------------------------------------------------------------

    def _report(
        self, outcome: str, reason: str, via: str, run: AgentRun | None = None
    ) -> RecoveryReport:
        state, redact, fields = self.state, self.redact, self._fields
        return RecoveryReport(
            recovery_id=fields["recovery_id"],
            handler=fields["handler"],
            fingerprint=fields["fingerprint"],
            exc_type=fields["exc_type"],
            exception=self.exception_text,
            traceback=self.traceback_text,
            outcome=outcome,  # type: ignore[arg-type]
            reason=redact(reason),
            via=redact(via),
            model=fields["model"],
            diagnosis=redact(
                state.gave_up or (run.final_output if run is not None else "") or ""
            ),
            tool_calls=tuple(state.records),
            usage=run.usage if run is not None else Usage(),
            turns=run.turns if run is not None else 0,
            started_at=self.started_at,
            duration_ms=round((time.monotonic() - self.t0) * 1000, 3),
            waited_ms=round(self.waited * 1000, 3),
            mode=redact(self.settings.mode),
            source_changes=self._source_changes(),
            fleet_role=fields.get("fleet_role", EMPTY),
            fencing_token=fields.get("fencing_token", 0),
            fix_record=fields.get("fix_record", EMPTY),
            occurrence=tuple((redact(str(k)), redact(str(v))) for k, v in self.occurrence.items()),
        )  # fmt: skip

    def _source_changes(self) -> tuple[SourceChange, ...]:
        """Files written or proposed, then live functions whose code agent code swapped."""
        written = tuple(self.editor.changes) if self.editor is not None else ()
        journal = sys.modules.get("crashoverride._repair.journal")
        if journal is None:  # nothing was patched: the journal was never needed
            return written
        redact = self.redact
        live = tuple(
            SourceChange(redact(name), "live", redact(diff), redact(file))
            for name, file, diff in journal.live_diffs(self.id)
        )
        return written + live

    # -- conclusions (each ends the recovery; the first one wins) ---------------------------

    def skipped(self, reason: str) -> Decision:
        return self._finish("skipped", reason, "none", None, events.SKIPPED, "warning")

    def replayed(self, value: object) -> Decision:
        reason = "replayed after a concurrent recovery"
        return self._finish("recovered", reason, "replay", None, events.SUCCEEDED, "info", value)

    def recipe_replayed(self, saved: int) -> Decision:
        """The state repair of an earlier recovery ran here and the postcondition holds."""
        self.tag(fleet_role="recipe", model_calls_saved=saved)
        reason = f"replayed an earlier recovery's recipe (saved {saved} model calls)"
        return self._finish("recovered", reason, "recipe", None, events.SUCCEEDED, "info")

    def timed_out(self, what: str = "") -> Decision:
        reason = self.deadline.message(what)
        return self._finish("failed", reason, "agent", None, events.FAILED, "warning")

    def cancelled(self, reason: str = "cancelled by the caller") -> None:
        """The caller was cancelled: one terminal event, then the cancellation propagates."""
        self.running = False  # says nothing about the failure: the breaker does not learn it
        self._finish("failed", reason, "none", None, events.CANCELLED, "warning")

    def concluded(self, run: AgentRun | None, verdict: str | None) -> Decision:
        """The agent run ended (``run``); ``verdict`` is None when the block's check held."""
        state = self.state
        failure = run.failure if run is not None else "the agent did not run"
        if state.interrupted is not None:
            failure = "agent code raised KeyboardInterrupt; it propagates"
        elif state.replacement is not None:
            failure = f"the agent raised {type(state.replacement).__name__} instead"
        elif state.aborted is not None:
            failure = state.aborted
        elif state.gave_up is not None:
            failure = f"the agent gave up: {state.gave_up}"
        elif failure is None and self.settings.mode == "diagnose":
            # Diagnose mode never suppresses: the diagnosis travels with the original exception.
            diagnosis = run.final_output if run is not None and run.final_output else "(none)"
            failure = f"diagnose mode; diagnosis: {clip(diagnosis, 1_000)}"
        elif failure is None:
            failure = verdict
        if failure is None:
            value = state.result if state.result is not NO_RESULT else None
            reason = "the agent finished and the block's evidence holds"
            return self._finish("recovered", reason, "agent", run, events.SUCCEEDED, "info", value)
        return self._finish("failed", failure, "agent", run, events.FAILED, "warning")

    def _finish(
        self,
        outcome: str,
        reason: str,
        via: str,
        run: AgentRun | None,
        event: Redacted,
        level: str,
        value: object = None,
    ) -> Decision:
        # What "recovered" means for a repair-only block: the code, not this occurrence.
        repaired = outcome == "recovered" and self.repair_only
        if repaired:
            outcome, event = "repaired", events.REPAIRED
        if self._decision is None and outcome in ("recovered", "repaired"):
            self.tag(**self.limits.coordination.report_fields(self))
        with self._lock:
            if self._decision is not None:
                return self._decision
            report = self._report(outcome, reason, via, run)
            decision = self._decision = Decision(report, recovered=outcome == "recovered")
        decision.value = value
        state = self.state
        if outcome != "recovered":
            decision.replacement = state.replacement
            decision.interrupt = state.interrupted
        succeeded = decision.recovered or repaired
        if self.running:
            turns = run.turns if run is not None else 0
            self.limits.recipes.conclude(self.id, self.fingerprint, decision.recovered, turns)
            self.limits.breaker.record(self.fingerprint, succeeded)
        elif self.trial:
            self.limits.breaker.abandon(self.fingerprint, self.trial)
        self._hand_on(succeeded)
        events.emit(
            level, event, reason=report.reason, via=report.via, turns=report.turns,
            tool_calls=len(report.tool_calls), input_tokens=report.usage.input_tokens,
            output_tokens=report.usage.output_tokens, duration_ms=report.duration_ms,
            **self._fields,
        )  # fmt: skip
        if not decision.recovered and self.exc is not None:
            note = f"crashoverride: recovery {self.id} {outcome}: {report.reason}"
            add_note(self.exc, self.redact(note))
        self.watch.finish(report, self.exc)  # after the note: the exception is as it leaves
        callback = self.settings.on_recovery
        if callback is not None:
            try:
                callback(report)
            except Exception as exc:
                events.emit("error", events.CALLBACK_FAILED, error=self.redact(repr(exc)),
                          **self._fields)  # fmt: skip
        followups, self.followups = self.followups, None
        if followups is not None:
            followups.conclude(report)  # never raises
        self.release()
        return decision

    def _hand_on(self, recovered: bool) -> None:
        """Land the flight and free the slot; safe to call more than once, from any thread."""
        with self._lock:
            flight, self.flight = (self.flight, None) if self.leading else (None, self.flight)
            slot, self.slot = self.slot, None
        if flight is not None:
            self.limits.flights.land(flight, recovered)
        if slot is not None:
            self.limits.slots.release()

    def abandon(self) -> None:
        """End a recovery that produced no decision (interrupted, cancelled, broken)."""
        if self._decision is None and self.trial:
            self.limits.breaker.abandon(self.fingerprint, self.trial)
        self.watch.finish(None, self.exc)  # a no-op after a decision
        self._hand_on(False)
        self.release()

    def release(self) -> None:
        """Drop frames, tracebacks and the exception: a server must not leak per recovery.
        Its live patches, if any, are watched from here on (``_repair.watch``)."""
        from crashoverride._repair import watch

        watch.arm(self.id, self.settings.patch_watch)
        drop_references(self)
        self.exc = None
        # The editor holds ``self.fields`` (a bound method): a cycle that left every finished
        # record to the cyclic collector. The report has copied its changes already.
        self.editor = None


def drop_references(record: Recovery | FollowupRecord) -> None:
    """What every pipeline record does at its end: close the namespace, release the block."""
    workspace, record.workspace = record.workspace, None
    if workspace is not None:
        workspace.close()
    block, record.block = record.block, None
    if block is not None:
        block.release()


def _secret_values(
    block: Block, exc: BaseException, is_secret_name: Callable[[str], bool]
) -> list[str]:
    """Values under secret-looking names in the protected frame, at any depth, and in the frames
    the exception and its chain passed through (to mask anywhere: a callee's ``password`` that
    its message quotes). Each walk has its own budget: the protected frame's comes first."""
    from crashoverride._security.masking import secret_values, traceback_locals

    roots = [block.caller, block.frame.f_locals if block.frame is not None else None]
    found = secret_values([names for names in roots if names is not None], is_secret_name)
    return found + secret_values(traceback_locals(exc, block.frame), is_secret_name)


def internal_failure(
    exc: BaseException, problem: BaseException, redact: Callable[[str], Redacted] | None = None
) -> None:
    """A bug in crashoverride: say so on the user's exception, which then propagates.

    ``redact``: the run's redactor, when there is one (its configured key, its locals)."""
    reason = note_internal_error(exc, problem, redact)
    events.emit("error", events.FAILED, reason=reason, exc_type=scanned(type(exc).__qualname__))
