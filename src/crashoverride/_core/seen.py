"""The mark an exception carries once a recovery of a ``CrashOverride`` has dealt with it.

Outer handlers of the same ``CrashOverride`` let a marked exception pass: one exception, at most
one recovery and one note (a recursive function protected at every level, say). Light: the
handler imports it on its failure path.
"""

from __future__ import annotations

from typing import Protocol

_SEEN = "__crashoverride_recovered_by__"


class Marking(Protocol):
    """A ``CrashOverride`` as the mark sees it: the string its exceptions carry. Not the instance
    itself: the exception must still pickle (process pools, Celery's result backend) and must
    not keep the instance alive."""

    @property
    def _mark(self) -> str: ...


def seen(exc: BaseException, app: Marking) -> bool:
    """Whether a recovery of the ``CrashOverride`` ``app`` already dealt with ``exc``."""
    return getattr(exc, _SEEN, None) == app._mark


def mark(exc: BaseException, app: Marking) -> None:
    try:
        setattr(exc, _SEEN, app._mark)
    except Exception:  # an exception type without a __dict__: outer handlers may retry it
        pass
