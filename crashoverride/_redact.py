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
    r"(passw(or)?d|passphrase|^pass$|secret|token|api[_-]?key|(^|[_-])key$|private[_-]?key|"
    r"authori[sz]ation|cookie|credential|session[_-]?id|signature|dsn)",
    re.IGNORECASE,
)
MASK = "[REDACTED]"
# Shorter values are too likely to collide with ordinary text to be masked by value.
_MIN_SECRET_LENGTH = 6


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class Redaction:
    """The application's redaction policy, added to the built-in rules.

    Args:
        names: Regular expressions for more secret-looking names (locals, headers, env vars).
        patterns: Regular expressions matching secret values in any text (e.g. token formats).
        values: Literal secret strings to mask wherever they appear.
        environment: Mask the values of secret-named environment variables (default True).
    """

    __slots__ = ("environment", "names", "patterns", "values")

    def __init__(
        self,
        *,
        names: Iterable[str] = (),
        patterns: Iterable[str] = (),
        values: Iterable[str] = (),
        environment: bool = True,
    ) -> None:
        from ._errors import ConfigurationError

        def compiled(argument: str, items: Iterable[str]) -> tuple[re.Pattern[str], ...]:
            if isinstance(items, str):
                raise ConfigurationError(argument, "expected a sequence of strings, not a str")
            try:
                return tuple(re.compile(item, re.IGNORECASE) for item in items)
            except (re.error, TypeError) as exc:
                raise ConfigurationError(argument, f"invalid regular expression: {exc}") from None

        self.names = compiled("names", names)
        self.patterns = compiled("patterns", patterns)
        if isinstance(values, str) or not all(isinstance(v, str) for v in values):
            raise ConfigurationError("values", "expected a sequence of strings")
        self.values = tuple(values)
        if not isinstance(environment, bool):
            raise ConfigurationError("environment", "expected a bool")
        self.environment = environment


class Redactor:
    """Masks known secret values in text, following the built-in rules and a ``Redaction``."""

    __slots__ = ("_pattern", "_policy")

    def __init__(self, extra_values: Iterable[str] = (), policy: Redaction | None = None) -> None:
        self._policy = policy
        values: set[str] = set()
        if policy is None or policy.environment:
            values.update(
                value
                for name, value in os.environ.items()
                if self.is_secret(name) and len(value) >= _MIN_SECRET_LENGTH
            )
        sources = list(extra_values) + list(policy.values if policy is not None else ())
        values.update(v for v in sources if isinstance(v, str) and len(v) >= _MIN_SECRET_LENGTH)
        # Longest first so a secret containing another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        alternatives = [re.escape(v) for v in ordered]
        if policy is not None:
            alternatives += [f"(?:{p.pattern})" for p in policy.patterns]
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

    def is_secret(self, name: str) -> bool:
        if is_secret_name(name):
            return True
        policy = self._policy
        return policy is not None and any(p.search(name) for p in policy.names)

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
