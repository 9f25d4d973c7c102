"""The package's shape: no import cycle counting every import, a declared layering, and the
failure path loading only what it uses.

The graph (``graph.py``) counts imports inside functions and ``importlib.import_module`` calls
with a literal name, not only module-level imports: the cycles wave 2 left ran through
function-level imports, which a module-level check cannot see.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from tests.architecture.graph import ROOT, SRC, Edge, cycles, edges, modules, unit
from tests.architecture.layering import LAYERS, RANK, UPWARD

# Type-only imports (``if TYPE_CHECKING:``) never run, so they cannot form a cycle at runtime;
# those that point up are still listed, so the list can only shrink.
TYPE_ONLY_UPWARD = {
    ("crashoverride._admission.coordination", "crashoverride._core.recovery"),
    ("crashoverride._fleet.backend", "crashoverride._core.recovery"),
    ("crashoverride._repair.recipes", "crashoverride._core.recovery"),
    ("crashoverride._handler", "crashoverride._app"),
}


def _runtime() -> list[Edge]:
    return [edge for edge in edges() if not edge.type_only]


def test_the_graph_sees_imports_inside_functions() -> None:
    # The reader itself: a function-level import and an import_module call are edges.
    found = {(e.source, e.target) for e in _runtime() if e.in_function}
    assert ("crashoverride._app", "crashoverride._fleet.backend") in found
    assert ("crashoverride._observe.observers", "crashoverride._observe.otel") in found


def test_no_import_cycle_counting_every_import() -> None:
    assert cycles(_runtime()) == []


def test_every_unit_is_in_the_layering() -> None:
    units = {unit(name) for name in modules()}
    assert units == set(RANK), (sorted(units - set(RANK)), sorted(set(RANK) - units))


def test_imports_point_down_the_layers() -> None:
    upward = sorted(
        f"{e.source} -> {e.target} (line {e.line})"
        for e in _runtime()
        if RANK[unit(e.target)] > RANK[unit(e.source)] and (e.source, e.target) not in UPWARD
    )
    assert upward == []


def test_upward_exceptions_exist_and_are_lazy() -> None:
    found = {(e.source, e.target): e for e in _runtime()}
    for pair in UPWARD:
        assert pair in found, f"{pair} is no longer imported: drop it from UPWARD"
        assert found[pair].in_function, f"{pair} must stay a lazy import"


def test_type_only_upward_imports_are_a_closed_list() -> None:
    upward = {
        (e.source, e.target)
        for e in edges()
        if e.type_only
        and RANK[unit(e.target)] > RANK[unit(e.source)]
        and (e.source, e.target) not in UPWARD
    }
    assert upward == TYPE_ONLY_UPWARD


def test_the_top_level_holds_only_faces_and_the_composition_root() -> None:
    top = sorted(p.name for p in (SRC / "crashoverride").glob("*.py"))
    assert top == [
        "__init__.py", "__main__.py", "_app.py", "_errors.py", "_handler.py", "_version.py",
        "integration.py",
    ]  # fmt: skip
    assert len(top) <= 12


def test_no_private_name_crosses_a_unit_boundary() -> None:
    crossing = []
    known = modules()
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if not node.module.startswith("crashoverride") or unit(node.module) == unit(name):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                # a private module imported by name is a unit of its own, not a private name
                if private and f"{node.module}.{alias.name}" not in known:
                    crossing.append(f"{name}: {node.module}.{alias.name}")
    assert crossing == []


def test_integrations_use_only_the_public_contract() -> None:
    private = sorted(
        f"{e.source} -> {e.target}"
        for e in edges()
        if unit(e.source) == "integrations"
        and unit(e.target) != "integrations"
        and any(part.startswith("_") for part in e.target.split(".")[1:])
    )
    assert private == []


def test_the_contract_rule_reads_every_integration() -> None:
    # The rule above judges the edges it finds: an integration whose imports were not read
    # (a module the graph missed) would pass it unseen. Each one reaches the contract.
    contract = {"crashoverride", "crashoverride.integration", "crashoverride.followups"}
    reaching = {e.source for e in edges() if e.target in contract}
    integrations = {
        name.split(".")[2] for name in modules() if name.startswith("crashoverride.integrations.")
    }
    assert {"arq", "asgi", "asyncio", "celery"} <= integrations
    for name in integrations:
        assert any(
            source == f"crashoverride.integrations.{name}"
            or source.startswith(f"crashoverride.integrations.{name}.")
            for source in reaching
        ), name


def test_the_algorithm_lives_in_one_module() -> None:
    # The steps are named once, in the pipeline; the entry points only describe and drive. The
    # one pluggable piece, admission and single-flight, is asked of the coordination backend,
    # whose in-process implementation is the only user of the breaker and the flights.
    def holders(*calls: str) -> list[str]:
        return sorted(
            str(path.relative_to(SRC / "crashoverride"))
            for path in modules().values()
            if any(call in path.read_text() for call in calls)
        )

    assert holders("limits.slots.acquire(") == ["_core/pipeline.py"]
    assert holders("breaker.admit(", "flights.join(") == ["_admission/coordination.py"]
    assert holders("coordination.join(", "coordination.admit(") == ["_core/pipeline.py"]


# A scripted ``with`` recovery, nothing optional configured: what it imports of ours.
_RECOVERY = textwrap.dedent(
    """
    import json, sys
    from crashoverride import CrashOverride
    from crashoverride.testing import done, exec_python, script

    co = CrashOverride(model=script(exec_python("caller['x'] = 2"), done("fixed")), timeout=30)
    before = set(sys.modules)
    x = 1
    with co.handler(prompt="x must be set"):
        raise KeyError("x")
    after = sorted(m for m in set(sys.modules) - before if m.startswith("crashoverride"))
    print(json.dumps(after))
    """
)

_NOT_ON_THE_PATH = (
    "crashoverride._fleet",
    "crashoverride._followups",
    "crashoverride._core.followup",
    "crashoverride._repair.persist",
    "crashoverride._observe.otel",
    "crashoverride._observe.sentry",
    "crashoverride._observe.ledger",
    "crashoverride._diagnose.snapshot",
    "crashoverride._cli",
    "crashoverride._eval",
    "crashoverride.integrations",
    "crashoverride.followups",
)


@pytest.mark.slow
def test_a_plain_recovery_loads_none_of_the_optional_machinery() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RECOVERY], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "crashoverride._core.pipeline" in loaded  # it did recover through the pipeline
    unwanted = [m for m in loaded if m.startswith(_NOT_ON_THE_PATH)]
    assert unwanted == []


def test_the_layers_are_listed_once() -> None:
    listed = [u for row in LAYERS for u in row]
    assert len(listed) == len(set(listed))
