"""Failures after ``http.response.start``: a background task's, and (opt-in) a stream's.

Imported only once such a failure happened, so nothing here is on the happy path.

Background tasks. Starlette (and FastAPI, whose ``BackgroundTasks`` subclasses Starlette's) runs
a response's ``background`` after the end of its content (its last body message, or the file
sent by path: ``_exchange.ends_response``): ``Response.__call__`` awaits it, a
``BackgroundTasks`` awaits its tasks one after another, a ``BackgroundTask`` awaits its
``func`` (or runs it in the thread pool). A task that raises ends that loop: the rest never run,
and the exception leaves the app through this middleware. A pure ASGI middleware never sees the
``Response`` object, so the failed task is found where Python keeps it: the exception's
traceback still holds every frame it passed, and each ``__call__`` frame on its way whose
``self`` is a Starlette ``BackgroundTask`` is one link of the chain response → group(s) → task.
This relies only on Starlette's public classes and their public attributes (``tasks``,
``func``, ``args``, ``kwargs``), not on local variable names or code objects, so FastAPI's
instrumented ``BackgroundTasks.__call__`` and user subclasses are found the same way. The tasks
still to run are, for each group of the chain from the innermost out, the ones after the link
it was awaiting. Should the chain be ambiguous (the same task object queued twice in one
group), nothing is assumed: the failure is logged as skipped, as before.

Streams. A response that started cannot be answered again; with ``repair_after_start`` the
agent repairs the code so later requests work (``StreamRepair``), and the exception still
propagates, as it would have.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from crashoverride import Handler, integration
from crashoverride.integrations.asgi._block import DECLARED_NOTE, SAFE_METHODS, RequestRecovery
from crashoverride.integrations.asgi._exchange import CapturedResponse, cancel_pending, replay

# Names listed in a brief, an event or a note: a response may queue any number of tasks.
_MAX_NAMES = 20

# The briefs' parts are fixed here; what the request and the queue brought (the method and
# path, the task's name, the names queued after it) are values, fenced.
BACKGROUND_BRIEF = """\
This is the background task shown above (`task`), queued by the response to the request shown
above (`request`) and run by Starlette after that response was sent: the client already has its
whole answer, and nothing you do changes it. `function` is the queued callable, `args` and
`kwargs` its arguments. The call has ended; its locals are readable through `caller`."""
RAN_ON_LOOP = "It ran on the event loop."
RAN_IN_THREAD = "It ran in the thread pool."
QUEUED_AFTER = (
    "The tasks shown above (`queued_after`) were queued after it, and run in order only once it "
    "is recovered."
)
NOTHING_AFTER = "No other background task is queued after it."
BACKGROUND_FINISH = """\
The failed attempt may have done part of its work (a message sent, a row written): check before
running it again, and never do a non-idempotent effect twice. Finish in one of two ways:
- after repairing the code, `rerun()`: the queued callable is called once more, with the same
  arguments, when you finish. It is the very object that was queued: repair what it calls, or
  swap its own code with replace_function(function, ...); rebinding its name in its module does
  not change what runs.
