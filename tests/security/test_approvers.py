"""The example AST allow-list approver (examples/approvers.py): the evasions a string match
lets through are refused, ordinary repairs pass, and through ``approve=`` a refused snippet
never runs (a file it would delete is still there)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import exec_python, give_up, script, tool_call, tool_outputs

_PATH = Path(__file__).resolve().parents[2] / "examples" / "approvers.py"
_spec = importlib.util.spec_from_file_location("example_approvers", _PATH)
assert _spec is not None and _spec.loader is not None
approvers: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(approvers)

EVASION = "getattr(__import__('o' + 's'), 'remove')(path)"

REFUSED = [
    EVASION,
    "__import__('os').system('id')",
    "import os",
    "from os import remove",
    "max([1], key=exec)",
    "sorted([1], key=vars(orders).update)",
    "type(orders).refund = None",
    "open('/etc/passwd').read()",
    "eval('1')",
    "globals()['os']",
    "orders.refund.__func__.__globals__['os']",
    "'{0.__globals__}'.format(orders.refund)",
    "'{x.__class__}'.format_map({'x': orders})",
    "f'{orders.__dict__}'",
    "[c for c in ().__class__.__base__.__subclasses__()]",
    "error.__traceback__.tb_frame.f_globals",
    "orders.fetch().gi_frame.f_back",
    "(lambda: 0)()",
    "def f():\n    pass",
    "global orders",
    "x = getattr\nx(orders, 'refund')",
    "breakpoint()",
    "orders.refund(",  # does not parse
]

ALLOWED = [
    "caller['total'] = sum(o.amount for o in orders.pending)",
    "len(orders.pending)",
    "await orders.reload()",
    "row = orders.get(3)\nprint(row.status)",
    "[o.id for o in orders.pending if o.amount > 10]",
    "try:\n    orders.get(3)\nexcept KeyError as missing:\n    print(missing.args)",
]


@pytest.mark.parametrize("code", REFUSED)
def test_the_allow_list_refuses_what_it_cannot_account_for(code: str) -> None:
    approve = approvers.AllowList({"caller", "orders", "path"})
    verdict = approve.check(code)
    assert isinstance(verdict, str) and verdict, code


@pytest.mark.parametrize("code", ALLOWED)
def test_the_allow_list_lets_ordinary_repairs_through(code: str) -> None:
    assert approvers.AllowList({"caller", "orders"}).check(code) is True


def test_only_the_allowed_attributes_when_listed() -> None:
    approve = approvers.AllowList({"orders"}, attributes={"pending", "amount"})
    assert approve.check("sum(o.amount for o in orders.pending)") is True
    assert "'refund'" in approve.check("orders.refund(3)")


def _run(approve: Any, tmp_path: Path) -> tuple[Path, list[str]]:
    ledger = tmp_path / "ledger.db"
    ledger.write_text("the only copy")
    model = script(
        exec_python(EVASION),
        tool_call("refund", {"order_id": 1}),
        give_up("cannot"),
    )
    refunds: list[int] = []

    def refund(order_id: int) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return "refunded"

    co = CrashOverride(model=model, tools=[refund], approve=approve)
    path = str(ledger)
    with pytest.raises(ValueError), co.handler():
        raise ValueError(path)
    return ledger, [*tool_outputs(model), *map(str, refunds)]


def test_a_string_matching_approver_is_evaded(tmp_path: Path) -> None:
    # What the README warns about: the forbidden call never appears as a string.
    ledger, _ = _run(lambda code: "os.remove" not in code and "refund" not in code, tmp_path)
    assert not ledger.exists()


def test_through_approve_the_allow_list_stops_the_evasion_and_unlisted_tools(
    tmp_path: Path,
) -> None:
    approve = approvers.AllowList({"caller", "path"}, tools={"give_up"})
    ledger, seen = _run(approve, tmp_path)
    assert ledger.read_text() == "the only copy"
    snippet, tool = seen[:2]
    assert snippet.startswith("Not run: denied by AllowList: the name 'getattr'")
    assert tool.startswith("Not run: denied by AllowList: the tool refund")
    assert "refunded" not in seen


@pytest.mark.slow
def test_the_example_runs() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(_PATH)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("denied ") == 4, out.stdout + out.stderr
