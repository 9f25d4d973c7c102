"""The checks of the settings table: ``check(name, value) -> normalised value``.

Each raises ``ConfigurationError(name, ...)`` for a value it refuses, so bad input fails when
``CrashOverride`` or a handler is built, never at failure time. ``settings`` names one per
field. On the import path of ``crashoverride``: heavy or rarely needed imports happen inside
the check that needs them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from crashoverride._errors import ConfigurationError

if TYPE_CHECKING:
    from crashoverride._config.coordination import RedisCoordination
    from crashoverride._security.redact import Redaction

# Exceptions that are control flow, not failures: a recovery must never swallow them.
_NEVER_CATCH_NAMES: Final = frozenset(
    {"KeyboardInterrupt", "SystemExit", "GeneratorExit", "CancelledError", "Cancelled"}
)


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(name, f"expected a str, got {type(value).__name__}")
    return value


def optional_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(name, f"expected a str or None, got {type(value).__name__}")
    return value


def seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(name, f"expected a number, got {type(value).__name__}")
    try:
        amount = float(value)
    except OverflowError:  # an int beyond float range: as unusable as infinity
        amount = math.inf
    # Infinity or NaN would silently disable a budget (``fail_after(nan)`` never fires).
    if not math.isfinite(amount):
        raise ConfigurationError(name, f"must be a finite number of seconds, got {value!r:.40}")
    if amount < 0 or (amount == 0 and not zero_ok):
        bound = "at least 0" if zero_ok else "greater than 0"
        raise ConfigurationError(name, f"must be {bound}, got {value!r}")
    return amount


positive: Final = seconds
non_negative: Final = functools.partial(seconds, zero_ok=True)


def count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, f"expected an int, got {type(value).__name__}")
    if value < 1:
        raise ConfigurationError(name, f"must be at least 1, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(name, f"expected a bool, got {type(value).__name__}")
    return value


def hook(name: str, value: object) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise ConfigurationError(name, f"expected a callable or None, got {type(value).__name__}")
    return value


def choice(*choices: str) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in choices:
            expected = ", ".join(map(repr, choices))
            raise ConfigurationError(name, f"expected one of {expected}, got {value!r}")
        return value

    return check


def http_url(name: str, value: object) -> str | None:
    given = optional_text(name, value)
    if given is None:
        return None
    # Imported here: ``base_url`` is rarely set and ``import crashoverride`` must stay light.
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(given)
        # ``port`` raises ValueError for a port out of range or not a number.
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:
        valid = False
    if not valid or any(char.isspace() for char in given):
        # A rejected URL may still carry a password: never echo one with credentials.
        shown = "a URL with credentials" if "@" in given else repr(given[:80])
        raise ConfigurationError(name, f"expected an http(s) URL with a host, got {shown}")
    return given


def catch(name: str, value: object) -> tuple[type[Exception], ...]:
    # A non-empty tuple of ``Exception`` subclasses: one class or a list is normalised to it.
    items = value if isinstance(value, tuple | list) else (value,)
    if not items:
        raise ConfigurationError(name, "must name at least one exception class")
    result: list[type[Exception]] = []
    for item in items:
        if not isinstance(item, type) or not issubclass(item, BaseException):
            raise ConfigurationError(
                name, f"expected exception classes, got {item!r} ({type(item).__name__})"
            )
        if item.__name__ in _NEVER_CATCH_NAMES or not issubclass(item, Exception):
            raise ConfigurationError(
                name,
                f"{item.__name__} is control flow (interrupts, exits, cancellation) and is never "
                "caught; use Exception or a subclass of it",
            )
        result.append(item)
    return tuple(result)


def model(name: str, value: object) -> object:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise ConfigurationError(name, "must be a non-empty model name")
        return value
    # An Agents SDK ``Model`` instance; checked by shape so this module never imports the SDK.
    if all(callable(getattr(value, m, None)) for m in ("get_response", "stream_response")):
        return value
    raise ConfigurationError(
        name,
        f"expected a model name (str), an Agents SDK Model or None, got {type(value).__name__}",
    )


def tools(name: str, value: object, *, servers: bool = False) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigurationError(name, f"expected a tuple or list, got {type(value).__name__}")
    for item in value:
        # Plain callables become function tools; SDK tool objects carry a ``name``.
        if not (
            callable(getattr(item, "list_tools", None))
            if servers
            else callable(item) or isinstance(getattr(item, "name", None), str)
        ):
            what = "Agents SDK MCP servers" if servers else "callables or Agents SDK tools"
            raise ConfigurationError(name, f"expected {what}, got {type(item).__name__}")
    return tuple(value)


servers: Final = functools.partial(tools, servers=True)


def followups(name: str, value: object) -> tuple[str, ...]:
    # One objective (a str) or a sequence of non-empty ones.
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(
        isinstance(item, str) and item.strip() for item in items
    ):
        raise ConfigurationError(name, "expected a str or a sequence of non-empty str objectives")
    return tuple(item.strip() for item in items)


def runner(name: str, value: object) -> object:
    # A followups.FollowupRunner or JobRunner, checked by shape to keep this module light.
    if value is not None and not any(
        callable(getattr(value, method, None)) for method in ("submit", "submit_job")
    ):
        raise ConfigurationError(name, f"expected a follow-up runner, got {type(value).__name__}")
    return value


def redaction(name: str, value: object) -> Redaction | None:
    if value is None:
        return None
    from crashoverride._security.redact import Redaction

    if not isinstance(value, Redaction):
        raise ConfigurationError(name, f"expected a Redaction or None, got {type(value).__name__}")
    return value


def coordination(name: str, value: object) -> RedisCoordination | None:
    # None (this process alone) or a ``RedisCoordination``, validated when it was built.
    if value is None:
        return None
    from crashoverride._config.coordination import RedisCoordination

    if not isinstance(value, RedisCoordination):
        raise ConfigurationError(
            name, f"expected None or a RedisCoordination, got {type(value).__name__}"
        )
    return value
