"""One gate, one audit trail: every tool call of every kind (built-in, application, MCP,
follow-up) is shown to ``approve=`` with its name and arguments before it runs, a denied call
never runs, and every call is in ``report.tool_calls`` and a ``*.tool_called`` event."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, CrashOverride
from crashoverride._core.followup import run_job_sync
from crashoverride.followups import FollowupJob
from crashoverride.testing import (
    Script,
    done,
    exec_python,
    give_up,
    script,
    tool_call,
    tool_outputs,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Probe:
    """An application tool with a side effect we can count, and approvers that log what they saw."""

    def __init__(self) -> None:
        self.refunded: list[int] = []
        self.seen: list[ApprovalRequest] = []

    def refund(self, order_id: int) -> str:
        """Refund an order."""
        self.refunded.append(order_id)
        return f"refunded {order_id}"

    def deny_all(self, call: ApprovalRequest) -> bool:
        self.seen.append(call)
        return False

    def allow_all(self, call: ApprovalRequest) -> bool:
        self.seen.append(call)
        return True


def _tool_events(logs: list[dict[str, Any]], name: str = "recovery.tool_called") -> list[Any]:
    return [(e["tool"], e["source"], e["ok"], e["approved_by"]) for e in logs if e["event"] == name]


# -- application tools -------------------------------------------------------------------------


def test_a_denied_application_tool_does_not_run_and_is_audited() -> None:
    probe = Probe()
    model = script(tool_call("refund", {"order_id": 42}), give_up("refunds are denied"))
    co = CrashOverride(model=model, tools=[probe.refund], approve=probe.deny_all)
    handler = co.handler()
    with capture_logs() as logs, pytest.raises(ValueError), handler:
        raise ValueError("payment failed")
    assert probe.refunded == []  # the side effect never happened
    (asked, gave_up) = probe.seen
    assert (asked, asked.tool) == ("refund(order_id=42)", "refund")
    assert dict(asked.arguments) == {"order_id": 42}
    assert (asked.source, asked.is_code) == ("application", False)
    assert gave_up.tool == "give_up"  # built-in control tools pass the same gate
    assert tool_outputs(model)[0].startswith("Not run: denied by Probe.deny_all.")
    report = handler.report
    assert report is not None
    by = "denied by Probe.deny_all"
    trail = [(c.tool, c.source, c.ok, c.approved_by) for c in report.tool_calls]
    assert trail[0] == ("refund", "application", False, by)
    assert report.tool_calls[0].code == "refund(order_id=42)"
    assert _tool_events(logs) == trail  # the same trail, in the same order


@pytest.mark.anyio
async def test_an_async_approver_gates_application_tools_on_the_apps_loop(
    anyio_backend: str,
) -> None:
    import anyio

    probe = Probe()
    approvals: list[str] = []

    async def reviewer(call: ApprovalRequest) -> bool:
        await anyio.lowlevel.checkpoint()  # runs on the application's loop (asyncio or trio)
        approvals.append(call.tool)
        return call.tool != "refund"

    model = script(
        tool_call("refund", {"order_id": 4}), exec_python("caller['n'] = 1"), done()
    )  # fmt: skip
    co = CrashOverride(model=model, tools=[probe.refund], approve=reviewer)
    n = 0
    async with co.handler():
        raise ValueError
    assert n == 1 and probe.refunded == [] and approvals == ["refund", "exec_python"]


def test_an_approved_application_tool_runs_and_its_result_is_audited() -> None:
    probe = Probe()
    model = script(
        tool_call("refund", {"order_id": 7}), exec_python("caller['settled'] = True"), done()
    )
    co = CrashOverride(model=model, tools=[probe.refund], approve=probe.allow_all)
    settled = False
    handler = co.handler()
    with capture_logs() as logs, handler:
        raise ValueError("payment failed")
    assert settled is True and probe.refunded == [7]
    assert [(c.tool, c.is_code) for c in probe.seen] == [("refund", False), ("exec_python", True)]
    assert probe.seen[1] == "caller['settled'] = True"  # a snippet is shown as its code
    report = handler.report
    assert report is not None
    first = report.tool_calls[0]
    assert (first.tool, first.result, first.ok) == ("refund", "refunded 7", True)
    assert [t for t, *_ in _tool_events(logs)] == ["refund", "exec_python"]


def test_an_application_tool_error_is_audited_as_failed() -> None:
    def charge(amount: int) -> str:
        """Charge the card."""
        raise ConnectionError("gateway down")

    model = script(tool_call("charge", {"amount": 5}), give_up("gateway down"))
    handler = CrashOverride(model=model, tools=[charge]).handler()
    with pytest.raises(ValueError), handler:
        raise ValueError
    assert handler.report is not None
    first = handler.report.tool_calls[0]
    assert (first.tool, first.ok, first.source) == ("charge", False, "application")
    assert "ConnectionError: gateway down" in first.result
    assert "ConnectionError: gateway down" in tool_outputs(model)[0]  # the model sees why


def test_tools_from_an_agent_factory_pass_the_gate_too() -> None:
    from agents import Agent, function_tool

    probe = Probe()

    def factory(**kwargs: Any) -> Any:
        kwargs["tools"] = [*kwargs["tools"], function_tool(probe.refund)]
        return Agent(**kwargs)

    model = script(tool_call("refund", {"order_id": 3}), give_up("denied"))
    co = CrashOverride(model=model, agent_factory=factory, approve=probe.deny_all)
    with pytest.raises(ValueError), co.handler():
        raise ValueError
    assert probe.refunded == [] and probe.seen[0].tool == "refund"


def test_a_tool_the_gate_cannot_wrap_is_refused() -> None:
    from agents import WebSearchTool

    model = script(done("searched"))
    handler = CrashOverride(model=model, tools=[WebSearchTool()]).handler()
    with pytest.raises(ValueError) as raised, handler:
        raise ValueError
    assert handler.report is not None
    assert "'web_search'" in handler.report.reason
    assert "cannot pass approve= and the audit trail" in handler.report.reason
    assert not model.calls  # the run never started
    del raised


# -- handoffs and agents as tools (an agent_factory's) ------------------------------------------


def _with_helper(probe: Probe, attach: str) -> Any:
    """A factory whose agent can reach ``refunds``, an agent with an application tool."""
    from agents import Agent, function_tool

    def factory(**kwargs: Any) -> Any:
        helper = Agent(name="refunds", instructions="Refund orders.", model=kwargs.get("model"),
                       tools=[function_tool(probe.refund)])  # fmt: skip
        if attach == "handoff":
            # Handed off to both ways: the helper can hand back (a cycle).
            top = Agent(**kwargs, handoffs=[helper])
            helper.handoffs = [top]
            return top
        kwargs["tools"] = [*kwargs["tools"], helper.as_tool("ask_refunds", "Ask for a refund.")]
        return Agent(**kwargs)

    return factory


def test_a_handoff_agents_tools_pass_the_gate() -> None:
    probe = Probe()
    model = script(
        tool_call("transfer_to_refunds", {}), tool_call("refund", {"order_id": 3}), done("no")
    )

    def reviewer(call: ApprovalRequest) -> bool:
        probe.seen.append(call)
        return call.source == "handoff" and call.tool != "refund"  # the transfer, not the refund

    co = CrashOverride(model=model, agent_factory=_with_helper(probe, "handoff"), approve=reviewer)
    handler = co.handler()
    with capture_logs() as logs, pytest.raises(ValueError), handler:
        raise ValueError("payment failed")
    assert probe.refunded == []  # the helper's tool never ran: the approver denied it
    transfer, asked = probe.seen  # the transfer itself is a call approve= sees
    assert (transfer, transfer.source) == ("transfer_to_refunds()", "handoff")
    assert (asked, asked.source) == ("refund(order_id=3)", "handoff")
    assert handler.report is not None
    trail = [(c.tool, c.source, c.ok) for c in handler.report.tool_calls]
    assert trail == [("transfer_to_refunds", "handoff", True), ("refund", "handoff", False)]
    assert [(t, s, ok) for t, s, ok, _ in _tool_events(logs)] == trail


def test_diagnose_mode_offers_no_handoff() -> None:
    probe = Probe()
    model = script(done("the diagnosis"))
    co = CrashOverride(model=model, agent_factory=_with_helper(probe, "handoff"), mode="diagnose")
    with pytest.raises(ValueError), co.handler():
        raise ValueError
    assert {tool.name for tool in model.calls[0].tools} == {"inspect_python", "give_up"}
    assert model.calls[0].handoffs == []


def test_an_agent_tool_the_gate_cannot_reach_is_refused() -> None:
    probe = Probe()
    model = script(done("never asked"))
    handler = CrashOverride(model=model, agent_factory=_with_helper(probe, "as_tool")).handler()
    with pytest.raises(ValueError), handler:
        raise ValueError
    assert handler.report is not None
    reason = handler.report.reason
    assert "ask_refunds" in reason
    assert "cannot pass approve= and the audit trail" in reason
    assert not model.calls  # the run never started


# -- built-in tools ----------------------------------------------------------------------------


def test_every_builtin_tool_passes_the_gate_with_its_name_and_arguments() -> None:
    probe = Probe()
    model = script(
        exec_python("caller['fixed'] = 1"),
        tool_call("spawn_followup", {"objective": "write the patch", "context": ""}),
        give_up("nothing else to do"),
    )
    runner_jobs: list[FollowupJob] = []

    class Keep:
        def submit_job(self, job: FollowupJob) -> str:
            runner_jobs.append(job)
            return job.id

    co = CrashOverride(model=model, approve=probe.deny_all, followup_runner=Keep())
    handler = co.handler()
    with pytest.raises(ValueError), handler:
        raise ValueError
    calls = [(c.tool, dict(c.arguments)) for c in probe.seen]
    assert calls == [
        ("exec_python", {"statements": "caller['fixed'] = 1"}),
        ("spawn_followup", {"objective": "write the patch", "context": ""}),
        ("give_up", {"reason": "nothing else to do"}),
    ]
    assert runner_jobs == []  # the denied follow-up was never queued
    assert handler.report is not None
    assert [(c.tool, c.ok) for c in handler.report.tool_calls] == [
        ("exec_python", False), ("spawn_followup", False), ("give_up", False),
    ]  # fmt: skip


# -- diagnose mode -----------------------------------------------------------------------------


def test_diagnose_mode_offers_no_application_tools_and_never_runs_one() -> None:
    probe = Probe()
    model = script(tool_call("refund", {"order_id": 1}), done("diagnosis"))
    co = CrashOverride(model=model, tools=[probe.refund], mode="diagnose")
    with pytest.raises(ValueError), co.handler():
        raise ValueError
    assert {tool.name for tool in model.calls[0].tools} == {"inspect_python", "give_up"}
    assert probe.refunded == []


# -- follow-ups --------------------------------------------------------------------------------


def test_a_followups_tool_calls_pass_the_same_gate_and_are_audited() -> None:
    probe = Probe()
    jobs: list[FollowupJob] = []

    class Keep:
        def submit_job(self, job: FollowupJob) -> str:
            jobs.append(job)
            return job.id

    model = (
        Script(exec_python("caller['ok'] = True"), done())  # the recovery
        .run(tool_call("refund", {"order_id": 9}), give_up("cannot refund"))  # its follow-up
        .model()
    )
    approvals: list[str] = []

    def reviewer(call: ApprovalRequest) -> bool:
        approvals.append(call.tool)
        return call.tool != "refund"

    co = CrashOverride(model=model, tools=[probe.refund], approve=reviewer,
                       followups=["reconcile the refunds"], followup_runner=Keep())  # fmt: skip
    ok = False
    with co.handler():
        raise ValueError
    assert ok is True
    (job,) = jobs
    with capture_logs() as logs:
        result = run_job_sync(job, co._settings, "test")
    assert probe.refunded == []
    assert approvals == ["exec_python", "refund", "give_up"]
    trail = [(c.tool, c.source, c.ok, c.approved_by) for c in result.tool_calls]
    assert trail[0] == (
        "refund",
        "application",
        False,
        f"denied by {reviewer.__qualname__}",
    )
    assert _tool_events(logs, "followup.tool_called") == trail
    event = next(e for e in logs if e["event"] == "followup.tool_called")
    assert event["recovery_id"] == job.report.recovery_id and event["followup_id"] == job.id


# -- MCP -----------------------------------------------------------------------------------------


def _mcp_server(ledger: Path) -> Any:
    from agents.mcp import MCPServerStdio

    script = str(FIXTURES / "mcp_refunds.py")
    return MCPServerStdio(
        params={"command": sys.executable, "args": [script, str(ledger)]}, name="refunds"
    )


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the MCP client session is asyncio's
async def test_mcp_tools_pass_the_gate_denied_ones_never_reach_the_server(
    anyio_backend: str, tmp_path: Path
) -> None:
    pytest.importorskip("mcp")  # an optional dependency of the Agents SDK
    ledger = tmp_path / "ledger.txt"
    seen: list[ApprovalRequest] = []

    def reviewer(call: ApprovalRequest) -> bool | str:
        seen.append(call)
        return "no refunds" if call.tool == "refund" else True

    model = script(
        tool_call("refund", {"order_id": 5}),
        tool_call("lookup", {"order_id": 5}),
        exec_python("caller['total'] = 12.5"),
        done(),
    )
    async with _mcp_server(ledger) as server:
        co = CrashOverride(model=model, mcp_servers=[server], approve=reviewer)
        total = 0.0
        handler = co.handler()
        with capture_logs() as logs:
            async with handler:
                raise ValueError
        assert total == 12.5
        diagnose = script(done("diagnosis"))
        with pytest.raises(ValueError):
            async with CrashOverride(
                model=diagnose, mcp_servers=[server], mode="diagnose"
            ).handler():
                raise ValueError
    assert not ledger.exists()  # the denied refund never reached the server
    assert [(c.tool, c.source, dict(c.arguments)) for c in seen[:2]] == [
        ("refund", "mcp", {"order_id": 5}), ("lookup", "mcp", {"order_id": 5}),
    ]  # fmt: skip
    denied, looked = tool_outputs(model)[:2]
    assert denied.startswith("Not run: denied by") and "no refunds" in denied
    assert "order 5: 12.50 EUR" in looked
    assert handler.report is not None
    trail = [(c.tool, c.source, c.ok) for c in handler.report.tool_calls]
    assert trail == [
        ("refund", "mcp", False),
        ("lookup", "mcp", True),
        ("exec_python", "builtin", True),
    ]
    assert [(t, s, ok) for t, s, ok, _ in _tool_events(logs)] == trail
    # Diagnose mode offers no MCP tools (a server's read-only hint is not a mechanism).
    assert {tool.name for tool in diagnose.calls[0].tools} == {"inspect_python", "give_up"}


def test_the_request_copies_and_pickles_and_the_record_holds_plain_text() -> None:
    import copy
    import pickle

    call = ApprovalRequest.of("refund", {"order_id": 1}, "application")
    for again in (copy.copy(call), copy.deepcopy(call), pickle.loads(pickle.dumps(call))):
        assert (again, again.tool, again.source) == ("refund(order_id=1)", "refund", "application")
        assert dict(again.arguments) == {"order_id": 1}
    model = script(exec_python("caller['x'] = 1"), done())
    handler = CrashOverride(model=model).handler()
    x = 0
    with handler:
        raise ValueError
    assert x == 1 and handler.report is not None
    assert type(handler.report.tool_calls[0].code) is str  # reports serialise (follow-up jobs)


def test_an_application_tools_result_is_masked_by_name_inside_structures() -> None:
    # A short value under a secret name looks like nothing by itself: only its key tells.
    def account(user: str) -> dict[str, Any]:
        """Look up an account."""
        return {"user": user, "api_key": "abcd", "nested": {"password": "pw1"}}

    model = script(tool_call("account", {"user": "ada"}), give_up("nothing to fix"))
    co = CrashOverride(model=model, tools=[account])
    handler = co.handler()
    with pytest.raises(ValueError), handler:
        raise ValueError("lookup failed")
    seen = tool_outputs(model)[0]
    assert "ada" in seen and "abcd" not in seen and "pw1" not in seen
    report = handler.report
    assert report is not None
    assert "abcd" not in report.tool_calls[0].result and "pw1" not in report.tool_calls[0].result
