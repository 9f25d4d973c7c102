"""What the pipeline needs from a record: the contract ``Recovery`` and ``FollowupRecord`` keep.

The pipeline (``_core.pipeline``) takes the same steps for a recovery and for a follow-up; each
brings its own record, which does the bookkeeping and gives the run its conclusion: a
``Decision`` for a recovery, a ``FollowupResult`` for a follow-up. The pipeline returns whatever
its record concludes, so the conclusion's type is the protocol's parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from crashoverride._effects.journal import Unit

if TYPE_CHECKING:
    from crashoverride._agent.run import AgentJob
    from crashoverride._agent.state import AgentRun, RunState
    from crashoverride._config.settings import Settings
    from crashoverride._core.block import Block
    from crashoverride._placement.deadline import Deadline

Conclusion = TypeVar("Conclusion", covariant=True)


class Record(Protocol[Conclusion]):
    """One run through the pipeline, seen from the pipeline (``_core.entry.admit`` too)."""

    id: str  # marks the jobs run for it (``pipeline.inside``)
    settings: Settings
    deadline: Deadline  # the one budget of every step
    state: RunState  # what the agent decided
    block: Block | None  # None once released
    unit: Unit  # the unit of work whose journal its jobs consult (``_effects``)
    running: bool  # an agent run started

    def prepare(self) -> AgentJob:
        """Step 4, in the owner's thread: the agent's namespace and texts."""
        ...

    def started(self, placement: str) -> None:
        """Step 5 begins, on ``placement``."""
        ...

    def concluded(self, run: AgentRun, verdict: str | None) -> Conclusion:
        """The agent run ended; ``verdict`` is None when the block's evidence holds."""
        ...

    def timed_out(self, what: str = "") -> Conclusion:
        """The deadline passed (``what``: the step it passed in, if not the agent run)."""
        ...


if TYPE_CHECKING:
    from crashoverride._core.followup import FollowupRecord
    from crashoverride._core.recovery import Decision, Recovery
    from crashoverride._followups.job import FollowupResult

    def _conforming(
        recovery: Recovery, followup: FollowupRecord
    ) -> tuple[Record[Decision], Record[FollowupResult]]:
        """Both records keep the contract: ``mypy --strict`` checks this, nothing calls it."""
        return recovery, followup
