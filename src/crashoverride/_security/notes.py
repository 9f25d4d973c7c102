"""Notes on the user's exception, and the one text for a failure of crashoverride's own.

A note travels with the user's exception into logs, error trackers and terminals, so it is
redacted like every other channel. An internal error's message may quote anything
crashoverride held (the configured key, a header, a local): every path that reports one (the
handler's, the pipeline's, an integration's, a follow-up's) builds its text here.

Everything here runs on failure paths, after something already broke: it never raises, and
it imports nothing beyond what ``import crashoverride`` loaded (the handler's own failure
path uses it, possibly where imports fail).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from crashoverride._security.redact import MASK, Redactor, RunSettings
from crashoverride._security.secrets import mask

Redact = Callable[[str], str]

_LIMIT: Final = 500


def _scan(text: str) -> str:
    return mask(text, MASK)


def internal_error(problem: BaseException, redact: Redact | None = None) -> str:
    """The reason for events and results: ``internal error: <repr of problem>``, redacted by
    ``redact`` (the run's redactor) or, without one, by the built-in value scan."""
    try:
        text = (redact or _scan)(repr(problem))
        if len(text) > _LIMIT:  # cut after redacting, so no cut can hide a secret from it
            text = text[:_LIMIT] + " [...]"
    except Exception:  # a repr or a redactor that fails: the message is withheld, not leaked
        text = f"{type(problem).__name__} (its message withheld: it could not be redacted)"
    return f"internal error: {text}"


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc``, scanned for secrets by value (the last line of defence)."""
    try:
        exc.add_note(_scan(note))
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass


def note_internal_error(
    exc: BaseException, problem: BaseException, redact: Redact | None = None
) -> str:
    """Say on ``exc`` that crashoverride failed while handling it (``exc`` then propagates,
    untouched otherwise); the reason, for the caller's event."""
    reason = internal_error(problem, redact)  # redacted already, or withheld
    try:
        exc.add_note(f"crashoverride: recovery failed, {reason}; the original is re-raised")
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass
    return reason


def redactor_of(settings: Callable[[], RunSettings]) -> Redact | None:
    """The redactor of ``settings()`` (its ``api_key``, its ``Redaction``), or None when it
    cannot be had: the settings may be what broke, and the built-in scan still applies."""
    try:
        return Redactor.for_settings(settings())
    except Exception:
        return None
