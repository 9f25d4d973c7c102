"""The Python namespace the agent's ``eval_python`` / ``exec_python`` tools execute in.

Name resolution: tool-local names (kept across calls), then the protected frame's locals, then
its globals, then builtins. Assignments stay tool-local; ``caller[...]`` writes through to the
protected frame and ``global`` statements reach module globals. Code is registered in
``linecache`` so tracebacks show it and ``inspect.getsource`` works on functions it defines.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import io
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from types import CodeType
from typing import Any

from crashoverride._agent.state import AgentExit
from crashoverride._placement.frames import CallerLocals
from crashoverride._security.gate import (
    ForgedSignal,
    compile_agent,
    forged,
    register_source,
    run_code,
)

_VALUE = "__crashoverride_value__"
_HOIST = "__crashoverride_hoist__"


def _with_hoisted_imports(body: list[ast.stmt]) -> list[ast.stmt]:
    """After each top-level import, call the hoist helper with the names it bound."""
    result: list[ast.stmt] = []
    for stmt in body:
        result.append(stmt)
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names = [
                alias.asname or alias.name.split(".")[0]
                for alias in stmt.names
                if alias.name != "*"
            ]
            call = ast.Expr(
                ast.Call(
                    func=ast.Name(_HOIST, ast.Load()),
                    args=[ast.Tuple([ast.Constant(n) for n in names], ast.Load())],
                    keywords=[],
                )
            )
            result.append(ast.copy_location(call, stmt))
    return result


class _Names(MutableMapping[str, Any]):
    """The ``locals`` mapping given to ``exec``: scratch first, then the caller's locals."""

    def __init__(self, scratch: dict[str, Any], caller: Mapping[str, Any] | None) -> None:
        self.scratch = scratch
        self.caller = caller

    def __getitem__(self, name: str) -> Any:
        try:
            return self.scratch[name]
        except KeyError:
            if self.caller is None:
                raise
            return self.caller[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.scratch[name] = value

    def __delitem__(self, name: str) -> None:
        del self.scratch[name]

    def __iter__(self) -> Iterator[str]:
        seen = dict.fromkeys(self.scratch)
        if self.caller is not None:
            seen.update(dict.fromkeys(self.caller))
        return iter(seen)

    def __len__(self) -> int:
        return len(list(iter(self)))


class Workspace:
    """One recovery's execution namespace, bound to the live protected frame."""

    def __init__(
        self,
        *,
        globals_: dict[str, Any],
        caller: CallerLocals | Mapping[str, Any] | None,
        bindings: Mapping[str, Any],
    ) -> None:
        self.globals = globals_
        self.caller = caller
        # When set (by the recovery), synchronous agent code still running at this
        # ``time.monotonic()`` deadline is interrupted (see ``_placement.watchdog``).
        self.deadline: float | None = None
        self._output = io.StringIO()
        self.scratch: dict[str, Any] = {
            "print": self._print,
            _HOIST: self._hoist,
            **bindings,
            "caller": caller,
        }
        self._names = _Names(self.scratch, caller)

    def _print(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("file") is not None:
            builtins.print(*args, **kwargs)
            return
        kwargs["file"] = self._output
        builtins.print(*args, **kwargs)

    def _hoist(self, names: tuple[str, ...]) -> None:
        # Functions the agent defines resolve globals in the module, not in the session, so
        # a module it imports is also bound there when the module has no such name yet.
        for name in names:
            if name in self.scratch and name not in self.globals:
                self.globals[name] = self.scratch[name]

    @property
    def error(self) -> BaseException | None:
        value = self.scratch.get("error")
        return value if isinstance(value, BaseException) else None

    def take_output(self) -> str:
        text = self._output.getvalue()
        self._output = io.StringIO()
        return text

    # -- compiling -------------------------------------------------------------------------

    def _compile(self, source: str, mode: str) -> CodeType:
        filename = register_source(source)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        if mode == "eval":
            return compile_agent(source, "eval", filename=filename, flags=flags)
        tree = ast.parse(source, filename, "exec")
        tree.body = _with_hoisted_imports(tree.body)
        ast.fix_missing_locations(tree)
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            # REPL-style: the value of a trailing expression is the tool's result.
            last = tree.body[-1]
            tree.body[-1] = ast.copy_location(
                ast.Assign(targets=[ast.Name(_VALUE, ast.Store())], value=last.value), last
            )
            ast.fix_missing_locations(tree)
        return compile_agent(tree, "exec", filename=filename, flags=flags)

    # -- jobs: run in the owner thread by the bridge; may return an awaitable ---------------

    def inspect(self, expression: str) -> Any:
        """Diagnose mode: evaluate ``expression`` where it cannot change this process."""
        from crashoverride._diagnose.snapshot import inspect_read_only

        return inspect_read_only(self, self._names, expression)

    def evaluate(self, expression: str) -> Any:
        code = self._compile(expression.strip(), "eval")
        return self._guard(lambda: run_code(code, self.globals, self._names), code)

    def execute(self, statements: str) -> Any:
        code = self._compile(statements, "exec")

        return self._guard(lambda: run_code(code, self.globals, self._names), code, trailing=True)

    def _guard(self, run: Callable[[], Any], code: CodeType, *, trailing: bool = False) -> Any:
        from crashoverride._placement.watchdog import STOPPED, Preempted, guarded

        try:
            value = guarded(self.deadline, run)
        except SystemExit as exc:
            raise AgentExit(f"agent code called sys.exit({exc.code!r})") from None
        except Preempted:
            raise AgentExit(STOPPED) from None
        except ForgedSignal as exc:  # ``run_code`` caught a control-flow signal agent code raised
            raise AgentExit(str(exc)) from None
        if code.co_flags & inspect.CO_COROUTINE:
            # Top-level await: ``value`` is a coroutine, awaited wherever the bridge can.
            return self._finish_async(value, trailing)
        return self.scratch.pop(_VALUE, None) if trailing else value

    async def _finish_async(self, awaitable: Any, trailing: bool) -> Any:
        from crashoverride._placement.watchdog import STOPPED, Preempted, stepped

        try:
            # Step by step: code between its awaits holds the event loop, so it is guarded too.
            value = await stepped(awaitable, self.deadline)
        except SystemExit as exc:
            raise AgentExit(f"agent code called sys.exit({exc.code!r})") from None
        except Preempted:
            raise AgentExit(STOPPED) from None
        except (Exception, KeyboardInterrupt, GeneratorExit):
            raise  # GeneratorExit: this coroutine is being closed, which only its owner does
        except BaseException as exc:
            if _runtime_cancellation(exc):
                raise  # the deadline's cancel scope, or the caller's own cancellation
            raise AgentExit(forged(exc)) from None
        return self.scratch.pop(_VALUE, None) if trailing else value

    def close(self) -> None:
        """Drop every reference into the failed frame so it can be freed."""
        if isinstance(self.caller, CallerLocals):
            self.caller.release()
        self.scratch.clear()
        self._names.caller = None
        self.caller = None


def _runtime_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation the runtime delivered, not one agent code raised."""
    import asyncio

    if isinstance(exc, asyncio.CancelledError):
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no asyncio loop here (trio): not asyncio's cancellation
            return False
        # A real cancellation is requested before it is delivered: ``cancelling()`` counts it.
        return task is not None and task.cancelling() > 0
    # trio's Cancelled has no public constructor; anything else is agent code's own.
    return type(exc).__module__.startswith("trio")
