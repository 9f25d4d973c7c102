"""``CrashOverride``: the application-wide recipe every handler inherits from."""

from __future__ import annotations

import _thread
import itertools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from crashoverride._config.settings import UNSET, Settings
from crashoverride._handler import Handler

_new = object.__new__
_MARKS = itertools.count(1)


def _new_mark() -> str:
    # What an exception this instance dealt with carries (``_core.seen``): a string, so the
    # exception still pickles and does not keep the instance alive. Unique per process and
    # instance; another process's instance never matches it.
    return f"{os.getpid()}-{next(_MARKS)}"


if TYPE_CHECKING:
    from crashoverride._admission.coordination import Coordination
    from crashoverride._admission.limits import Limits
    from crashoverride._config.coordination import RedisCoordination
    from crashoverride._config.settings import Settings
    from crashoverride._effects.journal import Journal, Store
    from crashoverride._followups.job import FollowupJob, FollowupResult
    from crashoverride._observe.report import RecoveryReport
    from crashoverride._security.audit import Approver
    from crashoverride._security.redact import Redaction


class CrashOverride:
    """Application-wide recovery settings and the shared admission state.

    Create one per process and protect units of work with :meth:`handler`. Nothing heavy is
    imported or created until a protected block raises a matching exception.

    Args:
        project_prompt: Facts about the application every recovery knows.
        model: A model name, an Agents SDK ``Model`` instance, or None. None: the SDK default.
        catch: Exception class(es) that trigger a recovery. Interrupts, exits and cancellation
            are never caught.
        tools: Tools offered to every recovery. Callables or Agents SDK tools.
        mcp_servers: MCP servers offered to every recovery. Connected Agents SDK MCP servers.
        system_prompt: Replaces the built-in agent instructions. Advanced.
        openai_client_factory: Builds the ``AsyncOpenAI`` client. Called when a recovery starts.
        agent_factory: Builds the SDK ``Agent`` from keyword arguments. Advanced.
        api_key: API key; default: ``OPENAI_API_KEY``. Read only when a recovery starts.
        base_url: An OpenAI-compatible http(s) endpoint. Spoken to through chat completions.
        timeout: Wall-clock budget of one recovery, in seconds.
        max_turns: Model turns one recovery may take.
        max_concurrent_recoveries: Recoveries running at once in this process.
        concurrency_wait: Seconds a recovery waits for a free slot. Then it is skipped.
        single_flight: Concurrent identical failures share one recovery. Identical: same
            fingerprint (exception type and where it was raised).
        breaker_threshold: Failed recoveries of one fingerprint that open its breaker...
        breaker_window: ...within this many seconds...
        breaker_cooldown: ...for this many seconds. Meanwhile its recoveries are skipped.
        patch_watch: Seconds a live patch is watched, and reverted if it makes things worse.
            A patched function that then fails more often than before, or with an exception
            type its old code never raised, gets its old code back (fleet-wide: the fix record
            is revoked). 0: patches are never watched (the docs, "Durable fixes").
        tracing: Export SDK traces (tracebacks and locals are sensitive). Off by default.
        on_recovery: Called with every ``RecoveryReport``. Its exceptions are logged, not raised.
        followups: Objectives run in the background after a recovery. Only after recoveries that
            ran an agent (see ``crashoverride.followups``).
        followup_runner: Where follow-ups run. Default: the current runner (``followups.using``)
            or a supervised thread.
        followup_timeout: Budget of one follow-up run, in seconds. Wall-clock, for its agent run.
        mode: ``"repair"`` or ``"diagnose"`` (read-only). Repair has the full tools; diagnose
            only inspects and always re-raises, with the agent's diagnosis attached.
        approve: Called with every tool call before it runs. It gets an ``ApprovalRequest``
            (a snippet's code or ``tool(arg=value)``, with ``.tool`` and ``.arguments``). Sync
            or async; only a true result approves: ``None``, a false result or a string (the
            reason) denies it, the call does not run and the model is told so.
        allow_source_changes: Let recoveries persist fixes to sources. Off by default.
        source_changes: ``"write"`` or ``"patch"``. Write edits the file and keeps a backup;
            patch writes a ``.patch`` file for review instead.
        redaction: Extra redaction rules on top of the defaults. A ``crashoverride.Redaction``.
        coordination: Who recoveries coordinate with: this process (None) or a fleet. A
            ``crashoverride.RedisCoordination``: one agent run per failure fleet-wide, and
            signed fixes shared by every process (the docs, "Running a fleet").
        recovery_header: Recovered HTTP responses carry a ``crashoverride-recovery`` header.
            Its value is the recovery's id (the one in its events and report), so a client or
            a proxy log can tell a recovered answer from a plain one. False: no header.

    Raises:
        ConfigurationError: An argument is invalid; the error names it.
    """

    __slots__ = ("_effects_store", "_limits_lock", "_limits_state", "_mark", "_settings")

    # The arguments of __init__ and handler mirror the settings table in ``_config.settings``
    # (names, order, defaults, annotations), spelled out so type checkers, IDEs and help() see
    # them; the values are checked by the table, and tests/config/test_settings_table.py fails
    # if a mirror drifts.

    def __init__(
        self,
        *,
        project_prompt: str = "",
        model: Any = None,
        catch: type[Exception] | tuple[type[Exception], ...] = Exception,
        tools: Sequence[Any] = (),
        mcp_servers: Sequence[Any] = (),
        system_prompt: str | None = None,
        openai_client_factory: Callable[[], Any] | None = None,
        agent_factory: Callable[..., Any] | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 120.0,
        max_turns: int = 20,
        max_concurrent_recoveries: int = 4,
        concurrency_wait: float = 30.0,
        single_flight: bool = True,
        breaker_threshold: int = 3,
        breaker_window: float = 300.0,
        breaker_cooldown: float = 600.0,
        patch_watch: float = 300.0,
        tracing: bool = False,
        on_recovery: Callable[[RecoveryReport], Any] | None = None,
        followups: str | Sequence[str] = (),
        followup_runner: Any = None,
        followup_timeout: float = 600.0,
        mode: str = "repair",
        approve: Approver | None = None,
        allow_source_changes: bool = False,
        source_changes: str = "write",
        redaction: Redaction | None = None,
        coordination: RedisCoordination | None = None,
        recovery_header: bool = True,
    ) -> None:
        arguments = dict(locals())  # exactly the parameters: nothing else is bound yet
        del arguments["self"]
        self._settings = Settings.for_app(**arguments)
        self._limits_lock = _thread.allocate_lock()
        self._limits_state: Limits | None = None
        self._effects_store: Store | None = None
        self._mark = _new_mark()

    def __reduce__(self) -> tuple[Callable[[Settings], CrashOverride], tuple[Settings]]:
        # Frameworks pickle and deep-copy what holds an instance (Celery pickles its app, whose
        # ``conf`` holds ours). A copy has the same settings and admission state of its own:
        # limits, flights and a fleet connection belong to the process that made them.
        return _restored, (self._settings,)

    if TYPE_CHECKING:
        # The signature type checkers see; the runtime one below is the fast path.
        def handler(
            self,
            prompt: str = "",
            *,
            model: Any = UNSET,
            catch: type[Exception] | tuple[type[Exception], ...] = UNSET,
            tools: Sequence[Any] = (),
            mcp_servers: Sequence[Any] = (),
            system_prompt: str | None = UNSET,
            openai_client_factory: Callable[[], Any] | None = UNSET,
            agent_factory: Callable[..., Any] | None = UNSET,
            api_key: str | None = UNSET,
            base_url: str | None = UNSET,
            timeout: float = UNSET,
            max_turns: int = UNSET,
            tracing: bool = UNSET,
            postcondition: Callable[..., Any] | None = None,
            name: str | None = None,
            followups: str | Sequence[str] = (),
            followup: str = UNSET,
            followup_runner: Any = UNSET,
            followup_timeout: float = UNSET,
            mode: str = UNSET,
            approve: Approver | None = UNSET,
            allow_source_changes: bool = UNSET,
            source_changes: str = UNSET,
        ) -> Handler: ...

    else:

        def handler(self, prompt="", **overrides):
            """A handler for one kind of block: ``with``, ``async with`` or a decorator.

            Takes every ``CrashOverride`` argument except the process-wide ones (admission,
            the breaker, ``project_prompt``, ``on_recovery``, ``redaction``): ``tools``,
            ``mcp_servers`` and ``followups`` are added to the application's, the others
            override it. And these, for this handler only:

            Args:
                prompt: What the protected block must achieve.
                postcondition: Judges the block's locals after the agent. Called (it may be
                    async) with a mapping of the block's locals (decorator form: ``result``,
                    ``args``, ``kwargs``); only a true result means recovered (``None`` does
                    not; the docs, "What a check's result means").
                name: The handler's name in events and reports.
                followup: One follow-up objective, added like ``followups``.
                **overrides: The ``CrashOverride`` arguments above.

            Raises:
                ConfigurationError: An argument is invalid or unknown; the error names it.
            """
            if overrides:
                return Handler(self, prompt, overrides)
            # The common case, ``co.handler(prompt="...")`` in a loop, must cost about as
            # much as ``contextlib.suppress``: build the handler without ``__init__``.
            if type(prompt) is not str:
                return Handler(self, prompt, None)  # raises the ConfigurationError
            handler = _new(Handler)
            handler._app = self
            handler._settings = prompt  # the settings are made of it when first needed
            handler._mark = -1  # _handler._IDLE
            return handler

    def effect(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        key: Callable[..., Any] | None = None,
        probe: Callable[..., Any] | None = None,
    ) -> Any:
        """Declare ``func`` a side effect: its calls change the outside world.

        Use as ``@co.effect``, ``@co.effect(key=..., probe=...)`` or ``co.effect(func, ...)``;
        sync and async functions alike. Within a unit of work (a ``with`` block, a decorated
        call, a request, a task, a follow-up) every call is journaled. When the unit runs again
        (a replay, the agent's own code, a Celery retry or redelivery, a client retry with the
        same ``Idempotency-Key``), a call already done returns its recorded result without
        running; one begun and never seen to end asks ``probe``, or raises
        ``crashoverride.EffectUncertain``; one that raised runs again.

        Args:
            func: The function (or leave it out to get a decorator).
            key: Names one call, called with its arguments: ``lambda order, amount: order.id``.
                Default: the function and a digest of its arguments' values. The n-th call with
                a key in a replay is the n-th call with it in the first run.
            probe: Asks the outside world whether an interrupted call happened, called with
                its arguments: returns the call's result if it did, ``crashoverride.NOT_DONE``
                if it did not (then the call runs).

        Raises:
            ConfigurationError: ``func``, ``key`` or ``probe`` is not callable, or ``func`` is a
                generator function.
        """
        from crashoverride._effects import journal
        from crashoverride._effects.effect import Effect, wrap

        def declare(target: Callable[..., Any]) -> Callable[..., Any]:
            wrapped = wrap(Effect(target, key, probe))
            journal.declared = True  # from now on entry points open units of work
            return wrapped

        return declare if func is None else declare(func)

    def _journal(self, unit_id: str) -> Journal:
        """The journal of the unit of work ``unit_id`` (a task id, an idempotency key), from
        where this application keeps them: this process (bounded: ``MemoryStore``), or Redis
        with ``RedisCoordination``, so a retry or redelivery on another process finds it.

        Chosen here, as ``_coordinate`` chooses admission's backend."""
        store = self._effects_store
        if store is None:
            with self._limits_lock:
                store = self._effects_store
                if store is None:
                    store = self._effects_store = self._new_store()
        return store.journal(unit_id)

    def _new_store(self) -> Store:
        option = self._settings.coordination
        if option is None:
            from crashoverride._effects.journal import MemoryStore

            return MemoryStore()
        from crashoverride._fleet.effects import RedisStore

        return RedisStore(option, self._settings)

    @staticmethod
    async def _run_followup(job: FollowupJob, settings: Settings, runner: str) -> FollowupResult:
        """How a follow-up a recovery asked for runs, once its runner starts it (handed to each
        recovery record: the core's records sit below the follow-up machinery)."""
        from crashoverride._core.followup import run_job

        return await run_job(job, settings, runner)

    def _coordinate(self, limits: Limits) -> Coordination:
        """The admission backend: this process, or the fleet (through Redis) when configured.

        Chosen here, in the composition root: admission does not know the fleet exists."""
        from crashoverride._admission.coordination import InProcess

        local = InProcess(limits)
        if self._settings.coordination is None:
            return local
        from crashoverride._fleet.backend import Fleet

        return Fleet(self._settings.coordination, local, self._settings)

    def _limits(self) -> Limits:
        limits = self._limits_state
        if limits is None:
            with self._limits_lock:
                limits = self._limits_state
                if limits is None:
                    from crashoverride._admission.limits import Limits

                    limits = self._limits_state = Limits(self._settings, self._coordinate)
        return limits

    def warm_up(self) -> None:
        """Import the Agents SDK now (2-3 s) instead of at the first failure.

        With ``RedisCoordination(apply_fixes="eager")``, also start applying the fleet's fixes.
        """
        self._limits().coordination.start()
        _import_machinery()

    async def awarm_up(self) -> None:
        """``warm_up`` for async apps (e.g. at lifespan startup): imports in a worker thread."""
        from crashoverride._placement.waiting import in_daemon_thread

        self._limits().coordination.start()
        await in_daemon_thread(_import_machinery)


def _import_machinery() -> None:
    """The recovery machinery and the SDK, imported (and the SDK's first-run costs paid)."""
    from crashoverride._agent.run import import_sdk
    from crashoverride._core import pipeline  # noqa: F401  (the rest of the recovery machinery)

    import_sdk()


def _restored(settings: Settings) -> CrashOverride:
    """A ``CrashOverride`` with ``settings`` and fresh admission state (unpickled or copied)."""
    co: CrashOverride = _new(CrashOverride)
    co._settings = settings
    co._limits_lock = _thread.allocate_lock()
    co._limits_state = None
    co._effects_store = None
    co._mark = _new_mark()
    return co
