"""One rule for what a check's result means: approvers, postconditions and unit checks alike.

Only a true result says yes. ``None`` says no everywhere: an approver or a postcondition that
forgot to return must neither approve a call nor claim a recovery. The table "What a check's
result means" (docs/reference/configuration.md) is the rule's documentation, and is held to the
code here.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashoverride import CrashOverride, integration
from crashoverride._security import verdict
from crashoverride.testing import done, exec_python, script, tool_outputs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"

# The columns of the table, and what each check is called in its reasons.
COLUMNS = {"approver": "the approver", "postcondition": "the postcondition",
           "unit check": "the block's check"}  # fmt: skip


class Boom(Exception):
    pass


def _table() -> tuple[list[str], list[list[str]]]:
    text = PAGE.read_text()
    start = text.index("## What a check's result means")
    lines = [*text[start:].splitlines(), ""]  # the table may end the page
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i, line in enumerate(lines[first:], first) if not line.startswith("|"))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[first:end]]
    header, _, *body = rows
    return header, body


def _literals(cell: str) -> list[Any]:
    """The values written as `code` in a cell (a type's name, like `str`, is not one)."""
    found = []
    for code in re.findall(r"`([^`]+)`", cell):
        try:
            found.append(ast.literal_eval(code))
        except ValueError:
            continue
    return found


def _outcomes(returns: Any, what: str) -> list[Any]:
    """What the code says of a check returning ``returns``: sync, async, and as a bare value."""

    async def later() -> Any:
        return returns

    said = verdict.reason(returns)  # the bare value, as the gate reads an approver's answer
    return [
        verdict.judge(lambda: returns, what=what),
        asyncio.run(verdict.judge(later, what=what)),
        True if said is None else said,
    ]


def _raises(what: str) -> list[Any]:
    def now() -> Any:
        raise Boom("the stock service is down")

    async def later() -> Any:
        raise Boom("the stock service is down")

    return [verdict.judge(now, what=what), asyncio.run(verdict.judge(later, what=what))]


def _check_cell(cell: str, outcomes: list[Any], returned: Any, row: str) -> None:
    where = f"{row!r}: {cell!r}"
    if cell.startswith("yes"):
        assert all(outcome is True for outcome in outcomes), where
        return
    assert cell.startswith("no"), f"a cell says yes or no first: {where}"
    assert all(isinstance(o, str) and o for o in outcomes), (where, outcomes)
    if "the string is the reason" in cell:
        assert all(outcome == returned for outcome in outcomes), where
    if "default reason" in cell:
        assert all(outcome != returned for outcome in outcomes), where
    if "the exception is the reason" in cell:
        assert all("Boom: the stock service is down" in outcome for outcome in outcomes), where


def test_the_documented_table_is_the_codes_rule() -> None:
    header, body = _table()
    assert header[1:] == list(COLUMNS), header
    labels = [row[0] for row in body]
    for needed in ("`True`", "`None`", "`False`", "`str`", '`""`', "another value", "raises"):
        assert any(needed in label for label in labels), f"no row for {needed}"
    for row in body:
        label, cells = row[0], row[1:]
        for cell, what in zip(cells, COLUMNS.values(), strict=True):
            if label == "raises":
                _check_cell(cell, _raises(what), None, label)
            elif label.startswith("returns another value"):
                # "its truth: `1` and `[0]` yes; `0` and `[]` no"
                said_yes, said_no = cell.split(";")
                assert "yes" in said_yes and "no" in said_no, cell
                for value in _literals(said_yes):
                    _check_cell("yes", _outcomes(value, what), value, label)
                for value in _literals(said_no):
                    _check_cell("no", _outcomes(value, what), value, label)
            else:
                (returned,) = _literals(label)
                _check_cell(cell, _outcomes(returned, what), returned, label)


def test_a_value_whose_truth_raises_is_a_no() -> None:
    class Ambiguous:
        def __bool__(self) -> bool:
            raise ValueError("the truth value of an array is ambiguous")

    said = verdict.judge(Ambiguous)
    assert isinstance(said, str) and "ambiguous" in said


# -- through the public API: the same None, the same no ----------------------------------------


def test_a_postcondition_returning_none_does_not_recover() -> None:
    def postcondition(names: Any) -> None:  # the author forgot ``return``
        names["value"] == 2  # noqa: B015

    co = CrashOverride(model=script(exec_python("caller['value'] = 2"), done("fixed")))
    with pytest.raises(ValueError) as raised:
        with co.handler(postcondition=postcondition) as handler:
            value = int("x")
        del value
    assert handler.report is not None and handler.report.outcome == "failed"
    assert "the postcondition returned None" in raised.value.__notes__[-1]


@pytest.mark.anyio
async def test_an_async_postcondition_returning_none_does_not_recover(anyio_backend: str) -> None:
    async def postcondition(names: Any) -> None:
        pass

    co = CrashOverride(model=script(exec_python("caller['value'] = 2"), done("fixed")))
    with pytest.raises(ValueError) as raised:
        async with co.handler(postcondition=postcondition):
            value = int("x")
        del value
    assert "the postcondition returned None" in raised.value.__notes__[-1]


def test_an_approver_returning_none_denies_the_call() -> None:
    seen: list[str] = []
    model = script(exec_python("caller['value'] = 2"), done("fixed"))
    co = CrashOverride(model=model, approve=seen.append)  # returns None for every call
    with pytest.raises(ValueError):
        with co.handler() as handler:
            value = int("x")
        del value
    assert seen == ["caller['value'] = 2"]
    assert handler.report is not None
    (call,) = handler.report.tool_calls
    assert not call.ok and call.approved_by == "denied by list.append: it returned None"


@pytest.mark.parametrize(
    ("answer", "approved_by"),
    [
        ("", "denied by {}"),  # no reason given: the plain denial, not "denied by x: "
        ("not today", "denied by {}: not today"),
        (0, "denied by {}"),
        ([1], "approved by {}"),
    ],
)
def test_an_approvers_answer_follows_the_rule(answer: Any, approved_by: str) -> None:
    def approver(call: Any) -> Any:
        return answer

    approved_by = approved_by.format(approver.__qualname__)
    model = script(exec_python("caller['value'] = 2"), done("fixed"))
    co = CrashOverride(model=model, approve=approver)
    handler = co.handler()
    try:
        with handler:
            value = int("x")
        del value
    except ValueError:
        pass
    assert handler.report is not None
    assert [c.approved_by for c in handler.report.tool_calls] == [approved_by]


def test_an_approver_whose_answer_cannot_be_judged_denies() -> None:
    class Ambiguous:
        def __bool__(self) -> bool:
            raise ValueError("ambiguous truth")

    model = script(exec_python("caller['value'] = 2"), done("fixed"))
    co = CrashOverride(model=model, approve=lambda call: Ambiguous())
    with pytest.raises(ValueError, match="invalid literal"):
        with co.handler() as handler:
            value = int("x")
        del value
    assert handler.report is not None
    (call,) = handler.report.tool_calls
    assert not call.ok and "ambiguous truth" in call.approved_by
    assert tool_outputs(model)[0].startswith("Not run: denied by ")


def _unit(check: Callable[[Any], Any]) -> integration.Block:
    return integration.Block(kind="unit", frame=None, globals_={}, check=check)


@pytest.mark.parametrize(("returns", "recovered"), [(None, False), (True, True), ("why", False)])
def test_a_unit_check_follows_the_rule(returns: Any, recovered: bool) -> None:
    # An integration's own unit of work, described as a Block whose check says yes or no.
    co = CrashOverride(model=script(exec_python("x = 1"), done("fixed")))
    handler = co.handler()
    try:
        raise ValueError("unit failed")
    except ValueError as exc:
        outcome = integration.recover(handler, exc, functools.partial(_unit, lambda _: returns))
        assert integration.settle(handler, outcome, exc) is recovered
    assert handler.report is not None
    assert handler.report.outcome == ("recovered" if recovered else "failed")
