"""Immutable recovery settings: application defaults plus per-handler overrides.

Each setting is spelled once, as a row of the table in the body of :class:`Settings`; both
construction paths are driven by it, and ``CrashOverride``'s typed signatures are tested against it.
Everything is validated eagerly, by the check each row names (``checks``), so bad input fails
at construction, never at failure time. This module is on the import path of ``crashoverride``:
it must stay free of heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, Literal, TypeVar, overload

from crashoverride._config import checks as check
from crashoverride._errors import ConfigurationError

_T = TypeVar("_T")


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final[Any] = _Unset()

# -- merge rules: how a handler's value combines with the application's ----------------------


def override(app: Any, handler: Any) -> Any:
    """The handler's value replaces the application's."""
    return handler


def union(app: tuple[Any, ...], handler: tuple[Any, ...]) -> tuple[Any, ...]:
    """Added to the application's, skipping items already present.

    By identity, not equality: tools and servers may be unhashable, or equal yet distinct.
    """
    known = {id(item) for item in app}
    added = {id(item): item for item in handler if id(item) not in known}  # keeps order
    return app + tuple(added.values())


def union_distinct(app: tuple[str, ...], handler: tuple[str, ...]) -> tuple[str, ...]:
    """Added to the application's, skipping equal items (objectives are plain strings)."""
    return tuple(dict.fromkeys(app + handler))


Scope = Literal["app", "handler", "both"]
APP: Final = "app"
HANDLER: Final = "handler"
BOTH: Final = "both"


