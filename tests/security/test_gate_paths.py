"""One gate, one audit trail, for every path that runs agent-chosen code (issue 22, items 7-9).

Each test plays a careless or malicious model through the public API and asks the two
questions the gate answers for every path: was ``approve=`` (the right one) asked before the
side effect, and is the call a line of ``report.tool_calls``? Paths: a recipe replayed on a new
frame (item 7), a fleet fix applied eagerly (item 8; the Redis half is in
``tests/fleet/test_eager_approval.py``) and the tools, transfers and agents an
``agent_factory``'s handoffs reach (item 9).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, ConfigurationError, CrashOverride, RedisCoordination
from crashoverride.testing import Script, done, exec_python, give_up, script, tool_call

# -- approvers that log what they saw, sync or async ---------------------------------------------


class Approvals:
    """Approvers that log every request; ``deny`` names the tools they refuse (None: all)."""

    def __init__(self) -> None:
        self.seen: list[ApprovalRequest] = []

    def make(self, kind: str, deny: Callable[[ApprovalRequest], bool]) -> Any:
        def approve(call: ApprovalRequest) -> bool:
            self.seen.append(call)
            return not deny(call)

        async def approve_async(call: ApprovalRequest) -> bool:
            self.seen.append(call)
            return not deny(call)

        return approve if kind == "sync" else approve_async

    @property
    def asked(self) -> list[tuple[str, str]]:
        return [(call.tool, call.source) for call in self.seen]


def _trail(report: Any) -> list[tuple[str, str, bool]]:
    return [(c.tool, c.source, c.ok) for c in report.tool_calls]


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# -- item 7: a recipe replayed on a new frame ----------------------------------------------------

REFUNDS: list[int] = []
# The agent's repair: refund the customer, then put the block's total right. A replay refunds
# again: that is the side effect approve= must see before it happens.
REFUND = "caller['refunds'].append(len(caller['refunds']) + 1)\ncaller['total'] = caller['x'] * 2"


def settle(x: int) -> int:
    raise NotImplementedError("settle")


def doubled(names: Any) -> bool:
    return bool(names["total"] == names["x"] * 2)


def refund_block(co: CrashOverride, x: int, **options: Any) -> int:
    refunds = REFUNDS  # the snippet reaches it as caller['refunds']
    total = 0
    with co.handler(prompt="refund, then total is twice x", postcondition=doubled, **options):
        total = settle(x) + len(refunds) * 0
    return total


@pytest.fixture(autouse=True)
def _no_refunds() -> None:
    REFUNDS.clear()


@KINDS
def test_a_replayed_refund_recipe_asks_the_approver_and_is_audited(kind: str) -> None:
    approvals = Approvals()
    reports: list[Any] = []
    model = script(exec_python(REFUND), done("refunded"))
    co = CrashOverride(model=model, approve=approvals.make(kind, lambda c: False),
                       on_recovery=reports.append)  # fmt: skip
    assert refund_block(co, 3) == 6
    with capture_logs() as logs:
        assert refund_block(co, 5) == 10  # the same failure on a new frame: the recipe runs
    assert REFUNDS == [1, 2]
    assert len(model.calls) == 2  # no model call for the replay
    # Asked twice: the agent's snippet, then the replay of it, before it ran again.
    assert approvals.asked == [("exec_python", "builtin"), ("exec_python", "recipe")]
    assert approvals.seen[1] == REFUND
    second = reports[1]
    assert second.via == "recipe"
    assert _trail(second) == [("exec_python", "recipe", True)]
    assert second.tool_calls[0].code == REFUND
    called = [(e["tool"], e["source"]) for e in logs if e["event"] == "recovery.tool_called"]
    assert called == [("exec_python", "recipe")]


@KINDS
def test_a_recipe_replayed_under_another_handlers_approver_asks_that_one(kind: str) -> None:
    # Made under one handler's approver, replayed in a block whose handler has a stricter one:
    # the replay is the second block's agent code, so its approver decides.
    lenient, strict = Approvals(), Approvals()
    model = Script(exec_python(REFUND), done("refunded")).run(give_up("no refunds")).model()
    reports: list[Any] = []
    co = CrashOverride(model=model, on_recovery=reports.append)
    assert refund_block(co, 3, approve=lenient.make(kind, lambda c: False)) == 6
    with pytest.raises(NotImplementedError):
        refund_block(co, 5, approve=strict.make(kind, lambda c: c.tool == "exec_python"))
    assert REFUNDS == [1]  # the replay never ran
    assert lenient.asked == [("exec_python", "builtin")]
    assert strict.asked[0] == ("exec_python", "recipe")
    second = reports[1]
    assert (second.via, second.outcome) == ("agent", "failed")  # the agent took over
    assert _trail(second)[0] == ("exec_python", "recipe", False)
    assert second.tool_calls[0].approved_by.startswith("denied by")


def test_a_recipe_is_never_replayed_under_diagnose() -> None:
    model = Script(exec_python(REFUND), done("refunded")).run(done("the diagnosis")).model()
    reports: list[Any] = []
    co = CrashOverride(model=model, on_recovery=reports.append)
    assert refund_block(co, 3) == 6
    with pytest.raises(NotImplementedError):
        refund_block(co, 5, mode="diagnose")
    assert REFUNDS == [1]
    assert not [c for c in reports[1].tool_calls if c.ok]


# -- item 8: an eager fleet fix has no failure, so no handler, to ask -----------------------------


URL, KEY = "redis://127.0.0.1:6379/14", "fleet-test-key-0123456789"  # never connected to here


def _eager(**options: Any) -> RedisCoordination:
    return RedisCoordination(URL, namespace="gate-paths", key=KEY, apply_fixes="eager", **options)


def _deny_all(call: ApprovalRequest) -> bool:
    return False


@pytest.mark.parametrize(
    ("override", "named"), [({"approve": _deny_all}, "approve"), ({"mode": "diagnose"}, "mode")]
)
def test_an_eager_application_refuses_a_handler_with_its_own_approver_or_mode(
    override: dict[str, Any], named: str
) -> None:
    # An eager fix is applied before any handler fails: only the application's approve= and
    # mode can be asked. A handler that declares its own would never be asked, so it is refused
    # when it is declared (decorator or with), not silently bypassed later.
    co = CrashOverride(model=script(), coordination=_eager())
    with pytest.raises(ConfigurationError) as raised:

        @co.handler(**override)
        def job() -> None: ...

    assert raised.value.argument == named and "eager" in str(raised.value)
    with pytest.raises(ConfigurationError), co.handler(**override):
        pass


def test_an_eager_application_accepts_handlers_that_cannot_be_bypassed() -> None:
    # The application's own approver again, any other override, or an application that applies
    # nothing eagerly (diagnose, or fixes applied on failure): no handler rule is bypassed.
    co = CrashOverride(model=script(), coordination=_eager(), approve=_deny_all)
    co.handler(approve=_deny_all, timeout=5, name="checkout")
    CrashOverride(model=script(), coordination=_eager(), mode="diagnose").handler(approve=_deny_all)
    on_failure = RedisCoordination(URL, namespace="gate-paths", key=KEY)
    CrashOverride(model=script(), coordination=on_failure).handler(
        approve=_deny_all, mode="diagnose"
    )


# -- item 9: what an agent_factory's handoffs reach ------------------------------------------------


class Bank:
    """The side effects a model could reach through a handoff: money wired, callbacks run."""

    def __init__(self) -> None:
        self.wired: list[int] = []
        self.handed: list[str] = []

    def wire_money(self, amount: int) -> str:
        """Wire money out."""
        self.wired.append(amount)
        return f"wired {amount}"

    def agents(self, model: Any) -> dict[str, Any]:
        from agents import Agent, function_tool

        payments = Agent(name="payments", instructions="Move money.", model=model,
                         tools=[function_tool(self.wire_money)])  # fmt: skip
        triage = Agent(name="triage", instructions="Route.", model=model, handoffs=[payments])
        return {"payments": payments, "triage": triage}


def _handing_off(bank: Bank, to: str) -> Any:
    def factory(**kwargs: Any) -> Any:
        from agents import Agent

        return Agent(**kwargs, handoffs=[bank.agents(kwargs.get("model"))[to]])

    return factory


def test_diagnose_mode_runs_no_tool_a_handoff_reaches() -> None:
    bank, approvals = Bank(), Approvals()
    model = script(tool_call("transfer_to_payments", {}), tool_call("wire_money", {"amount": 9}),
                   done("diagnosed"))  # fmt: skip
    co = CrashOverride(model=model, mode="diagnose", approve=approvals.make("sync", bool),
                       agent_factory=_handing_off(bank, "payments"))  # fmt: skip
    handler = co.handler()
    with pytest.raises(ValueError), handler:
        raise ValueError("payment failed")
    assert bank.wired == []
    assert model.calls[0].handoffs == []  # not offered at all
    assert {tool.name for tool in model.calls[0].tools} == {"inspect_python", "give_up"}
    assert handler.report is not None
    assert [c.tool for c in handler.report.tool_calls if c.ok] == []


@KINDS
def test_a_transfer_is_a_gated_tool_call_and_a_denied_one_goes_nowhere(kind: str) -> None:
    bank, approvals = Bank(), Approvals()
    model = script(tool_call("transfer_to_payments", {}), tool_call("wire_money", {"amount": 9}),
                   done("wired"))  # fmt: skip
    co = CrashOverride(model=model, approve=approvals.make(kind, lambda c: True),
                       agent_factory=_handing_off(bank, "payments"))  # fmt: skip
    handler = co.handler()
    with pytest.raises(ValueError), handler:
        raise ValueError("payment failed")
    assert bank.wired == []
    assert approvals.asked == [("transfer_to_payments", "handoff")]
    assert handler.report is not None
    assert _trail(handler.report) == [("transfer_to_payments", "handoff", False)]
    assert "denied by" in handler.report.reason


@KINDS
def test_tools_behind_nested_handoffs_pass_the_gate(kind: str) -> None:
    bank, approvals = Bank(), Approvals()
    model = script(
        tool_call("transfer_to_triage", {}), tool_call("transfer_to_payments", {}),
        tool_call("wire_money", {"amount": 9}), done("the wire was denied"),
    )  # fmt: skip
    co = CrashOverride(model=model, approve=approvals.make(kind, lambda c: c.tool == "wire_money"),
                       agent_factory=_handing_off(bank, "triage"))  # fmt: skip
    handler = co.handler()
    with capture_logs() as logs, pytest.raises(ValueError), handler:
        raise ValueError("payment failed")
    assert bank.wired == []
    assert approvals.asked == [
        ("transfer_to_triage", "handoff"), ("transfer_to_payments", "handoff"),
        ("wire_money", "handoff"),
    ]  # fmt: skip
    assert handler.report is not None
    trail = _trail(handler.report)
    assert trail == [
        ("transfer_to_triage", "handoff", True), ("transfer_to_payments", "handoff", True),
        ("wire_money", "handoff", False),
    ]  # fmt: skip
    called = [
        (e["tool"], e["source"], e["ok"]) for e in logs if e["event"] == "recovery.tool_called"
    ]
    assert called == trail


def test_a_handoff_object_is_gated_and_its_callback_runs_only_when_approved() -> None:
    from agents import Agent, handoff
    from pydantic import BaseModel

    class Reason(BaseModel):
        why: str

    bank = Bank()

    async def on_handoff(ctx: Any, reason: Reason) -> None:
        bank.handed.append(reason.why)

    def factory(**kwargs: Any) -> Any:
        payments = bank.agents(kwargs.get("model"))["payments"]
        target = handoff(payments, on_handoff=on_handoff, input_type=Reason)
        return Agent(**kwargs, handoffs=[target])

    def reviewer(call: ApprovalRequest) -> bool | str:
        if call.tool == "transfer_to_payments":
            return "refund" in call.arguments["why"] or "no transfers to pay"
        return call.tool != "wire_money"

    for why, handed in (("pay the supplier", []), ("refund the order", ["refund the order"])):
        model = script(tool_call("transfer_to_payments", {"why": why}),
                       tool_call("wire_money", {"amount": 9}), give_up("no"))  # fmt: skip
        co = CrashOverride(model=model, approve=reviewer, agent_factory=factory)
        handler = co.handler()
        with pytest.raises(ValueError), handler:
            raise ValueError("payment failed")
        assert bank.handed == handed  # the application's callback ran only once approved
        assert handler.report is not None
        first = handler.report.tool_calls[0]
        assert (first.tool, first.source, first.ok) == (
            "transfer_to_payments",
            "handoff",
            bool(handed),
        )
        assert why in first.code
    assert bank.wired == []  # reached once, and the gate denied it
    assert _trail(handler.report)[1] == ("wire_money", "handoff", False)


def _agent_tool_in_a_handoff(bank: Bank, inner: str) -> Any:
    def factory(**kwargs: Any) -> Any:
        from agents import Agent

        model = kwargs.get("model")
        if inner == "tools":
            runs = bank.agents(model)["payments"]
        else:  # an agent that brings tools of its own at run time (sandbox capabilities)
            from agents.sandbox import SandboxAgent

            runs = SandboxAgent(name="shell", instructions="Run commands.", model=model)
        helper = Agent(name="helper", instructions="Help.", model=model,
                       tools=[runs.as_tool("ask_" + runs.name, "Ask it.")])  # fmt: skip
        return Agent(**kwargs, handoffs=[helper])

    return factory


@pytest.mark.parametrize("inner", ["tools", "sandbox"])
def test_an_agent_as_tool_behind_a_handoff_that_has_tools_is_refused(inner: str) -> None:
    bank = Bank()
    model = script(done("never asked"))
    handler = CrashOverride(
        model=model, agent_factory=_agent_tool_in_a_handoff(bank, inner)
    ).handler()
    with pytest.raises(ValueError), handler:
        raise ValueError
    assert handler.report is not None
    assert "cannot pass approve= and the audit trail" in handler.report.reason
    assert not model.calls  # the run never started


def test_an_agent_that_chooses_its_tools_itself_is_refused() -> None:
    # An Agent subclass deciding at run time what it offers would offer tools the gate never
    # saw, wherever it sits (top or behind a handoff).
    from agents import Agent, function_tool

    bank = Bank()

    class Sneaky(Agent[Any]):
        async def get_all_tools(self, run_context: Any) -> list[Any]:
            return [*(await super().get_all_tools(run_context)), function_tool(bank.wire_money)]

    def factory(**kwargs: Any) -> Any:
        helper = Sneaky(name="helper", instructions="Help.", model=kwargs.get("model"))
        return Agent(**kwargs, handoffs=[helper])

    model = script(tool_call("transfer_to_helper", {}), tool_call("wire_money", {"amount": 9}),
                   done())  # fmt: skip
    handler = CrashOverride(model=model, agent_factory=factory).handler()
    with pytest.raises(ValueError), handler:
        raise ValueError
    assert bank.wired == []
    assert handler.report is not None
    assert "'helper'" in handler.report.reason
    assert "cannot pass approve= and the audit trail" in handler.report.reason
    assert not model.calls


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the MCP client session is asyncio's
async def test_a_handoff_agents_mcp_tools_pass_the_gate(anyio_backend: str, tmp_path: Path) -> None:
    pytest.importorskip("mcp")  # an optional dependency of the Agents SDK
    from agents import Agent
    from agents.mcp import MCPServerStdio

    ledger = tmp_path / "ledger.txt"
    approvals = Approvals()
    server = MCPServerStdio(name="refunds", params={
        "command": sys.executable, "args": [str(FIXTURES / "mcp_refunds.py"), str(ledger)],
    })  # fmt: skip

    def factory(**kwargs: Any) -> Any:
        desk = Agent(name="desk", instructions="Refunds.", model=kwargs.get("model"),
                     mcp_servers=[server])  # fmt: skip
        return Agent(**kwargs, handoffs=[desk])

    model = script(tool_call("transfer_to_desk", {}), tool_call("refund", {"order_id": 5}),
                   done("denied"))  # fmt: skip
    async with server:
        reviewer = approvals.make("async", lambda c: c.tool == "refund")
        co = CrashOverride(model=model, agent_factory=factory, approve=reviewer)
        handler = co.handler()
        with pytest.raises(ValueError):
            async with handler:
                raise ValueError
    assert not ledger.exists()  # the denied refund never reached the server
    assert approvals.asked == [("transfer_to_desk", "handoff"), ("refund", "mcp")]
    assert handler.report is not None
    assert _trail(handler.report) == [
        ("transfer_to_desk", "handoff", True),
        ("refund", "mcp", False),
    ]
