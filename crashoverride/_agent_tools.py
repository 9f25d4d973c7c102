"""The agent's built-in tools, by mode, with approval and an audit record of every snippet.

``repair`` mode: ``eval_python``, ``exec_python``, ``give_up``. ``diagnose`` mode:
``inspect_python`` (read-only expressions, see ``_readonly``) and ``give_up``. With an
``approve=`` callable, every snippet is shown to it first; a denial is what the model sees.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ._bridge import Dispatch, Job
from ._report import ToolCallRecord
from ._text import clip
from ._tools import AgentExit, AgentInterrupted, describe_result, format_tool_error

if TYPE_CHECKING:
    from ._agent import AgentJob

NOT_REQUIRED = "not required (no approve= configured)"


def _approver_name(approve: Any) -> str:
    return str(getattr(approve, "__qualname__", None) or type(approve).__name__)


def _tool_failure(_: Any, error: Exception) -> str:
    # The SDK hides tool errors from the model by default; the model needs the traceback.
    return format_tool_error(error)


def agent_tools(job: AgentJob, dispatch: Dispatch) -> list[Any]:
    from agents import function_tool

    serial = asyncio.Lock()
    ws, state = job.workspace, job.state

    async def approval(code: str) -> tuple[bool, str]:
        """(allowed, who/why) for one snippet; runs ``approve`` in the owner's context."""
        approve = job.approve
        if approve is None:
            return True, NOT_REQUIRED
        name = _approver_name(approve)
        try:
            verdict = await dispatch(lambda: approve(code))
        except Exception as exc:
            return False, f"denied: {name} raised {type(exc).__name__}: {exc}"
        if isinstance(verdict, str):
            return False, f"denied by {name}: {verdict}"
        return (True, f"approved by {name}") if verdict else (False, f"denied by {name}")

    async def call(tool: str, code: str, work: Job) -> str:
        started = time.perf_counter()
        async with serial:  # one snippet at a time, in the order the model asked
            ok = False
            allowed, approved_by = await approval(code)
            if not allowed:
                text = f"Not run: {approved_by}. Do not retry the same code; adapt or give up."
            else:
                try:
                    value = await dispatch(work)
                    text, ok = describe_result(value, ws.take_output()), True
                except AgentExit as exc:
                    state.aborted = str(exc)
                    if isinstance(exc, AgentInterrupted):
                        state.interrupted = exc.interrupt
                    text = f"{exc}; the recovery is over (a recovery never exits the process)."
                except Exception as exc:
                    printed = ws.take_output()
                    error = format_tool_error(exc, ws.error)
                    text = (clip(printed, 2_000) + "\n" if printed else "") + error
        text = job.redact(text)
        record = ToolCallRecord(
            tool=tool,
            code=job.redact(clip(code, 4_000)),
            result=text,
            ok=ok,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            approved_by=approved_by,
        )
        state.records.append(record)
        job.on_tool(record)
        return text

    async def eval_python(expression: str) -> str:
        """Evaluate one Python expression in the live process and return its value.

        Args:
            expression: A Python expression; `await` is allowed.
        """
        return await call("eval_python", expression, lambda: ws.evaluate(expression))

    async def exec_python(statements: str) -> str:
        """Execute Python statements in the live process.

        Returns what they printed and the value of a trailing expression, or a traceback.

        Args:
            statements: Python statements; top-level `await` is allowed.
        """
        return await call("exec_python", statements, lambda: ws.execute(statements))

    async def inspect_python(expression: str) -> str:
        """Evaluate a read-only Python expression (no assignments, no arbitrary calls).

        Allowed calls: len, type, repr, isinstance, sorted, getattr, vars, dir, show_source and
        similar inspection functions, and read-only methods such as keys/items/get.

        Args:
            expression: A Python expression that only looks at values and source.
        """
        return await call("inspect_python", expression, lambda: ws.inspect(expression))

    def give_up(reason: str) -> str:
        """Stop the recovery: the original exception is re-raised with your reason attached.

        Args:
            reason: Why the postcondition cannot be established, in one sentence.
        """
        message = state.give_up(reason)
        record = ToolCallRecord(
            "give_up", job.redact(clip(reason, 2_000)), message, True, 0.0, "not required"
        )
        state.records.append(record)
        job.on_tool(record)
        return message

    chosen = [inspect_python] if job.mode == "diagnose" else [eval_python, exec_python]
    return [
        function_tool(tool, failure_error_function=_tool_failure) for tool in (*chosen, give_up)
    ]
