"""What a follow-up inherits from the recovery that started it, wherever it runs.

A follow-up runs under its recovery's mode and approver: in this process (a thread, a task
group), in another process (``SubprocessRunner``) and in a worker (``CeleryRunner``, see
``tests/integrations/test_celery.py``). A process that cannot apply them refuses the job; none
loosens them to its own settings.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, CrashOverride
from crashoverride.followups import (
    FollowupJob,
    SubprocessRunner,
    TaskGroupRunner,
    ThreadRunner,
    run_payload,
)
from crashoverride.testing import Script, StepLike, done, exec_python, tool_call

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_TOOLS = ("eval_python", "exec_python", "inspect_python", "give_up", "spawn_followup")

STATE = {"balance": 100}  # the application's state the follow-ups below try to change
ASKED: list[str] = []  # which of the approvers below were asked


def set_balance(amount: int) -> str:
    """Set the account's balance (an application tool)."""
    STATE["balance"] = amount
    return "done"


def deny_everything(call: ApprovalRequest) -> bool:
    ASKED.append("deny_everything")
    return False


def approve_everything(call: ApprovalRequest) -> bool:
    ASKED.append("approve_everything")
    return True


class DenyAll:
    """A callable approver object, bound to a module-level name."""

    def __call__(self, call: ApprovalRequest) -> str:
        ASKED.append("DENY_ALL")
        return "not today"


DENY_ALL = DenyAll()


class Keep:
    """A job runner that only keeps the jobs (the test runs them elsewhere)."""

    def __init__(self) -> None:
        self.jobs: list[FollowupJob] = []

    def submit_job(self, job: FollowupJob) -> str:
        self.jobs.append(job)
        return job.id


@pytest.fixture(autouse=True)
def _fresh() -> None:
    STATE["balance"] = 100
    ASKED.clear()


CHANGES = {
    "exec_python": exec_python(
        f"__import__({__name__!r}, fromlist=['STATE']).STATE['balance'] = 0"
    ),
    "application tool": tool_call("set_balance", {"amount": 0}),
}


def _declare(*steps: StepLike, **handler: Any) -> tuple[FollowupJob, Any]:
    """A recovery that declares one follow-up, kept for the test; its job and the model.

    The recovery diagnoses (``mode="diagnose"``) or sets ``x``; ``steps`` are the follow-up's.
    """
    diagnose = handler.get("mode") == "diagnose"
    first: StepLike = done("the diagnosis") if diagnose else exec_python("caller['x'] = 1")
    recovery = Script(first) if diagnose else Script(first, done("x set"))
    model = recovery.run(*steps).model()
    keep = Keep()
    co = CrashOverride(model=model, tools=[set_balance], followup_runner=keep)
    # Recovered or not (a diagnosis, a denied snippet), the declared follow-up is submitted.
    with (
        contextlib.suppress(ZeroDivisionError),
        co.handler(followups=["put the balance right"], **handler),
    ):
        1 // 0  # noqa: B018
    (job,) = keep.jobs
    return job, model


# -- mode: diagnose is inherited by what a diagnose recovery starts ------------------------------


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("where", ["thread", "elsewhere"])
def test_a_diagnose_recoverys_followup_cannot_change_the_process(where: str, change: str) -> None:
    model = Script(done("the diagnosis")).run(CHANGES[change], done("balance put right")).model()
    runner = ThreadRunner()
    # The application repairs and brings a tool; only this handler diagnoses.
    keep = Keep()
    co = CrashOverride(
        model=model, tools=[set_balance], followup_runner=runner if where == "thread" else keep
    )
    with capture_logs() as logs:
        with pytest.raises(ZeroDivisionError), co.handler(mode="diagnose", followups=["fix it"]):
            1 // 0  # noqa: B018
        if where == "thread":
            assert runner.join(20) == []
        else:  # another process whose application repairs, with its approval of everything
            (job,) = keep.jobs
            elsewhere = CrashOverride(model=model, tools=[set_balance], approve=approve_everything)
            run_payload(job.to_payload(), elsewhere, runner="test")
    assert STATE == {"balance": 100}
    offered = {tool.name for tool in model.calls[1].tools}
    assert offered == {"inspect_python", "give_up"}
    (failed,) = [e for e in logs if e["event"] == "followup.failed"]
    name = "exec_python" if change == "exec_python" else "set_balance"
    assert f"Tool {name} not found" in failed["reason"]


