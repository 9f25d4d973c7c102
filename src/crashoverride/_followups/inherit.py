"""What a follow-up inherits from the recovery that started it: the one place its settings are made.

Every runner ends in ``_core.followup.run_job`` with the job and the settings of the process
that runs it: in this process (``ThreadRunner``, ``TaskGroupRunner``) those are the recovery's
own settings; in another (``SubprocessRunner``, a Celery worker) the receiving application's.
``run_settings`` makes what the follow-up runs under from the two, the same way for both. A
follow-up never has more rights than its recovery had, nor than the process running it allows:

* **mode**: read-only (diagnose) when the recovery was or the running application is;
  everything a diagnose recovery starts diagnoses.
* **approve=**: the recovery's approver (the handler's, else its application's), the object
  itself where it is at hand, else found again by its reference; asked after the running
  process's own approver when that is another one. When it cannot be found, the job is
  refused: it never runs under the receiving application's approver alone.
* **tracing**: only when both allow it.
* its own budget (timeout, turns), and no block prompt (a follow-up has its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crashoverride._security.approvers import AllOf, reference, resolve
from crashoverride._security.gate import approver_name, changes_allowed

if TYPE_CHECKING:
    from crashoverride._config.settings import Settings
    from crashoverride._followups.job import FollowupJob
    from crashoverride._security.audit import Approver

READ_ONLY = "diagnose"  # the mode of ``_config.settings.MODES`` that changes nothing


class Refused(Exception):
    """This process cannot run the job under its recovery's settings; the message says why."""


def from_recovery(settings: Settings) -> dict[str, Any]:
    """The ``FollowupJob`` fields a recovery running under ``settings`` hands to its follow-ups.

    Its mode travels in the job's report (``report.mode``).
    """
    approve = settings.approve
    return {
        "timeout": settings.followup_timeout,
        "max_turns": settings.max_turns * 2,
        "approver": approver_name(approve) if approve is not None else "",
        "approver_ref": reference(approve) if approve is not None else "",
        "approve": approve,
        "tracing": settings.tracing,
    }


def run_settings(job: FollowupJob, here: Settings) -> Settings:
    """The settings ``job`` runs under in a process whose settings are ``here``.

    Raises:
        Refused: The recovery's approver cannot be applied here.
    """
    both_write = changes_allowed(str(job.report.mode)) and changes_allowed(here.mode)
    approve = _approver(job, here.approve)
    return here.for_handler(
        {
            "prompt": "",
            "timeout": job.timeout,
            "max_turns": job.max_turns,
            "mode": here.mode if both_write else READ_ONLY,
            "approve": approve,
            "tracing": job.tracing and here.tracing,
        }
    )


def _approver(job: FollowupJob, own: Approver | None) -> Approver | None:
    if not job.approver:  # the recovery had none: this process's own, if any, still applies
        return own
    recovery = job.approve  # at hand: the job never left the recovery's process
    if recovery is None:
        if not job.approver_ref:
            raise Refused(
                f"the recovery's approve= ({job.approver}) has no importable name (a lambda, "
                "a closure or a bound method, or it is defined in __main__), so no other "
                "process can ask it: run this follow-up in the recovery's process, or make "
                "the approver a module-level function"
            )
        try:
            recovery = resolve(job.approver_ref)
        except LookupError as exc:
            raise Refused(
                f"the recovery's approve= ({job.approver}) cannot be found in this process: "
                f"{exc}; a follow-up runs only under its recovery's approver"
            ) from None
    if own is None or own is recovery:
        return recovery
    # This process's own approver first: a job cannot bring an approver that replaces it, and
    # one named by a payload is asked only about what this process would allow anyway.
    return AllOf(own, recovery)
