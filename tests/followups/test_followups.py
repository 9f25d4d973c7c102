"""Follow-up jobs: requested by the agent or declared, run off the critical path, supervised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, ConfigurationError, CrashOverride
from crashoverride.followups import (
    FollowupJob,
    SubprocessRunner,
    TaskGroupRunner,
    ThreadRunner,
    render_report,
    run_payload,
    using,
)
from crashoverride.testing import Script, done, exec_python, give_up, script, spawn_followup

ROOT = Path(__file__).resolve().parents[2]


def _events(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e.get("origin", "")) for e in logs if e["event"].startswith("followup.")]


def _inputs(model: Any) -> str:
    return "\n".join(str(call.input) for call in model.calls)


def test_agent_and_handler_followups_run_in_a_supervised_thread() -> None:
    model = (
        Script(
            spawn_followup("write a patch", "saw X"),
            exec_python("spawn_followup('open a ticket')\nset_result(7)"),
            done("returned 7 after a key rename"),
        )
        .run(exec_python("print(objective)"), done("first follow-up done"))
        .run(exec_python("print(objective)"), done("second follow-up done"))
        .run(exec_python("print(objective)"), done("third follow-up done"))
        .model()
    )
    runner = ThreadRunner(grace=10)
    # One job at a time: the scripted model is shared, so runs must not interleave.
    co = CrashOverride(model=model, followup_runner=_Serial(runner))

    @co.handler("Return the count.", followup="alert the on-call")
    def count() -> int:
        raise KeyError("count")

    with capture_logs() as logs:
        assert count() == 7
        assert runner.join(10) == []
    events = _events(logs)
    assert events.count(("followup.submitted", "handler")) == 1
    assert events.count(("followup.submitted", "agent")) == 2
    assert [e for e, _ in events].count("followup.succeeded") == 3
    ids = {e["followup_id"] for e in logs if e["event"] == "followup.succeeded"}
    assert len(ids) == 3 and all(i.startswith("fu_") for i in ids)
    # Each follow-up agent received the report: traceback, executed code and diagnosis.
    text = _inputs(model)
    for piece in ("KeyError", "open a ticket", "returned 7 after a key rename",
                  "saw X", "alert the on-call"):  # fmt: skip
        assert piece in text


class _Serial:
    """A runner that runs each job to its end before accepting the next (shared model)."""

    def __init__(self, inner: ThreadRunner) -> None:
        self.inner = inner

    def submit(self, fn: Any, *, name: str) -> str:
        self.inner.join(10)
        tracked = self.inner.submit(fn, name=name)
        self.inner.join(10)
        return tracked


def test_failed_followup_and_refused_submission_do_not_disturb_the_recovery() -> None:
    class Refusing:
        def submit(self, fn: Any, *, name: str) -> str:
            raise RuntimeError("queue full")

    model = script(exec_python("caller['value'] = 1"), done())
    co = CrashOverride(model=model, followup_runner=Refusing(), followups=["open a ticket"])
    with capture_logs() as logs:
        with co.handler():
            value = int("x")
    assert value == 1
    failed = [e for e in logs if e["event"] == "followup.failed"]
    assert len(failed) == 1 and "queue full" in failed[0]["reason"]

    model = Script(exec_python("caller['value'] = 2"), done()).run(give_up("no tracker")).model()
    runner = ThreadRunner()
    co = CrashOverride(model=model, followup_runner=runner, followups=["open a ticket"])
    with capture_logs() as logs:
        with co.handler():
            value = int("y")
        assert runner.join(10) == []
    assert value == 2
    failed = [e for e in logs if e["event"] == "followup.failed"]
    assert len(failed) == 1 and "gave up: no tracker" in failed[0]["reason"]


def test_no_declared_followup_without_an_agent_run() -> None:
    model = script(give_up("no"))
    runner = ThreadRunner()
    co = CrashOverride(model=model, followup_runner=runner, followups=["ticket"],
                       breaker_threshold=1)  # fmt: skip
    with capture_logs() as logs:
        for _ in range(2):  # the second failure is skipped: the breaker opened
            with pytest.raises(ValueError), co.handler():
                int("z")
        runner.join(10)
    # The failed recovery ran an agent: its follow-up ran (and failed: no steps left).
    assert [e["event"] for e in logs if e["event"] == "followup.submitted"] == [
        "followup.submitted"
    ]


@pytest.mark.anyio
async def test_task_group_runner_awaits_followups_on_exit(anyio_backend: str) -> None:
    model = (
        Script(exec_python("caller['page'] = 'ok'"), done())
        .run(
            exec_python("await __import__('anyio').sleep(0.2)\nprint('patched')"),
            done("patch written"),
        )
        .model()
    )
    co = CrashOverride(model=model, followups=["write the permanent fix"])
    with capture_logs() as logs:
        async with TaskGroupRunner(grace=20) as runner:
            async with co.handler():
                page = {}["missing"]
            assert page == "ok"
            assert len(runner.running) == 1  # outlives the block that spawned it
        assert runner.running == []
    assert [e for e, _ in _events(logs)] == [
        "followup.submitted",
        "followup.started",
        "followup.tool_called",
        "followup.succeeded",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_task_group_runner_cuts_off_after_grace(anyio_backend: str) -> None:
    model = (
        Script(exec_python("caller['page'] = 'ok'"), done())
        .run(exec_python("await __import__('anyio').sleep(60)"))
        .model()
    )
    co = CrashOverride(model=model, followups=["investigate deeper"])
    began = time.monotonic()
    with capture_logs() as logs:
        async with TaskGroupRunner(grace=0.5):
            async with co.handler():
                page = {}["missing"]
            assert page == "ok"
            with anyio.fail_after(10):
                while not model.calls[2:]:  # noqa: ASYNC110 - polling the shared model's log
                    await anyio.sleep(0.01)
    assert time.monotonic() - began < 10
    failed = [e for e in logs if e["event"] == "followup.failed"]
    assert len(failed) == 1 and failed[0]["cut_off"] is True


@pytest.mark.anyio
async def test_using_makes_a_runner_current(anyio_backend: str) -> None:
    model = Script(exec_python("caller['x'] = 1"), done()).run(done("noted")).model()
    co = CrashOverride(model=model, followups=["note it"])
    submitted: list[str] = []

    class Recording:
        def submit_job(self, job: FollowupJob) -> str:
            submitted.append(job.objective)
            return job.id

    with using(Recording()):
        async with co.handler():
            x = 1 // 0
    assert (x, submitted) == (1, ["note it"])


SCRIPT = """
import sys
from crashoverride import CrashOverride
from crashoverride.followups import ThreadRunner
from crashoverride.testing import Script, done, exec_python

