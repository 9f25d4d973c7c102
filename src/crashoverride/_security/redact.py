"""Keep secrets out of everything a recovery sends or records: the one choke point.

Every channel (the prompt, the locals summary, tool results, events, the report, notes,
follow-ups, cassettes, Sentry, OpenTelemetry, the ledger) passes its text through a
``Redactor``. It masks, in any text:

- known secret values: values under secret-looking names in the failed frame's locals and
  inside them (a bounded walk, ``_security.masking.secret_values``),
  secret-named environment variables, credentials found inside any environment variable (the
  password of a ``DATABASE_URL``), the configured ``api_key``, the application's ``Redaction``;
- secrets recognised by their value (``_security.secrets``): provider keys, JWTs, private keys,
  credentials in URLs and headers, credential-looking values after secret-looking names.

By construction: what the redactor returns is typed ``Redacted`` (``RedactedData`` for a JSON
document), this module alone makes one, and every sink takes only these types, so text that
skipped the redactor is a type error (``mypy --strict``; ``tests/architecture/test_redacted.py``
keeps the constructors here and the sinks' parameters typed). Text with no recovery at hand
(an event of the fleet link, a record read back) goes through ``scanned``: the rules every
redactor applies, and this process's secret environment values.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NewType, Protocol, overload

from crashoverride._security import secrets
from crashoverride._security.secrets import is_secret_name

__all__ = [
    "EMPTY", "MASK", "Redacted", "RedactedData", "Redaction", "Redactor", "clip", "fixed",
    "is_secret_name", "scanned", "scanned_data",
]  # fmt: skip

Redacted = NewType("Redacted", str)
"""Text as a redactor returned it: the only text a sink (a model request, an event, a note,
the report, a cassette, Sentry, OpenTelemetry) accepts. Concatenating two gives a plain ``str``
again: a composition is redacted as a whole (two harmless halves may make one key)."""

RedactedData = NewType("RedactedData", dict[str, Any])
"""A JSON-like document every string of which (keys too) a redactor returned."""

MASK = "[REDACTED]"
EMPTY = Redacted("")
# Shorter values are too likely to collide with ordinary text to be masked by value.
_MIN_SECRET_LENGTH = 6
_LITERAL_LIMIT = 256  # known values longer than this are masked by ``str.replace``, not a regex


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

    __slots__ = ("_long", "_pattern", "_policy")

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
        # A long value (a key file, a token cache held under a secret-looking name) is replaced
        # as a literal: compiling it into the pattern costs time in its length (seconds a MB).
        self._long = tuple(v for v in ordered if len(v) > _LITERAL_LIMIT)
        alternatives = [re.escape(v) for v in ordered if len(v) <= _LITERAL_LIMIT]
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

    def _known(self, text: str) -> str:
        """``text`` with the values this redactor knows masked (the long ones first)."""
        for value in self._long:
            text = text.replace(value, MASK)
        return self._pattern.sub(MASK, text) if self._pattern is not None else text

    def __call__(self, text: str) -> Redacted:
        return Redacted(secrets.mask(self._known(text), MASK, self.is_secret))

    def constant(self, text: str, slots: Mapping[str, str] | None = None) -> Redacted:
        """``self(text)`` for text every recovery sends again (the instructions): the value
        scan of it is remembered, as it depends only on the text and the name rules.

        ``slots``: placeholders in ``text`` and what replaces each after the scan (a fresh
        fence id), each value redacted on its own, so the cached scan still covers the rest.
        """
        text = self._known(text)
        if len(text) > _CONSTANT_LIMIT:
            text = secrets.mask(text, MASK, self.is_secret)
        else:
            policy = self._policy
            text = _scanned(text, policy.names if policy is not None else ())
        for slot, value in (slots or {}).items():
            text = text.replace(slot, self(value))
        return Redacted(text)

    def data(self, value: Mapping[str, Any]) -> RedactedData:
        """``value`` (JSON-like: mappings, sequences, scalars) with every string redacted, its
        keys too, and any string under a secret-looking key masked whole."""
        return RedactedData(_walk(value, self, self.is_secret))


def _walk(value: Any, redact: Callable[[str], str], is_secret: Callable[[str], bool]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            (redact(key) if isinstance(key, str) else _walk(key, redact, is_secret)): (
                MASK
                if isinstance(key, str) and _held(item) and is_secret(key)
                else _walk(item, redact, is_secret)
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_walk(item, redact, is_secret) for item in value]
    if isinstance(value, bool | int | float | None) or _plain(value):
        return value  # numbers, None, timestamps: a sink serialises them, no secret in them
    # Anything else (bytes, an object) a sink would render by its repr, after the redactor:
    # rendered here, so that what is redacted is what goes out.
    return redact(_repr(value))


def _held(item: object) -> bool:
    """Text a secret-looking key holds: masked whole. (A number or a flag is no secret; a
    container is walked: Sentry's ``_meta`` mirrors the event's keys with objects.)"""
    return isinstance(item, str | bytes | bytearray) and len(item) > 0


def _plain(value: object) -> bool:
    # By module, so that checking imports nothing: ``datetime``/``date``/``time``/``timedelta``,
    # ``UUID``, ``Decimal`` (their text holds no secret; JSON renderers know them).
    return type(value).__module__ in ("datetime", "uuid", "decimal", "_decimal", "_pydecimal")


def _repr(value: object) -> str:
    from crashoverride._security.bounded import BoundedRepr  # its work bounded too

    shortener = BoundedRepr()
    shortener.maxstring = shortener.maxother = 4_000
    try:
        return shortener.repr(value)
    except Exception:  # a user's ``__repr__`` may fail: its type is all we show
        return f"<{type(value).__name__}>"


def scanned(text: str) -> Redacted:
    """``text`` redacted with no recovery at hand: the built-in rules and this process's secret
    environment values (an event of the fleet link, an internal error, a record read back)."""
    return _default()(text)


def scanned_data(value: Mapping[str, Any]) -> RedactedData:
    """``scanned`` for a JSON-like document."""
    return _default().data(value)


def fixed(text: str) -> Redacted:
    """A constant of crashoverride's own (an event name, a fixed message), scanned all the same
    under the built-in rules, so no constant is exempt. Cheap enough for import time: a text
    with no ``=``, ``:`` or key prefix compiles no pattern."""
    return Redacted(secrets.mask(text, MASK))


_default_lock = threading.Lock()
_default_cache: tuple[frozenset[str], Redactor] | None = None


def _default() -> Redactor:
    """The redactor of no recovery, rebuilt only when the environment's secrets change."""
    global _default_cache
    values = _environment_secrets(())
    cached = _default_cache
    if cached is not None and cached[0] is values:
        return cached[1]
    redactor = Redactor()
    with _default_lock:
        _default_cache = (values, redactor)
    return redactor


@overload
def clip(text: Redacted, limit: int) -> Redacted: ...
@overload
def clip(text: str, limit: int) -> str: ...
def clip(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` within ``limit`` characters, marking the cut.

    A secret the cut would halve is left out whole: half a key is too short for the redactor
    to recognise, and still half a key. So a clipped ``Redacted`` is still one: it holds only
    whole pieces of the text, and a marker of ours between them.
    """
    if len(text) <= limit:
        return text
    keep = max(limit - 60, 20)
    head = keep * 2 // 3
    tail = len(text) - (keep - head)
    halved = _secret_across(text, head)
    if halved is not None:
        head = halved[0]
    halved = _secret_across(text, tail)
    if halved is not None:
        tail = halved[1]
    return f"{text[:head]}\n... [{tail - head} characters elided] ...\n{text[tail:]}"


_WINDOW = 600  # longer than any secret format the detector knows, PEM blocks aside


def _secret_across(text: str, cut: int) -> tuple[int, int] | None:
    """The span of a secret that straddles ``cut``, if one does."""
    offset = max(cut - _WINDOW, 0)
    for start, end in secrets.spans(text[offset : cut + _WINDOW]):
        if start + offset < cut < end + offset:
            return start + offset, end + offset
    return None


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
