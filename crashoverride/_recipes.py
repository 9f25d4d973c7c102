"""Recipes: the state repair of a recovered ``with`` block, replayed on the next occurrence.

For a ``with`` block the code fix is not enough: the failed block's locals must be repaired too,
and no "re-run" exists. A recovery's successful ``exec_python`` snippets (in order) are its
recipe. When the same failure happens again (here, or in another process that received the
recipe in a fix record), the snippets run first in the new frame's namespace, as agent code,
with no model call; this counts as recovered only if the handler's ``postcondition`` then holds.
Otherwise (no postcondition, a snippet fails, the postcondition does not hold) the agent runs as
usual, with the code already fixed.

Recipes are code: in memory they stay in this process; across processes they travel only in
signed fix records (``_fixrecords``).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from inspect import isawaitable
from typing import TYPE_CHECKING, Any, Final

from . import _log

if TYPE_CHECKING:
    from ._bridge import Dispatch, Job
    from ._recovery import Recovery

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
        snippets = take(recovery_id)
        if recovered and snippets:
            self.save(fingerprint, Recipe(snippets, turns))

    def forget(self, fingerprint: str) -> None:
        with self._lock:
            self._recipes.pop(fingerprint, None)


def applies(rec: Recovery) -> bool:
    """Recipes are for blocks with no re-run of their own, judged by a postcondition."""
    block = rec.block
    return block is not None and block.replay is None and rec.settings.postcondition is not None


_lock = threading.Lock()
_pending: OrderedDict[str, list[str]] = OrderedDict()  # recovery id -> its snippets so far


def record(rec: Recovery) -> None:
    """Collect the agent's ``exec_python`` snippets that run without error, in order."""
    workspace = rec.workspace
    execute = workspace.execute
    snippets: list[str] = []
    with _lock:
        _pending[rec.id] = snippets
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
    """Whether the running recovery has a recipe so far (its report names the fix record)."""
    with _lock:
        return bool(_pending.get(recovery_id))


def take(recovery_id: str) -> tuple[str, ...]:
    with _lock:
        return tuple(_pending.pop(recovery_id, ()))


async def _recorded_async(value: Any, statements: str, snippets: list[str]) -> Any:
    result = await value
    snippets.append(statements)
    return result


async def replay(rec: Recovery, recipe: Recipe, agent_call: Dispatch, judge: Job) -> bool:
    """Run ``recipe`` as agent code of ``rec``, then ``judge`` (the block's check, in the owner's
    context: None when it holds); whether the block is recovered."""
    workspace = rec.workspace
    for snippet in recipe.snippets:
        try:
            await agent_call(functools.partial(workspace.execute, snippet))
        except Exception as exc:
            _log.emit("info", _log.RECIPE_FAILED, error=rec.redact(repr(exc))[:300],
                      **rec.fields())  # fmt: skip
            return False
    workspace.take_output()
    return await agent_call(judge) is None
