"""Immutable recovery settings: application defaults plus per-handler overrides.

Everything here is validated eagerly so bad input fails at construction, never at failure time.
This module is on the import path of ``crashoverride``: it must stay free of heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from ._errors import ConfigurationError

# Exceptions that are control flow, not failures: a recovery must never swallow them.
_NEVER_CATCH_NAMES: Final = frozenset(
    {"KeyboardInterrupt", "SystemExit", "GeneratorExit", "CancelledError", "Cancelled"}
)


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final[Any] = _Unset()


def _check_str(name: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        expected = "a str or None" if optional else "a str"
        raise ConfigurationError(name, f"expected {expected}, got {type(value).__name__}")
    return value


def _check_number(name: str, value: object, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(name, f"expected a number, got {type(value).__name__}")
    if not value > minimum:
        raise ConfigurationError(name, f"must be greater than {minimum:g}, got {value!r}")
    return float(value)


def _check_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, f"expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ConfigurationError(name, f"must be at least {minimum}, got {value!r}")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(name, f"expected a bool, got {type(value).__name__}")
    return value


def _check_callable(name: str, value: object) -> Callable[..., Any] | None:
    if value is None:
        return None
    if not callable(value):
        raise ConfigurationError(name, f"expected a callable or None, got {type(value).__name__}")
    return value


def check_catch(value: object, name: str = "catch") -> tuple[type[Exception], ...]:
    """Normalise ``catch`` to a non-empty tuple of ``Exception`` subclasses."""
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


def _check_model(value: object, name: str = "model") -> object:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise ConfigurationError(name, "must be a non-empty model name")
        return value
    # An Agents SDK ``Model`` instance; checked by shape so this module never imports the SDK.
    if callable(getattr(value, "get_response", None)) and callable(
        getattr(value, "stream_response", None)
    ):
        return value
    raise ConfigurationError(
        name,
        f"expected a model name (str), an Agents SDK Model or None, got {type(value).__name__}",
    )


def _check_tools(name: str, value: object) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigurationError(name, f"expected a tuple or list, got {type(value).__name__}")
    for item in value:
        # Plain callables become function tools; SDK tool objects carry a ``name``.
        if not (callable(item) or isinstance(getattr(item, "name", None), str)):
            raise ConfigurationError(
                name, f"expected callables or Agents SDK tools, got {type(item).__name__}"
            )
    return tuple(value)


def _check_servers(name: str, value: object) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigurationError(name, f"expected a tuple or list, got {type(value).__name__}")
    for item in value:
        if not callable(getattr(item, "list_tools", None)):
            raise ConfigurationError(
                name, f"expected Agents SDK MCP servers, got {type(item).__name__}"
            )
    return tuple(value)


def check_followups(value: object, name: str = "followups") -> tuple[str, ...]:
    """Follow-up objectives: one string or a sequence of non-empty strings."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(
        isinstance(item, str) and item.strip() for item in items
    ):
        raise ConfigurationError(name, "expected a str or a sequence of non-empty str objectives")
    return tuple(item.strip() for item in items)


