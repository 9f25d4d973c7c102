"""The package's import graph as the interpreter would follow it: every import, wherever it is.

Module level and inside functions both count; only imports under ``if TYPE_CHECKING:`` are
set apart (they never run). ``importlib.import_module("crashoverride...")`` with a literal name
counts too, so an import cannot hide from the rules by being spelled as a call.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "crashoverride"


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``
    in_function: bool


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    assert len(found) > 50, f"the package's modules were not found under {SRC}"
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The module an import name lands in (a name imported from a package may be a module)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def edges() -> list[Edge]:
    known = modules()
    found: list[Edge] = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))

        def visit(
            node: ast.AST,
            type_only: bool,
            in_function: bool,
            name: str = name,
            is_package: bool = is_package,
        ) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.body:
                    visit(child, True, in_function)
                for child in node.orelse:
                    visit(child, type_only, in_function)
                return
            inner = in_function or isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, node, is_package)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                spelled = node.args[0].value
                if spelled.startswith("."):
                    base = name if is_package else name.rpartition(".")[0]
                    spelled = base + spelled
                targets = [spelled]
            for target in targets:
                if target.split(".")[0] != PACKAGE:
                    continue
                landed = _resolve(target, known)
                if landed and landed != name:
                    found.append(Edge(name, landed, getattr(node, "lineno", 0), type_only, inner))
            for child in ast.iter_child_nodes(node):
                visit(child, type_only, inner)

        visit(tree, False, False)
    return found


def cycles(selected: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), largest first."""
    graph: dict[str, set[str]] = {}
    for edge in selected:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out, key=len, reverse=True)


def unit(module: str) -> str:
    """The architectural unit of a module: its subpackage, or itself at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"
