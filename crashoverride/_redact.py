"""Keep secrets out of everything a recovery sends or records.

One policy object is applied to the prompt, the locals summary, tool results, events and the
report. It masks values bound to secret-looking names and the values of secret-looking
environment variables wherever they appear in text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

SECRET_NAME = re.compile(
    r"(passw(or)?d|passphrase|^pass$|^pwd$|secret|token|api[_-]?key|(^|[_-])key$|private[_-]?key|"
    r"authori[sz]ation|cookie|credential|session[_-]?id|signature|dsn)",
    re.IGNORECASE,
)
MASK = "[REDACTED]"
# Shorter values are too likely to collide with ordinary text to be masked by value.
_MIN_SECRET_LENGTH = 6


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class Redactor:
    """Masks known secret values in text."""

    __slots__ = ("_pattern",)

    def __init__(self, extra_values: Iterable[str] = ()) -> None:
        values = {
            value
            for name, value in os.environ.items()
            if is_secret_name(name) and len(value) >= _MIN_SECRET_LENGTH
        }
        values.update(
            v for v in extra_values if isinstance(v, str) and len(v) >= _MIN_SECRET_LENGTH
        )
        # Longest first so a secret containing another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def add(self, value: str) -> None:
        """Remember one more secret value (e.g. a header seen by an integration)."""
        if not isinstance(value, str) or len(value) < _MIN_SECRET_LENGTH:
            return
        known = self._pattern.pattern + "|" if self._pattern is not None else ""
        self._pattern = re.compile(known + re.escape(value))

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)
