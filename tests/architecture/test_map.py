"""The map stays true: each subpackage's docstring names its modules and what it may import,
and ARCHITECTURE.md lists the layers in the order the suite enforces."""

from __future__ import annotations

import ast
import re

import pytest

from tests.architecture.graph import ROOT, SRC, edges, modules, unit
from tests.architecture.layering import LAYERS, RANK

PACKAGES = [
    "_placement", "_security", "_config", "_observe", "_diagnose", "_repair", "_agent",
    "_admission", "_fleet", "_followups", "_core", "_cli", "integrations",
]  # fmt: skip
_NAMED = re.compile(r"``([\w.]+)``")


def _docstring(package: str) -> str:
    path = SRC / "crashoverride" / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{package} has no docstring"
    return doc


def _may_import(doc: str) -> tuple[set[str], set[str]]:
    """(units it may import at runtime, modules it may name for types only)."""
    (line,) = re.findall(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    runtime, _, typed = line.partition("type-only:")
    return set(_NAMED.findall(runtime)), set(_NAMED.findall(typed))


@pytest.mark.parametrize("package", PACKAGES)
def test_the_docstring_names_every_module(package: str) -> None:
    doc = _docstring(package)
    named = set(_NAMED.findall(doc))
    own = [
        name.removeprefix(f"crashoverride.{package}.").split(".")[0]
        for name in modules()
        if name.startswith(f"crashoverride.{package}.")
    ]
    assert sorted(set(own) - named) == []


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in ("_cli", "integrations")])
def test_the_docstring_says_what_it_may_import(package: str) -> None:
    runtime, typed = _may_import(_docstring(package))
    imported = {unit(e.target) for e in edges() if unit(e.source) == package and not e.type_only}
    imported.discard(package)
    assert imported <= runtime, f"imports {sorted(imported - runtime)} its docstring does not name"
    assert all(RANK[u] < RANK[package] for u in runtime), "names a unit above it"
    up_types = {
        e.target.removeprefix("crashoverride.")
        for e in edges()
        if unit(e.source) == package and e.type_only and RANK[unit(e.target)] > RANK[package]
    }
    assert up_types == typed


def test_the_reader_of_may_import_can_fail() -> None:
    runtime, typed = _may_import("x\n\nMay import: ``_a``, ``_b``; type-only: ``_c.d``.\n")
    assert (runtime, typed) == ({"_a", "_b"}, {"_c.d"})


def test_architecture_md_lists_the_layers_in_order_and_the_readme_links_it() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    rows = re.findall(r"^\|\s*(\d+)\s*\|([^|]*)\|", text, re.M)
    listed = [tuple(re.findall(r"`([\w.]+)`", cells)) for _, cells in rows]
    public = {"__init__": "crashoverride", "integration": "crashoverride.integration",
              "followups": "crashoverride.followups", "integrations": "crashoverride.integrations",
              "testing": "crashoverride.testing", "__main__": "crashoverride.__main__"}  # fmt: skip
    expected = [tuple(public.get(u, u) for u in row) for row in LAYERS]
    assert listed == expected
    assert "ARCHITECTURE.md" in (ROOT / "README.md").read_text()