def _check_runner(value: object) -> object:
    if value is None:
        return None
    # A followups.FollowupRunner or JobRunner, checked by shape to keep this module light.
    if not any(callable(getattr(value, method, None)) for method in ("submit", "submit_job")):
        raise ConfigurationError(
            "followup_runner", f"expected a follow-up runner, got {type(value).__name__}"
        )
    return value


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigurationError(
            name, f"expected one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return value


def _check_redaction(value: object) -> object:
    if value is None:
        return None
    from ._redact import Redaction

    if not isinstance(value, Redaction):
        raise ConfigurationError(
            "redaction", f"expected a crashoverride.Redaction or None, got {type(value).__name__}"
        )
    return value


MODES: Final = ("repair", "diagnose")
SOURCE_STYLES: Final = ("write", "patch")


def _union(first: tuple[Any, ...], second: tuple[Any, ...]) -> tuple[Any, ...]:
    """Concatenate, dropping items already present by identity (not equality)."""
    seen = {id(item) for item in first}
    extra = []
    for item in second:
        if id(item) not in seen:
            seen.add(id(item))
            extra.append(item)
    return first + tuple(extra)


class Settings:
    """Everything one recovery needs to know, fully validated. Immutable."""

    __slots__ = (
        "agent_factory",
        "allow_source_changes",
        "api_key",
        "approve",
        "base_url",
        "breaker_cooldown",
        "breaker_threshold",
        "breaker_window",
        "catch",
        "concurrency_wait",
        "followup_runner",
        "followup_timeout",
        "followups",
        "max_concurrent_recoveries",
        "max_turns",
        "mcp_servers",
        "mode",
        "model",
        "name",
        "on_recovery",
        "openai_client_factory",
        "postcondition",
        "project_prompt",
        "prompt",
        "redaction",
        "single_flight",
        "source_changes",
        "system_prompt",
        "timeout",
        "tools",
        "tracing",
    )

    project_prompt: str
    prompt: str
    model: object
    catch: tuple[type[Exception], ...]
    tools: tuple[Any, ...]
    mcp_servers: tuple[Any, ...]
    system_prompt: str | None
    openai_client_factory: Callable[..., Any] | None
    agent_factory: Callable[..., Any] | None
    api_key: str | None
    base_url: str | None
    timeout: float
    max_turns: int
    max_concurrent_recoveries: int
    concurrency_wait: float
    single_flight: bool
    breaker_threshold: int
    breaker_window: float
    breaker_cooldown: float
    tracing: bool
    on_recovery: Callable[..., Any] | None
    postcondition: Callable[..., Any] | None
    name: str | None
    followups: tuple[str, ...]
    mode: str
    approve: Callable[..., Any] | None
    allow_source_changes: bool
    source_changes: str
    redaction: Any
    followup_runner: object
    followup_timeout: float

    def __init__(self, **values: Any) -> None:
        for key in self.__slots__:
            object.__setattr__(self, key, values[key])

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Settings are immutable")

    @classmethod
    def for_app(
        cls,
        *,
        project_prompt: object,
        model: object,
        catch: object,
        tools: object,
        mcp_servers: object,
        system_prompt: object,
        openai_client_factory: object,
        agent_factory: object,
        api_key: object,
        base_url: object,
        timeout: object,
        max_turns: object,
        max_concurrent_recoveries: object,
        concurrency_wait: object,
        single_flight: object,
        breaker_threshold: object,
        breaker_window: object,
        breaker_cooldown: object,
        tracing: object,
        on_recovery: object,
        followups: object = (),
        followup_runner: object = None,
        followup_timeout: object = 600.0,
        mode: object = "repair",
        approve: object = None,
        allow_source_changes: object = False,
        source_changes: object = "write",
        redaction: object = None,
    ) -> Settings:
        return cls(
            mode=_check_choice("mode", mode, MODES),
            approve=_check_callable("approve", approve),
            allow_source_changes=_check_bool("allow_source_changes", allow_source_changes),
            source_changes=_check_choice("source_changes", source_changes, SOURCE_STYLES),
            redaction=_check_redaction(redaction),
            project_prompt=_check_str("project_prompt", project_prompt),
            prompt="",
            model=_check_model(model),
            catch=check_catch(catch),
            tools=_check_tools("tools", tools),
            mcp_servers=_check_servers("mcp_servers", mcp_servers),
            system_prompt=_check_str("system_prompt", system_prompt, optional=True),
            openai_client_factory=_check_callable("openai_client_factory", openai_client_factory),
            agent_factory=_check_callable("agent_factory", agent_factory),
            api_key=_check_str("api_key", api_key, optional=True),
            base_url=_check_str("base_url", base_url, optional=True),
            timeout=_check_number("timeout", timeout),
            max_turns=_check_int("max_turns", max_turns),
            max_concurrent_recoveries=_check_int(
                "max_concurrent_recoveries", max_concurrent_recoveries
            ),
            concurrency_wait=_check_number("concurrency_wait", concurrency_wait, minimum=-1e-9),
            single_flight=_check_bool("single_flight", single_flight),
            breaker_threshold=_check_int("breaker_threshold", breaker_threshold),
            breaker_window=_check_number("breaker_window", breaker_window),
            breaker_cooldown=_check_number("breaker_cooldown", breaker_cooldown, minimum=-1e-9),
            tracing=_check_bool("tracing", tracing),
            on_recovery=_check_callable("on_recovery", on_recovery),
            postcondition=None,
            name=None,
            followups=check_followups(followups),
            followup_runner=_check_runner(followup_runner),
            followup_timeout=_check_number("followup_timeout", followup_timeout),
        )

    def for_handler(self, overrides: dict[str, Any]) -> Settings:
        """Derive handler settings: tools and MCP servers are added, the rest overrides."""
        values = {key: getattr(self, key) for key in self.__slots__}
        checks: dict[str, Callable[[Any], Any]] = {
            "prompt": lambda v: _check_str("prompt", v),
            "model": _check_model,
            "catch": check_catch,
            "system_prompt": lambda v: _check_str("system_prompt", v, optional=True),
            "openai_client_factory": lambda v: _check_callable("openai_client_factory", v),
            "agent_factory": lambda v: _check_callable("agent_factory", v),
            "api_key": lambda v: _check_str("api_key", v, optional=True),
            "base_url": lambda v: _check_str("base_url", v, optional=True),
            "timeout": lambda v: _check_number("timeout", v),
            "max_turns": lambda v: _check_int("max_turns", v),
            "postcondition": lambda v: _check_callable("postcondition", v),
            "name": lambda v: _check_str("name", v, optional=True),
            "tracing": lambda v: _check_bool("tracing", v),
            "followup_runner": _check_runner,
            "mode": lambda v: _check_choice("mode", v, MODES),
            "approve": lambda v: _check_callable("approve", v),
            "allow_source_changes": lambda v: _check_bool("allow_source_changes", v),
            "source_changes": lambda v: _check_choice("source_changes", v, SOURCE_STYLES),
            "followup_timeout": lambda v: _check_number("followup_timeout", v),
        }
        for key, value in overrides.items():
            if value is UNSET:
                continue
            if key == "tools":
                values[key] = _union(self.tools, _check_tools("tools", value))
            elif key in ("followups", "followup"):  # ``followup``: the one-objective spelling
                added = check_followups(value, key)
                values["followups"] = tuple(dict.fromkeys(values["followups"] + added))
            elif key == "mcp_servers":
                values[key] = _union(self.mcp_servers, _check_servers("mcp_servers", value))
            elif key in checks:
                values[key] = checks[key](value)
            else:
                raise ConfigurationError(key, "is not a handler argument")
        return Settings(**values)

    @property
    def model_label(self) -> str:
        """A printable name for the model, for events and reports."""
        if self.model is None:
            return "sdk-default"
        if isinstance(self.model, str):
            return self.model
        return type(self.model).__name__
