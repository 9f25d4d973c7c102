"""One recovery, from a caught exception to a decision: suppress, re-raise, or raise instead.

Integrations describe the protected block with a ``Block`` (what it is, extra names for the
agent, what "recovered" means there, how to replay it) and call ``recover_sync`` or
``recover_async``. Neither ever raises for a failure of its own: the user's exception wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import _log
from ._block import Block
from ._limits import Flight, Limits
from ._redact import Redactor
from ._report import RecoveryReport, ToolCallRecord, Usage
from ._settings import Settings
from ._state import RunState
from ._text import clip, describe_exception, format_traceback, summarize_locals


class Decision:
    """The outcome the integration acts on."""

    __slots__ = ("replacement", "replayed", "report", "state", "suppress", "value")

    def __init__(self, report: RecoveryReport, *, suppress: bool) -> None:
        self.report = report
        self.suppress = suppress
        self.replacement: BaseException | None = None
        self.replayed = False
        self.value: Any = None
        self.state: RunState | None = None


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
    """Shared bookkeeping of the sync and async flows (see ``_flow``)."""

    def __init__(self, settings: Settings, limits: Limits, exc: BaseException, block: Block):
        self.settings = settings
        self.limits = limits
        self.exc: BaseException | None = exc
        self.block: Block | None = block
        self.id = "rec_" + os.urandom(6).hex()
        self.fingerprint = fingerprint(exc)
        self.started_at = time.time()
        self.t0 = time.monotonic()
        self.waited = 0.0
        self.state = RunState()
        policy = settings.redaction
        found = _secret_values(block, Redactor((), policy).is_secret)
        self.redact = Redactor([*found, *block.secrets], policy)
        self.exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.exception_text = self.redact(describe_exception(exc))
        self.traceback_text = self.redact(format_traceback(exc))
        self.handler = settings.name or block.kind
        self.flight: Flight | None = None
        self.leading = False
        self.slot: Any = None
        self.workspace: Any = None
        self.editor: Any = None
        self.followups: Any = None

    # -- events ----------------------------------------------------------------------------

    def fields(self) -> dict[str, Any]:
        block_fields = self.block.fields if self.block is not None else {}
        return {
            "recovery_id": self.id,
            "fingerprint": self.fingerprint,
            "exc_type": self.exc_type,
            "handler": self.handler,
            "model": self.settings.model_label,
            **block_fields,
        }

    def on_tool(self, record: ToolCallRecord) -> None:
        _log.emit(
            "info", _log.TOOL_CALLED, tool=record.tool, code=clip(record.code, 1_000),
            ok=record.ok, approved_by=record.approved_by, duration_ms=record.duration_ms,
            **self.fields(),
        )  # fmt: skip

    # -- phases ----------------------------------------------------------------------------

    def admission(self) -> str | None:
        """A reason to skip this recovery without calling the model, or None."""
        left = self.limits.breaker.check(self.fingerprint)
        if left is not None:
            return f"circuit breaker open for this failure ({left:.0f}s of cool-down left)"
        return None

    def join_flight(self) -> bool:
        """Join single-flight; True when this recovery leads (runs the agent)."""
        if not self.settings.single_flight:
            return True
        self.flight, self.leading = self.limits.flights.join(self.fingerprint)
        return self.leading

    def prepare(self) -> Any:
        """Build the workspace and texts; returns the AgentJob (runs in the owner thread)."""
        from ._agent import AgentJob
        from ._followup import FollowupSession
        from ._frames import CallerLocals
        from ._patching import rebind_everywhere, replace_function, show_source
        from ._persist import SourceEditor
        from ._prompt import build_input, build_instructions
        from ._tools import Workspace

        block, exc, state = self.block, self.exc, self.state
        assert block is not None and exc is not None
        caller: Any = block.caller
        if caller is None and block.frame is not None:
            caller = CallerLocals(block.frame)
        # Follow-ups the agent asks for are submitted when the recovery concludes.
        self.followups = FollowupSession(self.settings, self.id)
        self.editor = SourceEditor(
            allowed=self.settings.allow_source_changes,
            style=self.settings.source_changes,
            recovery_id=self.id,
            redact=self.redact,
            fields=self.fields,
        )
        bindings = {
            "replace_function": replace_function,
            "rebind_everywhere": rebind_everywhere,
            "show_source": show_source,
            "persist_function": self.editor.persist_function,
            "persist_file_edit": self.editor.persist_file_edit,
            "error": exc,
            "give_up": state.give_up,
            "raise_instead": state.raise_instead,
            "spawn_followup": self.followups.spawn,
            **block.bindings,
        }
        if block.returns:
            bindings["set_result"] = state.set_result
            bindings["rerun"] = state.request_rerun
        self.workspace = Workspace(globals_=block.globals, caller=caller, bindings=bindings)
        shown: Mapping[str, Any] = caller if caller is not None else {}
        location = "unknown"
        if block.frame is not None:
            code = block.frame.f_code
            location = f"{code.co_qualname} in {code.co_filename}:{block.frame.f_lineno}"
        settings = self.settings
        check = block.check
        deadline = time.monotonic() + settings.timeout
        self.workspace.deadline = deadline
        return AgentJob(
            settings=settings,
            instructions=self.redact(
                build_instructions(
                    settings.system_prompt,
                    settings.project_prompt,
                    settings.prompt,
                    mode=settings.mode,
                    persistence=settings.source_changes if settings.allow_source_changes else None,
                )
            ),
            input_text=self.redact(
                build_input(
                    exception=self.exception_text,
                    traceback_text=self.traceback_text,
                    locals_summary=summarize_locals(shown, is_secret=self.redact.is_secret),
                    block_brief=block.brief,
                    location=location,
                )
            ),
            workspace=self.workspace,
            state=state,
            check=(lambda: _checked(check, state)) if check is not None else None,
            deadline=deadline,
            redact=self.redact,
            on_tool=self.on_tool,
            tools=self.followups.tools() if settings.mode == "repair" else (),
            mode=settings.mode,
            approve=settings.approve,
        )

    def started(self, placement: str) -> None:
        _log.emit("info", _log.STARTED, placement=placement, **self.fields())

    # -- conclusions -----------------------------------------------------------------------

    def _report(self, outcome: str, reason: str, via: str, run: Any = None) -> RecoveryReport:
        state = self.state
        return RecoveryReport(
            recovery_id=self.id,
            handler=self.handler,
            fingerprint=self.fingerprint,
            exc_type=self.exc_type,
            exception=self.exception_text,
            traceback=self.traceback_text,
            outcome=outcome,  # type: ignore[arg-type]
            reason=self.redact(reason),
            via=via,
            model=self.settings.model_label,
            diagnosis=self.redact(
                state.gave_up or (run.final_output if run is not None else "") or ""
            ),
            tool_calls=tuple(state.records),
            usage=run.usage if run is not None else Usage(),
            turns=run.turns if run is not None else 0,
            started_at=self.started_at,
            duration_ms=round((time.monotonic() - self.t0) * 1000, 3),
            waited_ms=round(self.waited * 1000, 3),
            mode=self.settings.mode,
            source_changes=tuple(self.editor.changes) if self.editor is not None else (),
        )  # fmt: skip

    def skipped(self, reason: str) -> Decision:
        report = self._report("skipped", reason, "none")
        _log.emit("warning", _log.SKIPPED, reason=reason, **self.fields())
        return self._finish(Decision(report, suppress=False))

    def replayed(self, value: Any) -> Decision:
        report = self._report("recovered", "replayed after a concurrent recovery", "replay")
        _log.emit("info", _log.SUCCEEDED, via="replay", duration_ms=report.duration_ms,
                  **self.fields())  # fmt: skip
        decision = Decision(report, suppress=True)
        decision.replayed, decision.value = True, value
        return self._finish(decision)

    def concluded(self, run: Any, failure: str | None) -> Decision:
        state = self.state
        if failure is None:
            failure = run.failure if run is not None else "the agent did not run"
        if state.replacement is not None:
            failure = f"the agent raised {type(state.replacement).__name__} instead"
        elif state.aborted is not None:
            failure = state.aborted
        elif state.gave_up is not None:
            failure = f"the agent gave up: {state.gave_up}"
        elif self.settings.mode == "diagnose":
            # Diagnose mode never suppresses: the diagnosis travels with the original exception.
            diagnosis = run.final_output if run is not None and run.final_output else "(none)"
            failure = failure or f"diagnose mode; diagnosis: {clip(diagnosis, 1_000)}"
        recovered = failure is None
        self.limits.breaker.record(self.fingerprint, recovered)
        if recovered:
            report = self._report(
                "recovered", "the agent finished and the checks hold", "agent", run
            )
        else:
            report = self._report("failed", failure or "", "agent", run)
        _log.emit(
            "info" if recovered else "warning",
            _log.SUCCEEDED if recovered else _log.FAILED,
            reason=report.reason, turns=report.turns, tool_calls=len(report.tool_calls),
            input_tokens=report.usage.input_tokens, output_tokens=report.usage.output_tokens,
            duration_ms=report.duration_ms, **self.fields(),
        )  # fmt: skip
        decision = Decision(report, suppress=recovered)
        decision.replacement = state.replacement
        decision.state = state
        return self._finish(decision)

    def _finish(self, decision: Decision) -> Decision:
        if self.flight is not None and self.leading:
            self.limits.flights.land(self.flight, decision.suppress)
            self.flight = None
        if self.slot is not None:
            self.limits.slots.release()
            self.slot = None
        report = decision.report
        if not decision.suppress and self.exc is not None:
            _add_note(
                self.exc, f"crashoverride: recovery {self.id} {report.outcome}: {report.reason}"
            )
        callback = self.settings.on_recovery
        if callback is not None:
            try:
                callback(report)
            except Exception as exc:
                _log.emit("error", _log.CALLBACK_FAILED, error=repr(exc), **self.fields())
        if self.followups is not None:
            self.followups.conclude(report)  # never raises; submits in the owner's context
            self.followups = None
        self.release()
        return decision

    def abandon(self) -> None:
        """Hand on the flight and slot of a recovery that ended without a decision."""
        if self.flight is not None and self.leading:
            self.limits.flights.land(self.flight, False)
            self.flight = None
        if self.slot is not None:
            self.limits.slots.release()
            self.slot = None
        self.release()

    def release(self) -> None:
        """Drop frames, tracebacks and the exception: a server must not leak per recovery."""
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None
        self.exc = None
        self.block = None


def _secret_values(block: Block, is_secret_name: Callable[[str], bool]) -> list[str]:
    """String values bound to secret-looking names in the protected frame (to mask anywhere)."""
    found: list[str] = []
    for names in (block.caller, block.frame.f_locals if block.frame is not None else None):
        if names is None:
            continue
        try:
            found.extend(v for k, v in names.items() if isinstance(v, str) and is_secret_name(k))
        except Exception:  # an exotic mapping must not stop the recovery
            continue
    return found


def _checked(check: Callable[[RunState], Any], state: RunState) -> Any:
    try:
        verdict = check(state)
    except Exception as exc:
        return f"the postcondition raised {type(exc).__name__}: {clip(str(exc), 300)}"
    if hasattr(verdict, "__await__"):
        return _await_checked(verdict)
    return _verdict(verdict)


async def _await_checked(awaitable: Any) -> Any:
    try:
        return _verdict(await awaitable)
    except Exception as exc:
        return f"the postcondition raised {type(exc).__name__}: {clip(str(exc), 300)}"


def _verdict(value: Any) -> Any:
    if value is None or value is True:
        return None
    if isinstance(value, str):
        return value
    return None if value else "the postcondition does not hold"


def _add_note(exc: BaseException, note: str) -> None:
    try:
        exc.add_note(note)
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass


def internal_failure(exc: BaseException, problem: Exception) -> None:
    """A bug in crashoverride: say so on the user's exception, which then propagates."""
    _add_note(exc, f"crashoverride: recovery not attempted, internal error: {problem!r}")
    _log.emit("error", _log.FAILED, reason=f"internal error: {problem!r}",
              exc_type=type(exc).__qualname__)  # fmt: skip