mode, grace = sys.argv[1], float(sys.argv[2])
# The job outlives the main code either way: only the exit hook decides how it ends.
work = f"import time; time.sleep({60 if mode == 'cutoff' else 1})"
model = Script(exec_python("caller['x'] = 1"), done("set x")).run(
    exec_python(work), done("ticket done")  # the follow-up's own run
).model()
co = CrashOverride(model=model, followup_runner=ThreadRunner(grace=grace))
with co.handler("Leave x set.", followup="write the ticket"):
    x = 1 / 0
sys.stdout.write(f"script end {x}\\n")  # one write: log lines from the job thread interleave
sys.stdout.flush()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "grace"), [("finish", 20.0), ("cutoff", 0.5)])
def test_sync_script_followup_finishes_or_is_reported_cut_off(
    tmp_path: Path, mode: str, grace: float
) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script), mode, str(grace)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "script end 1" in out
    tail = out[out.index("script end") :]
    if mode == "finish":
        assert "followup.succeeded" in tail and "followup.failed" not in out
    else:
        assert "followup.failed" in tail and "cut_off" in tail and "cut off" in tail
        assert "followup.succeeded" not in out
        assert time.monotonic() - began < 30  # bounded grace, not the job's 60 s


FOLLOWUP_APP = """
from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

statements = "open(MARKER, 'w').write(objective + '|' + report.exc_type)"
co = CrashOverride(model=script(exec_python(statements), done("marker written")))
"""