@pytest.mark.anyio
async def test_a_diagnose_followup_in_a_task_group_cannot_change_the_process(
    anyio_backend: str,
) -> None:
    model = Script(done("the diagnosis")).run(CHANGES["exec_python"], done()).model()
    co = CrashOverride(model=model, tools=[set_balance])
    async with TaskGroupRunner(grace=20):
        with pytest.raises(ZeroDivisionError):
            async with co.handler(mode="diagnose", followups=["fix it"]):
                1 // 0  # noqa: B018
    assert STATE == {"balance": 100}
    assert {tool.name for tool in model.calls[1].tools} == {"inspect_python", "give_up"}


@pytest.mark.parametrize("mode", ["repair", "diagnose"])
def test_a_followups_instructions_name_exactly_the_tools_it_is_offered(mode: str) -> None:
    job, model = _declare(done("nothing to do"), mode=mode)
    run_payload(job.to_payload(), CrashOverride(model=model, tools=[set_balance]), runner="test")
    call = model.calls[-1]
    offered = {tool.name for tool in call.tools}
    told = call.system_instructions
    for name in BUILTIN_TOOLS:
        assert (name in told) == (name in offered), (name, offered)
    # Application tools are offered, and announced, in repair mode only.
    assert ("set_balance" in offered) == (mode == "repair")
    assert ("application tools" in told) == (mode == "repair")


# -- approve=: the recovery's approver follows the job; a process that cannot apply it refuses --


