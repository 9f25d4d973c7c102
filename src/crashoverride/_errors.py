"""Exceptions raised by crashoverride itself (never in place of a user's exception)."""

from __future__ import annotations

from typing import Any


class ConfigurationError(TypeError, ValueError):
    """A CrashOverride or handler argument is invalid.

    Raised at construction time so that a misconfiguration surfaces when the application starts,
    not when the first failure happens. It derives from both ``TypeError`` and ``ValueError``
    because it reports wrong types as well as wrong values.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class EffectUncertain(Exception):
    """A replay met a declared effect that began earlier and was never seen to end.

    The effect (a charge, a mail) may or may not have happened: the process was killed, or the
    call was interrupted, before it returned. Without a ``probe`` to ask the outside world,
    crashoverride will not risk doing it twice: the replay fails with this instead, and the
    agent (who sees it) reconciles through its tools or gives up.
    """

    def __init__(self, effect: str, unit: str | None = None, *, kept: bool = True) -> None:
        where = f" in unit {unit!r}" if unit is not None else ""
        if kept:
            why = "began in an earlier attempt and was never seen to end"
        else:  # see ``Journal.incomplete``
            why = "is not in the journal, which lost some of the block's calls (too many)"
        super().__init__(
            f"the effect {effect!r}{where} {why}: it may have happened; declare a probe= to "
            "ask, or reconcile it by hand"
        )
        self.effect = effect
        self.unit = unit
        self.kept = kept

    def __reduce__(self) -> tuple[Any, ...]:  # the same error in the process that unpickles it
        return (_effect_uncertain, (self.effect, self.unit, self.kept), self.__dict__)


def _effect_uncertain(effect: str, unit: str | None, kept: bool) -> EffectUncertain:
    return EffectUncertain(effect, unit, kept=kept)