@pytest.mark.slow
def test_subprocess_runner_runs_the_job_in_a_detached_process(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    (tmp_path / "fu_app.py").write_text(FOLLOWUP_APP.replace("MARKER", repr(str(marker))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "NO_COLOR": "1"}  # fmt: skip
    log = tmp_path / "followup.log"
    runner = SubprocessRunner("fu_app:co", log_path=log, env=env)
    model = script(exec_python("caller['v'] = 3"), done("v set"))
    co = CrashOverride(model=model, followup_runner=runner, followups=["file the ticket"])
    with co.handler():
        v = int("three")
    assert v == 3
    codes = runner.join(60)
    assert list(codes.values()) == [0], log.read_text()
    assert marker.read_text() == "file the ticket|builtins.ValueError"
    text = log.read_text()
    assert "followup.started" in text and "followup.succeeded" in text


def test_job_payload_round_trip_and_report_text() -> None:
    model = script(exec_python("caller['n'] = 5"), done("parsed by hand"))
    seen: list[FollowupJob] = []

    class Keep:
        def submit_job(self, job: FollowupJob) -> str:
            seen.append(job)
            return job.id

    co = CrashOverride(model=model, followup_runner=Keep(), followups="keep it")
    with co.handler():
        n = int("five")
    assert n == 5
    (job,) = seen
    again = FollowupJob.from_payload(json.loads(json.dumps(job.to_payload())))
    assert again == job
    text = render_report(job.report)
    assert "invalid literal for int()" in text and "caller['n'] = 5" in text
    assert "parsed by hand" in text


def test_settings_are_validated_eagerly() -> None:
    with pytest.raises(ConfigurationError):
        CrashOverride(followup_runner=object())
    with pytest.raises(ConfigurationError):
        CrashOverride(followups=[""])
    with pytest.raises(ConfigurationError):
        CrashOverride().handler(followup=3)  # type: ignore[arg-type]
    handler = CrashOverride(followups=["a"]).handler(followup="b", followups=["a", "c"])
    assert set(handler.settings.followups) == {"a", "b", "c"}


# -- the gate, in every runner: the recovery's mode, its approver, the audit trail --------------

MARKS: list[str] = []  # follow-up agent code of the tests below appends here


def _mark(text: str) -> str:
    """A snippet that leaves ``text`` in ``MARKS`` (a follow-up's globals are its own)."""
    return f"__import__({__name__!r}, fromlist=['MARKS']).MARKS.append({text!r})"


@pytest.mark.anyio
async def test_in_process_runners_use_the_handlers_approver(anyio_backend: str) -> None:
    asked: list[tuple[str, str]] = []

    def reviewer(call: ApprovalRequest) -> bool:
        asked.append((call.tool, str(call)))
        return "MARKS" not in call  # the follow-up's snippet is denied

    model = script(
        exec_python("caller['x'] = 1"), done(), exec_python(_mark(anyio_backend)), done("noted")
    )
    co = CrashOverride(model=model)  # the application has no approver: the handler's applies
    with capture_logs() as logs:
        async with TaskGroupRunner(grace=20):
            async with co.handler(approve=reviewer, followups=["note it"]):
                x = 1 // 0
    assert x == 1
    assert anyio_backend not in MARKS  # denied, so never run
    assert [tool for tool, _ in asked] == ["exec_python", "exec_python"]
    (called,) = [e for e in logs if e["event"] == "followup.tool_called"]
    assert (called["tool"], called["ok"]) == ("exec_python", False)
    assert called["approved_by"].startswith("denied by")


def test_a_diagnose_handlers_followups_are_read_only_too() -> None:
    jobs: list[FollowupJob] = []

    class Keep:
        def submit_job(self, job: FollowupJob) -> str:
            jobs.append(job)
            return job.id

    model = script(done("the diagnosis"), exec_python(_mark("diagnose")), done())
    co = CrashOverride(model=model, mode="diagnose", followups=["fix it"], followup_runner=Keep())
    with pytest.raises(ZeroDivisionError), co.handler():
        1 // 0  # noqa: B018
    (job,) = jobs
    result = run_payload(job.to_payload(), CrashOverride(model=model), runner="test")
    assert "diagnose" not in MARKS  # no code of the follow-up ran
    assert not result.succeeded
    assert {tool.name for tool in model.calls[1].tools} == {"inspect_python", "give_up"}


def test_a_job_from_a_handler_with_an_approver_never_runs_unapproved_elsewhere() -> None:
    # The handler's approver cannot travel with the job; a process without one refuses it.
    jobs: list[FollowupJob] = []

    class Keep:
        def submit_job(self, job: FollowupJob) -> str:
            jobs.append(job)
            return job.id

    model = script(exec_python("caller['x'] = 1"), done(), exec_python(_mark("far")))
    co = CrashOverride(model=model, followups=["note it"], followup_runner=Keep())
    x = 0
    with co.handler(approve=lambda call: True):
        x = 1 // 0
    assert x == 1
    (job,) = jobs
    elsewhere = CrashOverride(model=model)  # the worker's application: no approver
    with capture_logs() as logs:
        result = run_payload(job.to_payload(), elsewhere, runner="test")
    assert "far" not in MARKS and len(model.calls) == 2  # no agent ran there
    assert not result.succeeded and "approve=" in result.summary
    assert [e["event"] for e in logs if e["event"].startswith("followup.")] == ["followup.failed"]
