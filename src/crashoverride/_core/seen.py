"""The mark an exception carries once a recovery of a ``CrashOverride`` has dealt with it.

Outer handlers of the same ``CrashOverride`` let a marked exception pass: one exception, at most
one recovery and one note (a recursive function protected at every level, say). Light: the
handler imports it on its failure path.
"""

from __future__ import annotations

_SEEN = "__crashoverride_recovered_by__"


def seen(exc: BaseException, app: object) -> bool:
    """Whether a recovery of the ``CrashOverride`` ``app`` already dealt with ``exc``."""
    return getattr(exc, _SEEN, None) is app


def mark(exc: BaseException, app: object) -> None:
    try:
        setattr(exc, _SEEN, app)
    except Exception:  # an exception type without a __dict__: outer handlers may retry it
        pass
