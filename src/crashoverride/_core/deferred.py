"""What a recovery may need but usually does not: loaded the first time the agent uses it.

The source editor (``_repair.persist``) and the follow-up session (``_followups``) sit behind
these stand-ins, so a recovery that neither persists a fix nor asks for a follow-up does not
import either (an import is milliseconds each, paid on the failure path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crashoverride._security.redact import Redacted

if TYPE_CHECKING:
    from crashoverride._config.settings import Settings
    from crashoverride._followups.session import FollowupSession, Run
    from crashoverride._observe.report import RecoveryReport, SourceChange
    from crashoverride._repair.persist import SourceEditor


class Editor:
    """``persist_function`` / ``persist_file_edit`` of one recovery (``SourceEditor``)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._editor: SourceEditor | None = None

    def _loaded(self) -> SourceEditor:
        if self._editor is None:
            from crashoverride._repair.persist import SourceEditor

            self._editor = SourceEditor(**self._options)
        return self._editor

    @property
    def changes(self) -> list[SourceChange]:
        return self._editor.changes if self._editor is not None else []

    def persist_function(self, func: Any, new_source: str | None = None) -> str:
        """Write ``func``'s new source (default: what it runs now) over its definition on disk."""
        return self._loaded().persist_function(func, new_source)

    def persist_file_edit(self, path: str, old: str, new: str) -> str:
        """Replace the text ``old`` by ``new`` in the file at ``path`` (once, exactly)."""
        return self._loaded().persist_file_edit(path, old, new)


class Followups:
    """The follow-ups of one recovery (``FollowupSession``): loaded by the first request, or at
    the end when the handler declares follow-ups."""

    def __init__(
        self, settings: Settings, recovery_id: str, redact: Callable[[str], Redacted], run: Run
    ) -> None:
        self._settings, self._recovery_id, self._redact = settings, recovery_id, redact
        self._run = run
        self._session: FollowupSession | None = None

    def _loaded(self) -> FollowupSession:
        if self._session is None:
            from crashoverride._followups.session import FollowupSession

            self._session = FollowupSession(
                self._settings, self._recovery_id, self._redact, run=self._run
            )
        return self._session

    def spawn(self, objective: str, context: str = "") -> str:
        return self._loaded().spawn(objective, context)

    def tools(self) -> tuple[Any, ...]:
        """The callable behind the ``spawn_followup`` tool (described in ``_agent.toolbox``)."""

        def spawn_followup(objective: str, context: str = "") -> str:
            return self.spawn(objective, context)

        return (spawn_followup,)

    def conclude(self, report: RecoveryReport) -> list[str]:
        if self._session is None and not self._settings.followups:
            return []  # nothing asked for, nothing declared
        return self._loaded().conclude(report)
