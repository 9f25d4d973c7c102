"""Recipes: the state repair of a recovered ``with`` block, replayed on the next occurrence.

For a ``with`` block the code fix is not enough: the failed block's locals must be repaired too,
and no "re-run" exists. A recovery's successful ``exec_python`` snippets (in order) are its
recipe. When the same failure happens again (here, or in another process that received the
recipe in a fix record), the snippets run first in the new frame's namespace, as agent code,
with no model call; this counts as recovered only if the handler's ``postcondition`` then holds.
Otherwise (no postcondition, a snippet fails, the postcondition does not hold) the agent runs as
usual, with the code already fixed.

Recipes are code: in memory they stay in this process; across processes they travel only in
signed fix records (``_repair.journal``). Code cannot be redacted without breaking it, so a recipe
in which the recovery's redactor finds a secret (a provider key, a value it knows as secret) is
private: it serves this process, which held the secret already, and is never published (its
fix record carries the code fix without it, and ``fleet.recipe_withheld`` says why). Publishing
it would copy the secret into Redis and into every process of the fleet.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from inspect import isawaitable
from typing import TYPE_CHECKING, Any, Final

from crashoverride._observe import events
from crashoverride._security.redact import clip, scanned
from crashoverride._security.verdict import reason

if TYPE_CHECKING:
    from crashoverride._core.recovery import Recovery
    from crashoverride._placement.bridge import Dispatch, Job

_MAX_RECIPES: Final = 256
_MAX_SNIPPETS: Final = 20


class Recipe:
    __slots__ = ("snippets", "turns")

    def __init__(self, snippets: tuple[str, ...], turns: int) -> None:
        self.snippets = snippets
        self.turns = turns  # model calls the recovery that made it took (saved by a replay)


class Recipes:
    """One ``CrashOverride``'s recipes by fingerprint: bounded, least recently used forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recipes: OrderedDict[str, Recipe] = OrderedDict()

    def get(self, fingerprint: str) -> Recipe | None:
        with self._lock:
            recipe = self._recipes.get(fingerprint)
            if recipe is not None:
                self._recipes.move_to_end(fingerprint)
            return recipe

    def save(self, fingerprint: str, recipe: Recipe) -> None:
        if not recipe.snippets or len(recipe.snippets) > _MAX_SNIPPETS:
            return
        with self._lock:
            self._recipes[fingerprint] = recipe
            self._recipes.move_to_end(fingerprint)
            while len(self._recipes) > _MAX_RECIPES:
                self._recipes.popitem(last=False)

    def conclude(self, recovery_id: str, fingerprint: str, recovered: bool, turns: int) -> None:
        """A recovery concluded: keep the recipe it made if it recovered (before its waiters
        are woken, so they find it)."""
        collected = take(recovery_id)
        if recovered and collected is not None and collected.snippets:
            private = collected.private()
            if private:  # kept here all the same: this process held the secret already
                _remember_private(collected.snippets, private)
            self.save(fingerprint, Recipe(tuple(collected.snippets), turns))

    def forget(self, fingerprint: str) -> None:
        with self._lock:
            self._recipes.pop(fingerprint, None)


def applies(rec: Recovery) -> bool:
    """Recipes are for blocks with no re-run of their own, judged by a postcondition, in a mode
    that lets agent code change the process (the gate would refuse the replay in any other:
    not trying keeps the recipe for the handlers that may use it)."""
    from crashoverride._security.gate import changes_allowed

    block = rec.block
    if block is None or block.replay is not None or rec.settings.postcondition is None:
        return False
    return changes_allowed(rec.settings.mode)


class _Collected:
    """One running recovery's snippets so far, and what judges whether they may travel."""

    __slots__ = ("_private", "fingerprint", "redact", "snippets")

    def __init__(self, redact: Callable[[str], str], fingerprint: str) -> None:
        # The recovery's redactor only (no reference to the recovery: it holds the frame).
        self.redact = redact
        self.fingerprint = fingerprint
        self.snippets: list[str] = []
        self._private: str | None = None  # judged once, when first asked

    def private(self) -> str:
        """Why these snippets must stay in this process ("": they may be published)."""
        if self._private is None:
            self._private = _secret_in(self.snippets, self.redact)
        return self._private


def _secret_in(snippets: list[str] | tuple[str, ...], redact: Callable[[str], str]) -> str:
    # The redactor masks what it knows (values found in the frame, the environment, the
    # application's Redaction) and what it recognises (provider keys, credentials): anything it
    # would change is a secret the snippet holds.
    for number, snippet in enumerate(snippets, 1):
        if redact(snippet) != snippet:
            return (
                f"state-repair snippet {number} of the recipe holds a secret (found by the "
                "recovery's redactor): the recipe serves this process only, and is not "
                "published (code cannot be redacted without breaking it)"
            )
    return ""


