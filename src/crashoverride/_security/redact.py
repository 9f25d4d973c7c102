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

import functools
import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from crashoverride._security import secrets
from crashoverride._security.secrets import is_secret_name

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
        from crashoverride._errors import ConfigurationError

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


class RunSettings(Protocol):
    """What a redactor needs of a run's settings (``_config.settings.Settings`` is one): the
    credential it holds and the application's rules. A Protocol: settings sit above security."""

    @property
    def api_key(self) -> str | None: ...
    @property
    def redaction(self) -> Redaction | None: ...


class Redactor:
    """Masks secrets in text, following the built-in rules and a ``Redaction``."""

    __slots__ = ("_pattern", "_policy")

    def __init__(self, extra_values: Iterable[str] = (), policy: Redaction | None = None) -> None:
        self._policy = policy
        values: set[str] = set()
        if policy is None or policy.environment:
            values.update(_environment_secrets(policy.names if policy is not None else ()))
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
    def for_settings(cls, settings: RunSettings, extra_values: Iterable[str] = ()) -> Redactor:
        """The redactor of a run under ``settings``: its policy and the credentials it holds."""
        key = settings.api_key
        # A placeholder key for a local server ("ollama", "not-needed") is a word the agent
        # must still be able to read; a real credential is long or random-looking.
        held = [key] if key and (len(key) >= 16 or secrets.random_looking(key)) else []
        return cls([*extra_values, *held], settings.redaction)

    def is_secret(self, name: str) -> bool:
        policy = self._policy
        return _secret_under(policy.names if policy is not None else (), name)

    def __call__(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return secrets.mask(text, MASK, self.is_secret)

    def constant(self, text: str) -> str:
        """``self(text)`` for text every recovery sends again (the instructions): the value
        scan of it is remembered, as it depends only on the text and the name rules."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        if len(text) > _CONSTANT_LIMIT:
            return secrets.mask(text, MASK, self.is_secret)
        policy = self._policy
        return _scanned(text, policy.names if policy is not None else ())


def _secret_under(names: tuple[re.Pattern[str], ...], name: str) -> bool:
    """The name rule: the built-in one, or one of the application's ``Redaction.names``."""
    return is_secret_name(name) or any(p.search(name) for p in names)


def name_rule(names: tuple[re.Pattern[str], ...] = ()) -> Callable[[str], bool]:
    """The name rule under ``names`` (a ``Redaction``'s), without building a redactor."""
    return functools.partial(_secret_under, names) if names else is_secret_name


# Instructions are a few kB per handler, and scanning them was most of a recovery's redaction
# cost: a burst of recoveries paid it on the event loop once each.
_CONSTANT_LIMIT = 64 * 1024


@functools.lru_cache(maxsize=32)
def _scanned(text: str, names: tuple[re.Pattern[str], ...]) -> str:
    return secrets.mask(text, MASK, name_rule(names))


_env_lock = threading.Lock()
_env_cache: tuple[object, frozenset[str]] | None = None


def _environment_secrets(names: tuple[re.Pattern[str], ...]) -> frozenset[str]:
    """Secret-named variables' values and credentials found in any variable's value.

    Scanning the environment costs ~1 ms; it rarely changes, so the result is kept while the
    environment and the name rules stay the same. The key is the environment's raw mapping
    (``os.environ._data`` where it exists): iterating ``os.environ`` decodes every entry.
    """
    global _env_cache
    raw = getattr(os.environ, "_data", None)
    snapshot = tuple(raw.items()) if isinstance(raw, dict) else tuple(os.environ.items())
    key = (snapshot, names)
    cached = _env_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    is_secret = name_rule(names)
    found: set[str] = set()
    for name, value in os.environ.items():
        if is_secret(name):
            found.add(value)
        found.update(secrets.found(value, is_secret))
    result = frozenset(v for v in found if len(v) >= _MIN_SECRET_LENGTH)
    with _env_lock:
        _env_cache = (key, result)
    return result
