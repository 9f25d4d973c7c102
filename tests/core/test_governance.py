"""Controls on what a recovery may do: diagnose mode, approval, audit trail, redaction."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from crashoverride import ConfigurationError, CrashOverride, Redaction
from crashoverride.testing import (
    MockServer,
    done,
    eval_python,
    exec_python,
    inspect_python,
    script,
    tool_outputs,
)


def broken_total(items: list[int]) -> int:
    return sum(items) + int("n/a")


def test_diagnose_mode_reraises_with_the_diagnosis_and_cannot_mutate() -> None:
    model = script(
        inspect_python("show_source(broken_total)"),
        inspect_python("items.append(99)"),
        inspect_python("len(items)"),
        done("Root cause: broken_total adds int('n/a'); drop that term."),
    )
    co = CrashOverride(model=model, mode="diagnose")
    items = [1, 2]
    handler = co.handler()
    with pytest.raises(ValueError) as info:
        with handler:
            broken_total(items)
    assert items == [1, 2]
    notes = "\n".join(info.value.__notes__)
    assert "diagnose mode; diagnosis: Root cause: broken_total adds int('n/a')" in notes
    report = handler.report
    assert report is not None and report.outcome == "failed" and report.mode == "diagnose"
    assert report.diagnosis.startswith("Root cause")
    source, appended, length = tool_outputs(model)
    assert "def broken_total" in source
    # The append ran in a forked snapshot (tests/diagnose/test_readonly.py): the list is intact.
    assert appended == "OK (no output, no value)"
    assert length == "2"
    tools = {t.name for t in model.calls[0].tools}
    assert tools == {"inspect_python", "give_up"}  # no exec, no eval, no follow-ups


def test_approve_denies_and_the_model_is_told() -> None:
    seen: list[str] = []

    def reviewer(code: str) -> bool | str:
        seen.append(code)
        return "no file access" if "open(" in code else True

    model = script(
        exec_python("open('/etc/hostname').read()"),
        exec_python("caller['value'] = 7"),
        done(),
    )
    co = CrashOverride(model=model, approve=reviewer)
    value = None
    handler = co.handler()
    with capture_logs() as logs, handler:
        raise ValueError
    assert value == 7
    assert seen == ["open('/etc/hostname').read()", "caller['value'] = 7"]
    denied, allowed = tool_outputs(model)
    assert allowed == "OK (no output, no value)"
    assert denied.startswith("Not run: denied by test_approve_denies_and_the_model_is_told.")
    assert "no file access" in denied
    report = handler.report
    assert report is not None
    trail = [(c.code, c.ok, c.approved_by) for c in report.tool_calls]
    name = reviewer.__qualname__
    assert trail == [
        ("open('/etc/hostname').read()", False, f"denied by {name}: no file access"),
        ("caller['value'] = 7", True, f"approved by {name}"),
    ]
    events = [(e["code"], e["approved_by"]) for e in logs if e["event"] == "recovery.tool_called"]
    assert events == [(code, by) for code, _, by in trail]  # same trail, same order


@pytest.mark.anyio
async def test_async_approve_runs_on_the_app_loop(anyio_backend: str) -> None:
    import anyio

    async def reviewer(code: str) -> bool:
        await anyio.lowlevel.checkpoint()
        return "delete" not in code

    model = script(exec_python("caller['n'] = 1"), done())
    co = CrashOverride(model=model, approve=reviewer)
    n = 0
    async with co.handler():
        raise ValueError
    assert n == 1


def test_without_approve_the_audit_says_so() -> None:
    model = script(exec_python("caller['fixed'] = True"), done())
    handler = CrashOverride(model=model).handler()
    with handler:
        raise ValueError
    assert handler.report is not None
    assert handler.report.tool_calls[0].approved_by == "not required (no approve= configured)"


def test_redaction_policy_validation() -> None:
    with pytest.raises(ConfigurationError, match="patterns"):
        Redaction(patterns=["("])
    with pytest.raises(ConfigurationError, match="names"):
        Redaction(names="token")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="redaction"):
        CrashOverride(redaction="strict")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="mode"):
        CrashOverride(mode="yolo")
    with pytest.raises(ConfigurationError, match="source_changes"):
        CrashOverride(source_changes="push")


def test_planted_secrets_never_reach_the_model_events_or_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BILLING_API_KEY", "env-secret-4242-abcd")
    policy = Redaction(names=[r"^pin$"], patterns=[r"acct-\d{6}"], values=["plain-secret-xyz"])
    leak = (
        "print(BILLING)\n"
        "print(password, pin, note)\n"
        "import os\nprint(os.environ['BILLING_API_KEY'])\n"
        "caller['ok'] = True"
    )
    with MockServer([eval_python("error"), exec_python(leak), done()]) as server:
        co = CrashOverride(model="m", base_url=server.base_url, api_key="sk-the-api-key-1",
                           redaction=policy)  # fmt: skip
        password = "hunter2-password"
        pin = "987654"
        note = "customer acct-123456 wrote plain-secret-xyz"
        ok = False
        handler = co.handler()
        with capture_logs() as logs, handler:
            raise RuntimeError(f"auth failed for {password} / {note} / env-secret-4242-abcd")
        bodies = json.dumps([r.body for r in server.requests])
        headers = json.dumps([r.headers for r in server.requests])
    assert ok is True and pin == "987654"  # `pin` is read by the agent's code above
    report = handler.report
    everything = bodies + json.dumps(logs, default=str) + repr(report)
    for secret in ("env-secret-4242-abcd", "hunter2-password", "987654", "acct-123456",
                   "plain-secret-xyz"):  # fmt: skip
        assert secret not in everything, secret
    assert "[REDACTED]" in bodies
    assert "sk-the-api-key-1" not in bodies  # the key travels only as the auth header
    assert "sk-the-api-key-1" in headers


BILLING = "harmless"