- `set_result(None)` if you did its work yourself and verified it.
If neither is right, call give_up(reason): the exception is then raised as it would have been
without crashoverride."""
DROPPED = "If you give up, the tasks queued after it are dropped."

STREAM_BRIEF = """\
This block is the HTTP request shown above (`request`) in an ASGI application. It raised AFTER
its response had already started: part of it is with the client, the rest can never be sent, and
the client sees it cut short whatever you do. Your job is the code, so that later requests work.
`request` describes it (method, path, query, headers with secrets masked, body, json())."""
STREAM_SAFE = "Its method is a safe one: replaying it has no side effects to fear."
STREAM_UNSAFE = (
    "Its method is not a safe one: a replay performs its side effects again. Check what the "
    f"failed attempt already did first. {DECLARED_NOTE}"
)
STREAM_FINISH = """\
Postcondition: the code is repaired, and a replay shows it: after patching the failing function
in its module (e.g. with a `global` statement or setattr on the module), `r = await
replay_request()` runs the request again through the application and captures its response,
never sent (r.status, r.headers, r.text, r.json()). A complete replay with a status below 500
is the evidence. If you cannot repair it, call give_up(reason)."""

NOT_VERIFIED = (
    "no evidence of repair: `await replay_request()` after repairing the code, and get a "
    "complete response with a status below 500"
)


# -- background tasks -------------------------------------------------------------------------


class Queued:
    """A failed background task and the tasks queued after it (in the order they would run)."""

    __slots__ = ("after", "task")

    def __init__(self, task: Any, after: list[Any]) -> None:
        self.task = task
        self.after = after


def locate(exc: BaseException) -> Queued | None:
    """The Starlette background task ``exc`` was raised in, from its traceback; None if it was
    not raised in one (or Starlette's background module was never loaded)."""
    module = sys.modules.get("starlette.background")
    if module is None:
        return None
    single, group = module.BackgroundTask, module.BackgroundTasks
    chain: list[Any] = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        # Cheap tests first: only a method named __call__ can be a link; f_locals copies.
        if code.co_name == "__call__" and code.co_argcount and code.co_varnames[0] == "self":
            owner = tb.tb_frame.f_locals.get("self")
            # A subclass's __call__ delegating to super() shows the same object twice.
            if isinstance(owner, single) and not (chain and chain[-1] is owner):
                chain.append(owner)
                if not isinstance(owner, group):
                    break  # the leaf: the queued callable's own task
        tb = tb.tb_next
    if not chain or isinstance(chain[-1], group):
        return None
    after: list[Any] = []
    # Innermost group first: its remaining tasks run before those of the group around it.
    for outer, inner in reversed(list(itertools.pairwise(chain))):
        tasks = getattr(outer, "tasks", None)
        if not isinstance(tasks, list):
            return None
        positions = [i for i, task in enumerate(tasks) if task is inner]
        if len(positions) != 1:
            return None  # queued twice, or not at all: which one failed is unknowable
        after.extend(tasks[positions[0] + 1 :])
    return Queued(chain[-1], after)


def task_names(tasks: list[Any]) -> list[str]:
    """The queued callables' names, groups flattened (never their arguments: data, secrets)."""
    names: list[str] = []
    pending = deque(tasks)
    while pending and len(names) < _MAX_NAMES:
        task = pending.popleft()
        inner = getattr(task, "tasks", None)
        if isinstance(inner, list):
            pending.extendleft(reversed(inner))
        else:
            names.append(_callable_name(getattr(task, "func", task)))
    return names


def _callable_name(func: Any) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__qualname__", None)
    return name if isinstance(name, str) else type(func).__qualname__


class BackgroundRecovery:
    """Recovers the failed background tasks of one response, and runs the ones after them."""

    def __init__(self, handler: Handler, fields: dict[str, Any]) -> None:
        self.handler = handler
        self.fields = fields

    async def recover(self, exc: BaseException, queued: Queued) -> bool | BaseException:
        """Whether the task is recovered (the tasks after it may run), or the exception the
        agent raises instead (``raise_instead``). An interrupt or a cancellation propagates."""
        build = functools.partial(self._block, queued, exc)
        try:
            outcome = await integration.arecover(self.handler, exc, build)
        finally:
            del build  # it holds ``exc``, whose traceback holds the failed frames
        try:
            recovered = integration.settle(self.handler, outcome, exc)
        except Exception as replacement:  # chained to ``exc`` already
            return replacement
        if not recovered and queued.after:
            names = ", ".join(task_names(queued.after))
            integration.note(exc, f"crashoverride: the background tasks queued after it did not "
                             f"run: {names}")  # fmt: skip
        return recovered

    async def run(self, tasks: list[Any]) -> None:
        """Run ``tasks`` in order, as Starlette would have; a failure is recovered the same way,
        and one not recovered propagates (the rest do not run)."""
        pending = deque(tasks)
        while pending:
            task = pending.popleft()
            try:
                await task()
            except Exception as exc:
                if not integration.catches(self.handler, exc) or cancel_pending():
                    raise
                try:
                    queued = locate(exc)
                except Exception:  # never replaces the application's exception
                    queued = None
                if queued is None:
                    raise
                queued.after.extend(pending)
                recovered = await self.recover(exc, queued)
                if isinstance(recovered, BaseException):
                    raise recovered from exc
                if not recovered:
                    raise
                pending = deque(queued.after)

    def _block(self, queued: Queued, exc: BaseException) -> integration.Block:
        task = queued.task
        func, args, kwargs = task.func, tuple(task.args), dict(task.kwargs)
        is_async = getattr(task, "is_async", None)
        if not isinstance(is_async, bool):
            is_async = inspect.iscoroutinefunction(func)
        while isinstance(func, functools.partial):
            # The same call, unwrapped: the agent then works in the function's own module,
            # with its frame and locals, not in a partial's caller's.
            args, kwargs = (*func.args, *args), {**func.keywords, **kwargs}
            func = func.func
        name = _callable_name(func)
        after = task_names(queued.after)
        fields = {**self.fields, "background_task": name, "remaining_tasks": after}
        block = integration.call_block(
            func, args, kwargs, exc, kind="task", fields=fields,
            brief=_background_brief(name, after, is_async, self.fields),
        )  # fmt: skip
        if not is_async:
            # Starlette runs a sync background function in the thread pool; so does the re-run
            # (and a single-flight waiter's): never on the event loop, which it would block.
            threaded = integration.call_block(
                functools.partial(_in_thread, func), args, kwargs, exc, fields=fields
            )
            block.check, block.replay = threaded.check, threaded.replay
        return block


def _background_brief(
    name: str, after: list[str], is_async: bool, fields: dict[str, Any]
) -> integration.Brief:
    return integration.Brief(
        BACKGROUND_BRIEF,
        RAN_ON_LOOP if is_async else RAN_IN_THREAD,
        QUEUED_AFTER if after else NOTHING_AFTER,
        BACKGROUND_FINISH,
        DROPPED if after else "",
        task=name,
        request=f"{fields.get('method', '')} {fields.get('path', '')}",
        **({"queued_after": ", ".join(after)} if after else {}),
    )


async def _nothing() -> None:
    return None


async def _in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


# -- streams ----------------------------------------------------------------------------------


class StreamRepair(RequestRecovery):
    """A request whose response had started: a repair-only recovery (``repair_after_start``).

    The same request tools, but there is no answer to produce: ``respond`` is refused, and the
    evidence is a replay through the repaired app (never sent), not a response to send.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.block.repair_only = True
        # Single-flight: a concurrent repair of this failure succeeded; nothing to redo.
        self.block.replay = _nothing

    async def replay_request(self) -> CapturedResponse:
        response = await replay(self.app, self.exchange)
        if response.status < 500:
            self.response = response
        return response

    def respond(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError(
            "the response had already started: no other response can be sent; repair the code "
            "and verify it with `await replay_request()`"
        )

    def check(self, state: Any) -> bool | str:
        if self.response is None:
            return NOT_VERIFIED
        state.verified_by = "replay_request"  # only a replay below 500 sets a response here
        return True

    def brief(self) -> integration.Brief:
        info = self.info
        return integration.Brief(
            STREAM_BRIEF,
            STREAM_SAFE if info.method in SAFE_METHODS else STREAM_UNSAFE,
            STREAM_FINISH,
            request=f"{info.method} {info.target}",
        )
