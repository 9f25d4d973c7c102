"""The pipeline's contract is typed: no ``Any`` in the signatures of the pipeline, the entry,
the record protocol and the integration contract, and both records keep the protocol.

``mypy --strict`` is the proof that the records conform (``_core.record._conforming``); these
tests keep the contract from drifting back to ``Any`` and its members from going missing.
"""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable

from crashoverride._agent.run import AgentJob
from crashoverride._agent.state import AgentRun, RunState
from crashoverride._config.settings import Settings
from crashoverride._core.block import Block
from crashoverride._core.followup import FollowupRecord
from crashoverride._core.record import Record
from crashoverride._core.recovery import Decision, Recovery
from crashoverride._effects.journal import Unit
from crashoverride._followups.job import FollowupResult
from crashoverride._placement import bridge
from crashoverride._placement.deadline import Deadline
from tests.architecture.annotations import slots
from tests.architecture.graph import modules

CONTRACT = (
    "crashoverride._core.pipeline",
    "crashoverride._core.entry",
    "crashoverride._core.record",
    "crashoverride.integration",
)
# The names the contract's annotations use only under ``if TYPE_CHECKING:``.
NAMES = {
    "AgentJob": AgentJob,
    "AgentRun": AgentRun,
    "RunState": RunState,
    "Settings": Settings,
    "Block": Block,
    "Deadline": Deadline,
}
CONCLUSIONS = {Recovery: Decision, FollowupRecord: FollowupResult}


def _protocol_members() -> tuple[dict[str, object], dict[str, Callable[..., object]]]:
    attributes = typing.get_type_hints(Record, localns=NAMES)
    methods = {
        name: member
        for name, member in vars(Record).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    return attributes, methods


def _assigned_in_init(cls: type) -> set[str]:
    tree = ast.parse(inspect.getsource(cls))
    init = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    return {
        target.attr
        for node in ast.walk(init)
        for target in (
            node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        )
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }


def test_the_contract_writes_no_any_in_its_signatures() -> None:
    found = modules()
    offenders = [
        str(slot)
        for module in CONTRACT
        for slot in slots(module, found[module].read_text(encoding="utf-8"))
        if slot.mentions_any
    ]
    assert offenders == []


def test_the_scan_sees_any_however_it_is_written() -> None:
    # A scanner that saw nothing would make the test above pass vacuously.
    source = """
import typing
from typing import Any
def f(a: Any, b: typing.Any, c: "Any", d: dict[str, Any], *e: int, **f: object) -> Any: ...
class K:
    def m(self, g: Callable[..., Any]) -> None:
        def inner(h: int) -> "list[Any]": ...
"""
    found = {(slot.function, slot.name): slot for slot in slots("m", source)}
    bare = sorted(name for (_, name), slot in found.items() if slot.bare_any)
    mentioning = sorted(f"{fn}.{name}" for (fn, name), slot in found.items() if slot.mentions_any)
    assert bare == ["a", "b", "c", "return"]
    assert mentioning == [
        "K.m.g", "K.m.inner.return", "f.a", "f.b", "f.c", "f.d", "f.return",
    ]  # fmt: skip
    assert ("K.m", "self") not in found


def _mentions_any(hint: object) -> bool:
    return hint is typing.Any or any(_mentions_any(arg) for arg in typing.get_args(hint))


def test_the_placement_aliases_say_what_runs_and_what_comes_back() -> None:
    # A job is called as the owner of the frame; a dispatch awaits what it returned.
    assert not _mentions_any(bridge.Job), bridge.Job
    assert not _mentions_any(bridge.Dispatch), bridge.Dispatch
    assert typing.get_args(bridge.Job) == ([], object)


def test_the_record_protocol_names_what_the_pipeline_uses() -> None:
    attributes, methods = _protocol_members()
    assert getattr(Record, "_is_protocol", False)
    assert attributes == {
        "id": str,
        "settings": Settings,
        "deadline": Deadline,
        "state": RunState,
        "block": Block | None,
        "unit": Unit,
        "running": bool,
    }
    assert sorted(methods) == ["concluded", "prepare", "started", "timed_out"]
    for method in methods.values():
        hints = typing.get_type_hints(method, localns=NAMES)
        assert not any(map(_mentions_any, hints.values())), (method, hints)


def test_both_records_keep_the_protocol() -> None:
    attributes, methods = _protocol_members()
    for cls, conclusion in CONCLUSIONS.items():
        assert set(attributes) <= _assigned_in_init(cls), cls
        for name, wanted in methods.items():
            have = getattr(cls, name)
            assert inspect.isfunction(have), (cls, name)
            assert list(inspect.signature(have).parameters) == list(
                inspect.signature(wanted).parameters
            ), (cls, name)
            hints = typing.get_type_hints(have, localns=NAMES)
            for param, hint in typing.get_type_hints(wanted, localns=NAMES).items():
                if param == "return":
                    # The protocol's parameter: each record's own conclusion, everywhere.
                    expected = conclusion if hint is Record.__parameters__[0] else hint
                    assert hints["return"] is expected, (cls, name, hints["return"])
                else:  # the record takes what the pipeline passes (or more)
                    assert hint == hints[param] or hint in typing.get_args(hints[param])