class Field(Generic[_T]):
    """One setting, named by the ``Settings`` attribute it is assigned to.

    A non-data descriptor: a ``Settings`` instance keeps its values in its ``__dict__``, which
    shadows the field (reading a setting is a plain attribute lookup); type checkers see the
    type its check returns.

    Args:
        default: What the ``CrashOverride`` argument is when omitted (before the check).
        check: ``check(argument_name, value)``: the normalised value, or ConfigurationError.
        scope: ``APP``, ``HANDLER`` or ``BOTH`` (set on the application, overridable per handler).
        doc: One line; ``CrashOverride``'s docstring starts the argument's entry with it.
        annotation: The argument's type, as ``CrashOverride``'s signatures spell it (they are
            written out for type checkers; the table's test holds them to this).
        merge: How a handler's checked value combines with the application's.
        aliases: Other handler argument names for this field, each with its annotation (e.g.
            ``followup``, one objective: ``"str"``).
    """

    __slots__ = (
        "aliases", "annotation", "check", "checked_default", "default", "doc", "merge", "name",
        "scope",
    )  # fmt: skip

    checked_default: _T

    def __init__(
        self,
        default: object,
        check: Callable[[str, object], _T],
        scope: Scope,
        doc: str,
        *,
        annotation: str,
        merge: Callable[[Any, Any], Any] = override,
        aliases: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        self.default, self.check, self.scope, self.doc = default, check, scope, doc
        self.annotation, self.merge, self.aliases, self.name = annotation, merge, aliases, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        # Checked once here, so omitted arguments cost nothing per construction.
        self.checked_default = self.check(name, self.default)

    @overload
    def __get__(self, instance: None, owner: type) -> Field[_T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> _T: ...
    def __get__(self, instance: object, owner: type) -> Field[_T] | _T:
        if instance is None:
            return self
        raise AttributeError(self.name)  # only reached for a half-built instance

    @property
    def handler_default(self) -> object:
        """What ``co.handler()`` spells for "not given": inherit, or add nothing."""
        if self.scope == HANDLER:
            return self.default
        return UNSET if self.merge is override else ()


MODES: Final = ("repair", "diagnose")
SOURCE_STYLES: Final = ("write", "patch")


class Settings:
    """Everything one recovery needs to know, fully validated. Immutable.

    The class body is the table of settings. Its order is the order of ``CrashOverride``'s
    arguments (and docstring) and of ``CrashOverride.handler``'s.
    """

    # fmt: off
    # name = Field(default, check, scope, doc, annotation=...[, merge=..., aliases=...]);
    # merge: ``override``. APP: process-wide (admission, hooks); HANDLER: what one block means;
    # BOTH: overridable per handler. ``annotation``: the type the signatures spell. The checks
    # are ``_config/checks.py``'s.
    project_prompt = Field("", check.text, APP,
                           "Facts about the application every recovery knows.",
                           annotation="str")
    prompt = Field("", check.text, HANDLER, "What the protected block must achieve.",
                   annotation="str")
    model = Field(None, check.model, BOTH,
                  "A model name, an Agents SDK ``Model`` instance, or None.",
                  annotation="Any")
    catch = Field(Exception, check.catch, BOTH, "Exception class(es) that trigger a recovery.",
                  annotation="type[Exception] | tuple[type[Exception], ...]")
    tools = Field((), check.tools, BOTH, "Tools offered to every recovery.", merge=union,
                  annotation="Sequence[Any]")
    mcp_servers = Field((), check.servers, BOTH, "MCP servers offered to every recovery.",
                        merge=union, annotation="Sequence[Any]")
    system_prompt = Field(None, check.optional_text, BOTH,
                          "Replaces the built-in agent instructions.",
                          annotation="str | None")
    openai_client_factory = Field(None, check.hook, BOTH, "Builds the ``AsyncOpenAI`` client.",
                                  annotation="Callable[[], Any] | None")
    agent_factory = Field(None, check.hook, BOTH,
                          "Builds the SDK ``Agent`` from keyword arguments.",
                          annotation="Callable[..., Any] | None")
    api_key = Field(None, check.optional_text, BOTH, "API key; default: ``OPENAI_API_KEY``.",
                    annotation="str | None")
    base_url = Field(None, check.http_url, BOTH, "An OpenAI-compatible http(s) endpoint.",
                     annotation="str | None")
    timeout = Field(120.0, check.positive, BOTH,
                    "Wall-clock budget of one recovery, in seconds.",
                    annotation="float")
    max_turns = Field(20, check.count, BOTH, "Model turns one recovery may take.",
                      annotation="int")
    max_concurrent_recoveries = Field(4, check.count, APP,
                                      "Recoveries running at once in this process.",
                                      annotation="int")
    concurrency_wait = Field(30.0, check.non_negative, APP,
                             "Seconds a recovery waits for a free slot.",
                             annotation="float")
    single_flight = Field(True, check.flag, APP,
                          "Concurrent identical failures share one recovery.",
                          annotation="bool")
    breaker_threshold = Field(3, check.count, APP,
                              "Failed recoveries of one fingerprint that open its breaker...",
                              annotation="int")
    breaker_window = Field(300.0, check.positive, APP, "...within this many seconds...",
                           annotation="float")
    breaker_cooldown = Field(600.0, check.non_negative, APP, "...for this many seconds.",
                             annotation="float")
    patch_watch = Field(300.0, check.non_negative, APP,
                        "Seconds a live patch is watched, and reverted if it makes things worse.",
                        annotation="float")
    tracing = Field(False, check.flag, BOTH,
                    "Export SDK traces (tracebacks and locals are sensitive).",
                    annotation="bool")
    on_recovery = Field(None, check.hook, APP, "Called with every ``RecoveryReport``.",
                        annotation="Callable[[RecoveryReport], Any] | None")
    postcondition = Field(None, check.hook, HANDLER,
                          "Judges the block's locals after the agent.",
                          annotation="Callable[..., Any] | None")
    name = Field(None, check.optional_text, HANDLER,
                 "The handler's name in events and reports.",
                 annotation="str | None")
    followups = Field((), check.followups, BOTH,
                      "Objectives run in the background after a recovery.",
                      merge=union_distinct, annotation="str | Sequence[str]",
                      aliases=MappingProxyType({"followup": "str"}))
    followup_runner = Field(None, check.runner, BOTH, "Where follow-ups run.", annotation="Any")
    followup_timeout = Field(600.0, check.positive, BOTH,
                             "Budget of one follow-up run, in seconds.",
                             annotation="float")
    mode = Field("repair", check.choice(*MODES), BOTH,
                 '``"repair"`` or ``"diagnose"`` (read-only).',
                 annotation="str")
    approve = Field(None, check.hook, BOTH, "Called with every tool call before it runs.",
                    annotation="Approver | None")
    allow_source_changes = Field(False, check.flag, BOTH,
                                 "Let recoveries persist fixes to sources.",
                                 annotation="bool")
    source_changes = Field("write", check.choice(*SOURCE_STYLES), BOTH,
                           '``"write"`` or ``"patch"``.',
                           annotation="str")
    redaction = Field(None, check.redaction, APP,
                      "Extra redaction rules on top of the defaults.",
                      annotation="Redaction | None")
    coordination = Field(None, check.coordination, APP,
                         "Who recoveries coordinate with: this process (None) or a fleet.",
                         annotation="RedisCoordination | None")
    recovery_header = Field(True, check.flag, APP,
                            "Recovered HTTP responses carry a ``crashoverride-recovery`` header.",
                            annotation="bool")
    # fmt: on

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Settings are immutable")

    def __delattr__(self, key: str) -> None:
        raise AttributeError("Settings are immutable")

    @classmethod
    def _from(cls, values: dict[str, Any]) -> Settings:
        settings = object.__new__(cls)
        settings.__dict__.update(values)  # bypasses __setattr__: the one place values are set
        return settings

    @classmethod
    def for_app(cls, **arguments: object) -> Settings:
        """Application settings from ``CrashOverride`` arguments; omitted or UNSET: default.

        Raises:
            ConfigurationError: A value fails its check, or a key is not an application field.
        """
        unknown = arguments.keys() - _APP_NAMES
        if unknown:
            raise ConfigurationError(min(unknown), "is not a CrashOverride argument")
        values = {field.name: field.checked_default for field in FIELDS}
        for key, value in arguments.items():
            if value is not UNSET:
                values[key] = getattr(cls, key).check(key, value)
        return cls._from(values)

    def for_handler(self, overrides: dict[str, Any]) -> Settings:
        """Derive handler settings: each override is checked and merged by its field's rule.

        Raises:
            ConfigurationError: A value fails its check, or a key is not a handler argument.
        """
        values = dict(self.__dict__)
        for key, value in overrides.items():
            if value is UNSET:
                continue
            field = _BY_HANDLER_NAME.get(key)
            if field is None:
                raise ConfigurationError(key, "is not a handler argument")
            values[field.name] = field.merge(values[field.name], field.check(key, value))
        return Settings._from(values)

    @property
    def model_label(self) -> str:
        """A printable name for the model, for events and reports."""
        if self.model is None:
            return "sdk-default"
        if isinstance(self.model, str):
            return self.model
        return type(self.model).__name__


FIELDS: Final = tuple(value for value in vars(Settings).values() if isinstance(value, Field))
_APP_NAMES: Final = frozenset(field.name for field in FIELDS if field.scope != HANDLER)
# Handler argument name (field name or alias, e.g. ``followup``) -> its field.
_BY_HANDLER_NAME: Final = {
    name: field for field in FIELDS if field.scope != APP for name in (field.name, *field.aliases)
}
