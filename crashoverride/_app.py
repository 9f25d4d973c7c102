"""``CrashOverride``: the application-wide recipe every handler inherits from."""

from __future__ import annotations

import _thread
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._handler import Handler
from ._settings import UNSET, Settings

_new = object.__new__

if TYPE_CHECKING:
    from ._limits import Limits
    from ._redact import Redaction
    from ._report import RecoveryReport


class CrashOverride:
    """Application-wide recovery settings and the shared admission state.

    Create one per process and protect units of work with :meth:`handler`. Nothing heavy is
    imported or created until a protected block raises a matching exception.

    Args:
        project_prompt: Facts about the application every recovery should know.
        model: A model name, an Agents SDK ``Model`` instance, or None for the SDK default.
        catch: Exception class(es) that trigger a recovery. Interrupts, exits and cancellation
            are never caught.
        tools: Application tools (callables or SDK tools) offered to every recovery.
        mcp_servers: Connected Agents SDK MCP servers offered to every recovery.
        system_prompt: Replaces the built-in agent instructions (advanced).
        openai_client_factory: Builds the ``AsyncOpenAI`` client when a recovery starts.
        agent_factory: Builds the SDK ``Agent`` from keyword arguments (advanced).
        api_key: API key; default: ``OPENAI_API_KEY``, read only when a recovery starts.
        base_url: An OpenAI-compatible endpoint (spoken to through chat completions).
        timeout: Wall-clock budget of one recovery, in seconds.
        max_turns: Model turns one recovery may take.
        max_concurrent_recoveries: Recoveries running at once in this process.
        concurrency_wait: Seconds a recovery waits for a free slot before giving up.
        single_flight: Concurrent failures with one fingerprint share one recovery.
        breaker_threshold: Failed recoveries of one fingerprint that open the breaker...
        breaker_window: ...within this many seconds...
        breaker_cooldown: ...for this many seconds, during which recoveries are skipped.
        tracing: Export SDK traces (off by default: tracebacks and locals are sensitive).
        on_recovery: Called with every ``RecoveryReport``; its exceptions are logged, not raised.
        followups: Follow-up objectives run in the background after every recovery that ran an
            agent (see ``crashoverride.followups``).
        followup_runner: Where follow-ups run; default: the current runner (``followups.using``)
            or a supervised thread.
        followup_timeout: Wall-clock budget of one follow-up agent run, in seconds.
        mode: ``"repair"`` (full tools) or ``"diagnose"`` (read-only inspection; the exception
            is always re-raised with the agent's diagnosis attached).
        approve: Called with the code before each snippet the agent runs (sync or async); a
            false result or a string (the reason) denies it and the model is told so.
        allow_source_changes: Let recoveries persist fixes to source files (off by default).
        source_changes: ``"write"`` (edit the file, keep a backup) or ``"patch"`` (write a
            ``.patch`` file for review instead).
        redaction: Extra redaction rules (``crashoverride.Redaction``) on top of the defaults.
    """

    __slots__ = ("_limits_lock", "_limits_state", "_settings")

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
        tracing: bool = False,
        on_recovery: Callable[[RecoveryReport], Any] | None = None,
        followups: str | Sequence[str] = (),
        followup_runner: Any = None,
        followup_timeout: float = 600.0,
        mode: str = "repair",
        approve: Callable[[str], Any] | None = None,
        allow_source_changes: bool = False,
        source_changes: str = "write",
        redaction: Redaction | None = None,
    ) -> None:
        self._settings = Settings.for_app(
            project_prompt=project_prompt,
            model=model,
            catch=catch,
            tools=tools,
            mcp_servers=mcp_servers,
            system_prompt=system_prompt,
            openai_client_factory=openai_client_factory,
            agent_factory=agent_factory,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_turns=max_turns,
            max_concurrent_recoveries=max_concurrent_recoveries,
            concurrency_wait=concurrency_wait,
            single_flight=single_flight,
            breaker_threshold=breaker_threshold,
            breaker_window=breaker_window,
            breaker_cooldown=breaker_cooldown,
            tracing=tracing,
            on_recovery=on_recovery,
            followups=followups,
            followup_runner=followup_runner,
            followup_timeout=followup_timeout,
            mode=mode,
            approve=approve,
            allow_source_changes=allow_source_changes,
            source_changes=source_changes,
            redaction=redaction,
        )
        self._limits_lock = _thread.allocate_lock()
        self._limits_state: Limits | None = None

    if TYPE_CHECKING:
        # The signature users and type checkers see; the runtime one below is the fast path.
        def handler(
            self,
            prompt: str = "",
            *,
            model: Any = UNSET,
            catch: Any = UNSET,
            tools: Sequence[Any] = (),
            mcp_servers: Sequence[Any] = (),
            system_prompt: str | None = UNSET,
            timeout: float = UNSET,
            max_turns: int = UNSET,
            postcondition: Callable[..., Any] | None = None,
            name: str | None = None,
            api_key: str | None = UNSET,
            base_url: str | None = UNSET,
            openai_client_factory: Callable[[], Any] | None = UNSET,
            agent_factory: Callable[..., Any] | None = UNSET,
            tracing: bool = UNSET,
            followup: str = UNSET,
            followups: str | Sequence[str] = (),
            followup_runner: Any = UNSET,
            followup_timeout: float = UNSET,
            mode: str = UNSET,
            approve: Callable[[str], Any] | None = UNSET,
            allow_source_changes: bool = UNSET,
            source_changes: str = UNSET,
        ) -> Handler: ...

    else:

        def handler(self, prompt="", **overrides):
            """A handler for one kind of block: ``with``, ``async with`` or a decorator.

            Tools and MCP servers are added to the application's; every other argument
            overrides the application setting. ``postcondition`` is called after the agent
            finished with a mapping of the block's locals (decorator form: ``result``,
            ``args``, ``kwargs``); it may be async; a false result means not recovered.
            """
            if overrides:
                return Handler(self, prompt, overrides)
            # The common case, ``co.handler(prompt="...")`` in a loop, must cost about as
            # much as ``contextlib.suppress``: build the handler without ``__init__``.
            if type(prompt) is not str:
                return Handler(self, prompt, None)  # raises the ConfigurationError
            handler = _new(Handler)
            handler._app = self
            handler._prompt = prompt
            handler._overrides = None
            handler._settings = None
            handler._reports = None
            return handler

    def _limits(self) -> Limits:
        limits = self._limits_state
        if limits is None:
            with self._limits_lock:
                limits = self._limits_state
                if limits is None:
                    from ._limits import Limits

                    limits = self._limits_state = Limits(self._settings)
        return limits

    def warm_up(self) -> None:
        """Import the Agents SDK now (2-3 s) instead of at the first failure."""
        from ._agent import import_sdk

        import_sdk()

    async def awarm_up(self) -> None:
        """``warm_up`` for async apps (e.g. at lifespan startup): imports in a worker thread."""
        from ._agent import import_sdk
        from ._bridge import in_daemon_thread

        await in_daemon_thread(import_sdk)