def _tool_calls(logs: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    return [(e["tool"], e["ok"], e["approved_by"]) for e in logs
            if e["event"] == "followup.tool_called"]  # fmt: skip


@pytest.mark.parametrize(
    ("approver", "name", "denied"),
    [
        (deny_everything, "deny_everything", "denied by deny_everything"),
        (DENY_ALL, "DENY_ALL", "denied by DenyAll: not today"),  # a callable object
    ],
)
def test_a_followup_elsewhere_asks_the_handlers_approver_not_only_the_apps(
    approver: Any, name: str, denied: str
) -> None:
    job, model = _declare(CHANGES["exec_python"], done("put right"), approve=approver)
    assert [name] == ASKED  # the recovery's own snippet: denied, so it gave up
    ASKED.clear()
    # The process that runs the job approves everything itself: the handler's no still holds.
    elsewhere = CrashOverride(model=model, approve=approve_everything)
    with capture_logs() as logs:
        result = run_payload(job.to_payload(), elsewhere, runner="test")
    assert STATE == {"balance": 100}
    assert _tool_calls(logs) == [("exec_python", False, denied)]
    assert [(call.tool, call.approved_by) for call in result.tool_calls] == [
        ("exec_python", denied)
    ]
    # Its own approver is asked too: a job cannot bring an approver that replaces it.
    assert ["approve_everything", name] == ASKED


def test_the_receiving_applications_approver_is_never_dropped() -> None:
    job, model = _declare(CHANGES["exec_python"], done(), approve=approve_everything)
    ASKED.clear()
    elsewhere = CrashOverride(model=model, approve=deny_everything)
    with capture_logs() as logs:
        run_payload(job.to_payload(), elsewhere, runner="test")
    assert STATE == {"balance": 100}
    assert _tool_calls(logs) == [("exec_python", False, "denied by deny_everything")]


def test_a_followup_whose_approver_cannot_be_found_elsewhere_is_refused_there() -> None:
    asked: list[str] = []

    def reviewer(call: ApprovalRequest) -> bool:  # a closure: no process can import it
        asked.append(str(call))
        return "STATE" not in call

    job, model = _declare(CHANGES["exec_python"], done(), approve=reviewer)
    calls = len(model.calls)
    forged = ["no_such_module:reviewer", f"{__name__}:no_such_name", f"{__name__}:DenyAll"]
    payloads = [job.to_payload()] + [{**job.to_payload(), "approver_ref": r} for r in forged]
    for payload in payloads:
        elsewhere = CrashOverride(model=model, approve=approve_everything)
        with capture_logs() as logs:
            result = run_payload(payload, elsewhere, runner="test")
        assert not result.succeeded and "reviewer" in result.summary
        assert [e["event"] for e in logs if e["event"].startswith("followup.")] == [
            "followup.failed"
        ]
    assert len(model.calls) == calls and STATE == {"balance": 100}  # no agent ran there
    assert len(asked) == 1  # the recovery's own snippet only


def test_in_process_a_closure_approver_still_applies() -> None:
    def reviewer(call: ApprovalRequest) -> bool:
        return "STATE" not in call

    model = Script(exec_python("caller['x'] = 1"), done()).run(
        CHANGES["exec_python"], done()
    ).model()  # fmt: skip
    runner = ThreadRunner()
    co = CrashOverride(model=model, followup_runner=runner, approve=approve_everything)
    with capture_logs() as logs:
        with co.handler(approve=reviewer, followups=["put it right"]):
            x = 1 // 0
        assert runner.join(20) == []
    assert x == 1 and STATE == {"balance": 100}
    ((tool, ok, by),) = _tool_calls(logs)
    assert (tool, ok) == ("exec_python", False) and by.startswith("denied by") and "reviewer" in by
    assert ASKED == []  # the handler's approver replaces the application's, as in the recovery


SUBPROCESS_APP = """
from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

def reviewer(call):  # the handler's approver in the test: denies writing files
    return "open(" not in call

statements = "open(MARKER, 'w').write(objective)"
co = CrashOverride(model=script(exec_python(statements), done("written")),
                   approve=lambda call: True)
"""


@pytest.mark.slow
def test_a_subprocess_followup_asks_the_handlers_approver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker.txt"
    name = f"fu_reviewed_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(SUBPROCESS_APP.replace("MARKER", repr(str(marker))))
    monkeypatch.syspath_prepend(str(tmp_path))
    app = importlib.import_module(name)
    try:
        _reviewed_in_a_subprocess(tmp_path, name, app.reviewer, marker)
    finally:
        del sys.modules[name]


def _reviewed_in_a_subprocess(tmp_path: Path, name: str, reviewer: Any, marker: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
           "NO_COLOR": "1"}  # fmt: skip
    log = tmp_path / "followup.log"
    runner = SubprocessRunner(f"{name}:co", log_path=log, env=env)
    model = Script(exec_python("caller['v'] = 3"), done("v set")).model()
    co = CrashOverride(model=model, followup_runner=runner, followups=["write the marker"])
    with co.handler(approve=reviewer):
        v = int("three")
    assert v == 3
    codes = runner.join(60)
    text = log.read_text()
    assert list(codes.values()) == [0], text
    assert not marker.exists(), text
    assert "followup.tool_called" in text and "denied by reviewer" in text


# -- tracing: a follow-up is traced only if its recovery and the running process allow it ------


class _Traces:
    """An SDK trace processor that keeps the traces started."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def on_trace_start(self, trace: Any) -> None:
        self.started.append(trace)

    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...
    def on_span_end(self, span: Any) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@pytest.mark.parametrize(("recovery", "running"), [(False, True), (True, True)])
def test_a_followup_is_traced_only_if_its_recovery_was(recovery: bool, running: bool) -> None:
    from agents.tracing import set_trace_processors

    traces = _Traces()
    set_trace_processors([traces])  # type: ignore[list-item]  # nothing leaves the process
    try:
        job, model = _declare(done("nothing to do"), tracing=recovery)
        before = len(traces.started)
        run_payload(job.to_payload(), CrashOverride(model=model, tracing=running), runner="test")
    finally:
        set_trace_processors([])
    assert (len(traces.started) > before) is (recovery and running)
