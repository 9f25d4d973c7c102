"""Keep secrets out of everything a recovery sends or records: the one choke point.

Every channel (the prompt, the locals summary, tool results, events, the report, notes,
follow-ups, cassettes) passes its text through a ``Redactor``. It masks, in any text:

- known secret values: values under secret-looking names in the failed frame's locals and
  inside them (a bounded walk, ``_masking.secret_values``),
  secret-named environment variables, credentials found inside any environment variable (the
  password of a ``DATABASE_URL``), the configured ``api_key``, the application's ``Redaction``;
- secrets recognised by their value (``_secrets``): provider keys, JWTs, private keys,
  credentials in URLs and headers, credential-looking values after secret-looking names.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from . import _secrets
from ._secrets import is_secret_name

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["MASK", "Redaction", "Redactor", "is_secret_name"]

MASK = "[REDACTED]"
# Shorter values are too likely to collide with ordinary text to be masked by value.
_MIN_SECRET_LENGTH = 6


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
    """Masks secrets in text, following the built-in rules and a ``Redaction``."""

    __slots__ = ("_pattern", "_policy")

    def __init__(self, extra_values: Iterable[str] = (), policy: Redaction | None = None) -> None:
        self._policy = policy
        values: set[str] = set()
        if policy is None or policy.environment:
            values.update(_environment_secrets(self.is_secret))
        sources = list(extra_values) + list(policy.values if policy is not None else ())
        values.update(v for v in sources if isinstance(v, str) and len(v) >= _MIN_SECRET_LENGTH)
        values.discard(MASK)
        # Longest first so a secret containing another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        alternatives = [re.escape(v) for v in ordered]
        if policy is not None:
            # Each keeps the case-insensitivity ``Redaction`` compiled it with.
            alternatives += [f"(?i:{p.pattern})" for p in policy.patterns]
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

    @classmethod
    def for_settings(cls, settings: Settings, extra_values: Iterable[str] = ()) -> Redactor:
        """The redactor of a run under ``settings``: its policy and the credentials it holds."""
        held = [settings.api_key] if settings.api_key else []
        return cls([*extra_values, *held], settings.redaction)

    def is_secret(self, name: str) -> bool:
        if is_secret_name(name):
            return True
        policy = self._policy
        return policy is not None and any(p.search(name) for p in policy.names)

    def __call__(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return _secrets.mask(text, MASK, self.is_secret)


_env_lock = threading.Lock()
_env_cache: tuple[object, frozenset[str]] | None = None


def _environment_secrets(is_secret: Callable[[str], bool]) -> frozenset[str]:
    """Secret-named variables' values and credentials found in any variable's value.

    Scanning the environment costs ~1 ms; it rarely changes, so the result is kept while the
    environment and the name rule stay the same.
    """
    global _env_cache
    items = tuple(os.environ.items())
    key = (items, is_secret if not _is_default(is_secret) else None)
    cached = _env_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    found: set[str] = set()
    for name, value in items:
        if is_secret(name):
            found.add(value)
        found.update(_secrets.found(value, is_secret))
    result = frozenset(v for v in found if len(v) >= _MIN_SECRET_LENGTH)
    with _env_lock:
        _env_cache = (key, result)
    return result


def _is_default(is_secret: Callable[[str], bool]) -> bool:
    # A bound ``Redactor.is_secret`` without a names policy decides as ``is_secret_name`` does.
    owner = getattr(is_secret, "__self__", None)
    return isinstance(owner, Redactor) and (owner._policy is None or not owner._policy.names)
