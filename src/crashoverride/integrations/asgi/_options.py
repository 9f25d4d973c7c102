"""Option checks of ``CrashOverrideMiddleware``: bad input fails at construction, by name."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

from crashoverride import ConfigurationError


def sequence(name: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(name, f"expected a tuple or list, got {type(value).__name__}")
    return tuple(value)


def objectives(value: Any) -> Any:
    # Checked (with the argument's name) by the core settings; only iterables are copied here.
    if isinstance(value, str) or not isinstance(value, Iterable):
        return value
    return tuple(value)


def patterns(name: str, value: Any) -> tuple[re.Pattern[str], ...]:
    if isinstance(value, str | re.Pattern):
        value = (value,)  # a single pattern is a common slip; accept it
    if not isinstance(value, Iterable):
        raise ConfigurationError(name, f"expected path patterns, got {type(value).__name__}")
    compiled = []
    for item in value:
        if isinstance(item, re.Pattern):
            compiled.append(item)
        elif isinstance(item, str) and item:
            compiled.append(re.compile(fnmatch.translate(item)))
        else:
            raise ConfigurationError(
                name, f"expected glob strings or compiled regexes, got {item!r}"
            )
    return tuple(compiled)


def methods(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise ConfigurationError("methods", f"expected method names, got {type(value).__name__}")
    found = set()
    for item in value:
        if not isinstance(item, str) or not item.isalpha():
            raise ConfigurationError("methods", f"expected HTTP method names, got {item!r}")
        found.add(item.upper())
    if not found:
        raise ConfigurationError("methods", "must name at least one method, or be None for all")
    return frozenset(found)


def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(name, f"expected a non-negative int, got {value!r}")
    return value


def non_negative_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigurationError(name, f"expected a non-negative number, got {value!r}")
    return float(value)


# RFC 9110's token: the characters a header's name may have.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def header(name: str, value: Any) -> bytes | None:
    """A header's name as ASGI servers hand it over (lowercased bytes), or None for none."""
    if value is None:
        return None
    if not isinstance(value, str) or not _TOKEN.fullmatch(value.strip()):
        raise ConfigurationError(name, f"expected a header name or None, got {value!r}")
    return value.strip().lower().encode("latin-1")


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(name, f"expected True or False, got {value!r}")
    return value
