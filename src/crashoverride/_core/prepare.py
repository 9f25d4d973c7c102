"""Step 4 of the pipeline: the agent's namespace, instructions and input for one recovery.

Runs in the owner's thread (the failed frame's thread, with its context variables), so that the
follow-up runner in effect there is the one follow-ups go to.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from crashoverride._agent.namespace import Workspace
from crashoverride._agent.prompt import Fence, build_input, build_instructions
from crashoverride._agent.run import AgentJob
from crashoverride._core.deferred import Editor, Followups
from crashoverride._diagnose.source import show_source
from crashoverride._placement.frames import CallerLocals
from crashoverride._repair.patching import rebind_everywhere, replace_function
from crashoverride._security.text import safe_repr, summarize_locals

if TYPE_CHECKING:
    from crashoverride._core.recovery import Recovery
    from crashoverride._effects.journal import Unit

_EFFECTS_SHOWN = 50  # the unit's latest effect calls the brief lists; effects() has them all
_RESULT_SHOWN = 200  # characters of each one's result or error


def _effects_of(unit: Unit | None) -> list[dict[str, Any]]:
    return [] if unit is None else [entry.view() for entry in unit.journal.entries()]


def _effects_text(unit: Unit | None) -> str:
    """The unit's effect calls so far, a line each: ``charge order 17 -> 'ch_3Qx' (done)``."""
    lines = []
    for view in _effects_of(unit)[-_EFFECTS_SHOWN:]:
        outcome = view.get("result", view.get("error", ""))
        shown = safe_repr(outcome) if "result" in view else str(outcome)
        if len(shown) > _RESULT_SHOWN:
            shown = shown[: _RESULT_SHOWN - 3] + "..."
        state = view["state"]
        if state == "started":
            state = "started, never seen to end: it may or may not have happened"
        lines.append(
            f"{view['effect']} -> {shown} ({state})" if shown else f"{view['effect']} ({state})"
        )
    return "\n".join(lines)


# Stands for the fence id while the instructions are redacted: no secret pattern or user text
# contains a NUL character between words.
_ID_SLOT = "\x00fence-id\x00"


def prepare(rec: Recovery) -> AgentJob:
    block, exc, state, settings = rec.block, rec.exc, rec.state, rec.settings
    assert block is not None and exc is not None
    caller: Any = block.caller
    if caller is None and block.frame is not None:
        caller = CallerLocals(block.frame)
    # Follow-ups the agent asks for are submitted when the recovery concludes.
    rec.followups = Followups(settings, rec.id, rec.redact, rec.run_followup)
    rec.editor = Editor(
        allowed=settings.allow_source_changes,
        style=settings.source_changes,
        recovery_id=rec.id,
        redact=rec.redact,
        fields=rec.fields,
    )
    bindings = {
        "replace_function": replace_function,
        "rebind_everywhere": rebind_everywhere,
        "show_source": show_source,
        "persist_function": rec.editor.persist_function,
        "persist_file_edit": rec.editor.persist_file_edit,
        "error": exc,
        "effects": functools.partial(_effects_of, rec.unit),
        "give_up": state.give_up,
        "raise_instead": state.raise_instead,
        "spawn_followup": rec.followups.spawn,
        **block.bindings,
    }
    if block.returns:
        bindings["set_result"] = state.set_result
        bindings["rerun"] = state.request_rerun
    rec.workspace = Workspace(globals_=block.globals, caller=caller, bindings=bindings)
    rec.workspace.deadline = rec.deadline.at
    shown: Mapping[str, Any] = caller if caller is not None else {}
    location = "unknown"
    if block.frame is not None:
        code = block.frame.f_code
        location = f"{code.co_qualname} in {code.co_filename}:{block.frame.f_lineno}"
    fence = Fence()  # one per recovery: the instructions name its id
    redact = rec.redact
    # The instructions are the same for every recovery of a handler but for the fence's id:
    # redacted with a stand-in id, their (costly) scan is done once, not per recovery.
    instructions = redact.constant(
        build_instructions(
            settings.system_prompt,
            settings.project_prompt,
            settings.prompt,
            mode=settings.mode,
            persistence=settings.source_changes if settings.allow_source_changes else None,
            fence=Fence(_ID_SLOT),
        ),
        slots={_ID_SLOT: fence.id},
    )
    # Redacted as a whole, as it is sent: parts redacted one by one would be a plain ``str``
    # once joined, and a secret may straddle two of them.
    text = redact(
        build_input(
            fence=fence,
            exception=rec.exception_text,
            traceback_text=rec.traceback_text,
            locals_summary=summarize_locals(shown, is_secret=redact.is_secret),
            block_brief=block.brief.render(fence, redact),  # its values fenced, each redacted
            location=location,
            effects=_effects_text(rec.unit),
        )
    )
    return AgentJob(
        settings=settings,
        instructions=instructions,
        input_text=text,
        workspace=rec.workspace,
        state=state,
        check=None,  # the pipeline judges the block's evidence itself, after the run
        deadline=rec.deadline.at,
        redact=rec.redact,
        on_tool=rec.on_tool,
        tools=rec.followups.tools() if settings.mode == "repair" else (),
        mode=settings.mode,
        approve=settings.approve,
        fence=fence,
    )
