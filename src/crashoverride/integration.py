"""The contract integrations are written against: describe the unit, recover it, act on it.

Everything in ``crashoverride.integrations`` (ASGI, asyncio, Celery, arq) uses only this module and
the package's public names; a new integration (Django, a queue consumer) is one small file::

    from crashoverride import integration

    try:
        value = await handle(message)
    except Exception as exc:
        if not integration.catches(handler, exc):
            raise
        outcome = await integration.arecover(  # described lazily, never kept in a local
            handler, exc, functools.partial(integration.call_block, handle, (message,), {}, exc)
        )
        if not integration.settle(handler, outcome, exc):
            raise  # the original exception, untouched but for a note saying why
        value = outcome.value

A ``Block``'s ``brief`` (what the unit is, for the agent) is a ``Brief``: text you wrote,
shown as instructions, and the values of this occurrence, each fenced as data::

    integration.Brief(
        "This is the Kafka message shown above (`topic`, `key`). Finish with set_result(...).",
        topic=message.topic, key=message.key,
    )

Never put what the message, request or task brought into the text: only a value is fenced.

``recover`` / ``arecover`` never raise for a failure of crashoverride's own: they return None
and the caller re-raises the user's exception. The recovery algorithm itself lives in
``src/crashoverride/_core/pipeline.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from crashoverride._config.settings import UNSET
from crashoverride._core.block import Block, call_block, result_view
from crashoverride._core.recovery import Decision as Outcome
from crashoverride._core.recovery import fingerprint
from crashoverride._core.recovery import internal_failure as _internal_failure
from crashoverride._effects import journal as _effects
from crashoverride._handler import Handler
from crashoverride._observe.events import CANCELLED as RECOVERY_CANCELLED
from crashoverride._observe.events import FAILED as RECOVERY_FAILED
from crashoverride._observe.events import FOLLOWUP_UNCONSUMED
from crashoverride._observe.events import SKIPPED as RECOVERY_SKIPPED
from crashoverride._observe.events import WARM_UP_FAILED as RECOVERY_WARM_UP_FAILED
from crashoverride._security.brief import Brief
from crashoverride._security.masking import mask_fields, mask_multipart, mask_query
from crashoverride._security.notes import add_note, redactor_of
from crashoverride._security.redact import MASK, Redactor, is_secret_name, scanned
from crashoverride._security.text import clip
from crashoverride._security.verdict import judge

if TYPE_CHECKING:
    from crashoverride._placement.bridge import loop_running_here, on_asyncio

__all__ = [
    "FOLLOWUP_UNCONSUMED",
    "MASK",
    "RECOVERY_CANCELLED",
    "RECOVERY_FAILED",
    "RECOVERY_SKIPPED",
    "RECOVERY_WARM_UP_FAILED",
    "UNSET",
    "Block",
    "Brief",
    "Outcome",
    "Redactor",
    "arecover",
    "attempt_of",
    "awarm_up",
    "call_block",
    "catches",
    "clip",
    "current_unit",
    "effects_declared",
    "emit",
    "fingerprint",
    "internal_failure",
    "is_secret_name",
    "judge",
    "loop_running_here",
    "mask_fields",
    "mask_multipart",
    "mask_query",
    "note",
    "on_asyncio",
    "recover",
    "redactor",
    "result_view",
    "settle",
    "skip",
    "unit_of_work",
]


class unit_of_work:
    """Run the body as one unit of work: the calls of declared effects
    (``CrashOverride.effect``) it makes are journaled, and a recovery of a failure in it
    (its replays, its agent code) finds them instead of doing them again::

        with integration.unit_of_work(handler, unit_id=message.id):
            ...  # the unit's code, its recovery included

    ``unit_id`` names the unit beyond this run (a task id, an idempotency key): a later run with
    the same id (a retry, a redelivery) finds what this one did, and does not do it again.
    Opens nothing until some effect is declared in the process: a class, not a generator, so
    that costs one test on every unit's way in and out.
    """

    __slots__ = ("_handler", "_opened", "_unit_id")

    def __init__(self, handler: Handler, unit_id: str | None = None) -> None:
        self._handler = handler
        self._unit_id = unit_id
        self._opened = False

    def __enter__(self) -> None:
        if not _effects.declared:
            return
        unit_id = self._unit_id
        try:
            if unit_id is None:
                _effects.opened(self)
            else:
                _effects.opened_as(self, unit_id, self._handler._app._journal(unit_id))
        except RecursionError:  # no stack left even for this: the unit runs without a journal
            return
        self._opened = True

    def __exit__(self, *exc_info: object) -> None:
        if self._opened:
            self._opened = False
            try:
                _effects.closed(self)
            except RecursionError:  # no stack left even for this: the unit is left to its context
                pass


def effects_declared() -> bool:
    """Whether any effect (``CrashOverride.effect``) was ever declared in this process. Until
    one is, ``unit_of_work`` opens nothing: an entry point's happy path may skip it, and
    computing its unit id, altogether."""
    return _effects.declared


async def awarm_up(handler: Handler) -> bool:
    """Get the process ready for ``handler``'s recoveries (an ASGI lifespan startup, a worker's
    boot): ``CrashOverride.awarm_up`` when a recovery could run at all.

    When no model can be reached with the handler's settings (no API key, client factory or
    ``base_url``: the pipeline's first admission check), every recovery would be refused at
    once, so the Agents SDK is not imported (seconds of startup for nothing); the coordination
    backend's background work (eager fleet fixes) starts either way. Returns whether it
    imported. Its exceptions are the SDK import's (a broken installation).
    """
    from crashoverride._admission.credentials import missing_credentials

    app = handler._app
    if missing_credentials(handler.settings) is not None:
        app._limits().coordination.start()
        return False
    await app.awarm_up()
    return True


class attempt_of:
    """Run the body as a later attempt of ``unit``, a failed unit's (``Block.unit``), from code
    the recovery does not run itself (a task the integration started, say)::

        with integration.attempt_of(block.unit):
            ...  # the failed unit's code, again

    The declared effects (``CrashOverride.effect``) its earlier attempts made are found in its
    journal, not made again. ``unit`` None (no effect is declared): nothing to do.
    """

    __slots__ = ("_attempt", "_unit")

    def __init__(self, unit: _effects.Unit | None) -> None:
        self._unit = unit
        self._attempt: _effects.Attempt | None = None

    def __enter__(self) -> None:
        if self._unit is not None:
            self._attempt = _effects.begin(self._unit, consults=True)

    def __exit__(self, *exc_info: object) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            _effects.end(attempt)


def current_unit() -> _effects.Unit | None:
    """The unit of work open in this context (what a ``Block`` described here belongs to by
    default); None when none is (no effect is declared in the process)."""
    return _effects.current_unit()


def catches(handler: Handler, exc: BaseException) -> bool:
    """Whether ``exc`` is one ``handler`` recovers (its ``catch``; never control flow)."""
    return isinstance(exc, Exception) and isinstance(exc, handler.settings.catch)


def recover(handler: Handler, exc: BaseException, block: Callable[[], Block]) -> Outcome | None:
    """Recover ``exc`` from synchronous code. ``block`` builds the unit's ``Block`` (lazily,
    so a failure to describe it is reported on ``exc`` instead of replacing it)."""
    return handler.recover(exc, block)


async def arecover(
    handler: Handler, exc: BaseException, block: Callable[[], Block]
) -> Outcome | None:
    """Recover ``exc`` from async code, on any anyio backend (asyncio, trio)."""
    return await handler.arecover(exc, block)


def settle(handler: Handler, outcome: Outcome | None, exc: BaseException) -> bool:
    """Record the report on ``handler`` (``handler.report``) and act on the outcome.

    Returns True when ``exc`` is recovered (continue; ``outcome.value`` is the unit's value);
    False to re-raise ``exc``. Raises the agent's replacement exception, or an interrupt agent
    code raised, chained to ``exc``.
    """
    return handler._settle(outcome, exc)


def skip(handler: Handler, exc: BaseException, reason: str, **fields: object) -> None:
    """Record that ``exc`` is not recovered, and why, without running anything: one
    ``recovery.skipped`` event and a note on the exception."""
    from crashoverride._core.recovery import fingerprint
    from crashoverride._observe import events, observers

    name = handler.settings.name or str(fields.pop("kind", "block"))
    # No recovery started, so no recovery's redactor: the handler's (its policy, its key).
    redact = redactor(handler)
    events.emit(
        "warning", events.SKIPPED, **redact.data({
            "reason": reason, "fingerprint": fingerprint(exc),
            "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}", "handler": name,
            **fields,
        }),
    )  # fmt: skip
    add_note(exc, redact(f"crashoverride: recovery skipped: {reason}"))
    observers.skipped(redact(name), redact(reason))


def note(exc: BaseException, text: str) -> None:
    """Add ``text`` to ``exc`` as a note, redacted: a note travels with the application's
    exception wherever it is reported (an exception that refuses notes is left as it is).

    Imports nothing: it says what failed on paths where importing may be what failed."""
    try:
        exc.add_note(scanned(text))
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass


def internal_failure(handler: Handler, exc: BaseException, problem: BaseException) -> None:
    """crashoverride failed while handling ``exc`` (``problem``, caught by the integration):
    one note on ``exc`` and one ``recovery.failed`` event, both redacted by ``handler``'s
    policy; the caller then re-raises ``exc``, untouched otherwise."""
    # No import here: an integration calls this where imports may be what failed.
    _internal_failure(exc, problem, redactor_of(lambda: handler.settings))


def redactor(handler: Handler) -> Redactor:
    """The redaction policy of ``handler`` (its ``is_secret`` tells secret-looking names)."""
    return Redactor.for_settings(handler.settings)


def emit(level: str, event: str, **fields: object) -> None:
    """Emit a structlog event the way the core does (a broken log pipeline never raises)."""
    from crashoverride._observe import events
    from crashoverride._security.redact import scanned_data

    # An integration's fields are its own: they go through the redactor here.
    events.emit(level, scanned(event), **scanned_data(fields))


# The placement helpers are the bridge's own functions, re-exported (one definition: the answer
# an integration gets is the one that picks the placement). Looked up on first use, so
# importing this contract does not load asyncio and anyio.
_FROM_BRIDGE = frozenset({"loop_running_here", "on_asyncio"})


def __getattr__(name: str) -> object:  # typed by the TYPE_CHECKING import above
    if name in _FROM_BRIDGE:
        from crashoverride._placement import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
