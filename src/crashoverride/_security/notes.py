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

from crashoverride._security.redact import Redacted, Redactor, RunSettings, clip, scanned

Redact = Callable[[str], Redacted]

_LIMIT: Final = 500


def internal_error(problem: BaseException, redact: Redact | None = None) -> Redacted:
    """The reason for events and results: ``internal error: <repr of problem>``, redacted by
    ``redact`` (the run's redactor) or, without one, by the built-in rules (``scanned``)."""
    try:
        # Cut after redacting, so no cut can hide a secret from the redactor.
        text = clip((redact or scanned)(repr(problem)), _LIMIT)
    except Exception:  # a repr or a redactor that fails: the message is withheld, not leaked
        text = scanned(f"{type(problem).__name__} (its message withheld: it could not be redacted)")
    return scanned(f"internal error: {text}")


def add_note(exc: BaseException, note: Redacted) -> None:
    """Add ``note`` (redactor output: it travels with the user's exception) to ``exc``."""
    try:
        exc.add_note(note)
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass


def note_internal_error(
    exc: BaseException, problem: BaseException, redact: Redact | None = None
) -> Redacted:
    """Say on ``exc`` that crashoverride failed while handling it (``exc`` then propagates,
    untouched otherwise); the reason, for the caller's event."""
    reason = internal_error(problem, redact)  # redacted already, or withheld
    add_note(exc, scanned(f"crashoverride: recovery failed, {reason}; the original is re-raised"))
    return reason


def redactor_of(settings: Callable[[], RunSettings]) -> Redact | None:
    """The redactor of ``settings()`` (its ``api_key``, its ``Redaction``), or None when it
    cannot be had: the settings may be what broke, and the built-in scan still applies."""
    try:
        return Redactor.for_settings(settings())
    except Exception:
        return None