_lock = threading.Lock()
_pending: OrderedDict[str, _Collected] = OrderedDict()  # recovery id -> its snippets so far
# Digests of the private recipes made here (bounded): ``withheld`` knows them by content.
_private: OrderedDict[str, str] = OrderedDict()
_told: OrderedDict[str, None] = OrderedDict()  # recoveries whose withheld recipe was reported


def record(rec: Recovery) -> None:
    """Collect the agent's ``exec_python`` snippets that run without error, in order."""
    workspace = rec.workspace
    execute = workspace.execute
    collected = _Collected(rec.redact, rec.fingerprint)
    snippets = collected.snippets
    with _lock:
        _pending[rec.id] = collected
        while len(_pending) > _MAX_RECIPES:
            _pending.popitem(last=False)

    def recorded(statements: str) -> Any:
        value = execute(statements)
        if isawaitable(value):
            return _recorded_async(value, statements, snippets)
        snippets.append(statements)
        return value

    workspace.execute = recorded


def pending(recovery_id: str) -> bool:
    """Whether the running recovery has a recipe so far that may be published (its report
    names the fix record); one that may not is reported withheld here."""
    with _lock:
        collected = _pending.get(recovery_id)
    if collected is None or not collected.snippets:
        return False
    private = collected.private()
    if private:
        told(recovery_id, collected.fingerprint, private)
    return not private


def take(recovery_id: str) -> _Collected | None:
    with _lock:
        return _pending.pop(recovery_id, None)


def _digest(snippets: tuple[str, ...] | list[str]) -> str:
    import hashlib  # here: loading OpenSSL is a cost a failure refused at admission never needs

    return hashlib.sha256("\0".join(snippets).encode("utf-8", "surrogatepass")).hexdigest()


def _remember_private(snippets: list[str], reason: str) -> None:
    with _lock:
        _private[_digest(snippets)] = reason
        while len(_private) > _MAX_RECIPES:
            _private.popitem(last=False)


def withheld(snippets: tuple[str, ...]) -> str:
    """Why a recipe about to be published must not be ("": it may): a private recipe made
    here, or any recipe with a secret recognisable by its value (whoever made it)."""
    with _lock:
        reason = _private.get(_digest(snippets), "")
    if reason:
        return reason
    from crashoverride._security.redact import Redactor

    # No recovery's known values here: the rules every redactor applies, and this process's
    # secret-named environment variables.
    return _secret_in(snippets, Redactor())


def told(recovery_id: str, fingerprint: str, reason: str) -> None:
    """Say once per recovery that its recipe is kept out of its fix record, and why."""
    with _lock:
        if recovery_id in _told:
            return
        _told[recovery_id] = None
        while len(_told) > _MAX_RECIPES:
            _told.popitem(last=False)
    events.emit("warning", events.RECIPE_WITHHELD, reason=scanned(reason),
              recovery_id=scanned(recovery_id), fingerprint=scanned(fingerprint))  # fmt: skip


async def _recorded_async(value: Any, statements: str, snippets: list[str]) -> Any:
    result = await value
    snippets.append(statements)
    return result


async def replay(rec: Recovery, recipe: Recipe, agent_call: Dispatch, judge: Job) -> bool:
    """Run ``recipe`` as agent code of ``rec``, then ``judge`` (the block's check, in the owner's
    context, judged: True when it holds); whether the block is recovered.

    Each snippet passes the gate as the ``exec_python`` call it was (``source == "recipe"``):
    ``approve=`` sees it before it runs on this frame, and it is a line of this recovery's
    ``report.tool_calls``. A snippet that is denied or fails ends the replay.
    """
    from crashoverride._security.audit import ApprovalRequest
    from crashoverride._security.gate import run_agent_code

    workspace = rec.workspace
    owner = rec.code_owner(agent_call)
    for snippet in recipe.snippets:
        raised: list[Exception] = []
        call = ApprovalRequest(snippet, tool="exec_python", arguments={"statements": snippet},
                               source="recipe", is_code=True)  # fmt: skip
        execute = functools.partial(_execute, workspace, agent_call, snippet, raised)
        ran = await run_agent_code(owner, call, execute)
        if not ran.ok:
            why = repr(raised[0]) if raised else ran.approved_by
            events.emit("info", events.RECIPE_FAILED, error=clip(rec.redact(why), 300),
                      **rec.fields())  # fmt: skip
            return False
    workspace.take_output()
    return reason(await agent_call(judge)) is None


async def _execute(
    workspace: Any, agent_call: Dispatch, snippet: str, raised: list[Exception]
) -> tuple[str, bool]:
    from crashoverride._security.text import describe_result, format_tool_error

    try:
        value = await agent_call(functools.partial(workspace.execute, snippet))
    except Exception as exc:
        raised.append(exc)
        return format_tool_error(exc, workspace.error), False
    return describe_result(value, workspace.take_output()), True
