"""The shape the code must keep: no import cycles, integrations on the public contract only,
and one home for the recovery algorithm."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "crashoverride": ROOT / "crashoverride",
    "crashoverride.integrations": ROOT / "integrations",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str, path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def test_no_import_cycles_at_import_time() -> None:
    modules = _modules()
    graph = {
        name: {dep for dep in _imports(name, path, top_level_only=True) if dep in modules}
        for name, path in modules.items()
    }
    for name in graph:  # a package's submodule imports its package's __init__ first
        graph[name] -= {name}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, " -> ".join([*visiting[visiting.index(name) :], name])
        visiting.append(name)
        for dep in sorted(graph[name]):
            if not name.startswith(dep + "."):  # importing one's own parent package is not a cycle
                visit(dep)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_integrations_use_only_the_public_contract() -> None:
    for name, path in _modules().items():
        if not name.startswith("crashoverride.integrations"):
            continue
        private = sorted(
            dep
            for dep in _imports(name, path, top_level_only=False)
            if dep.startswith("crashoverride.") and not dep.startswith("crashoverride.integrations")
            and any(part.startswith("_") for part in dep.split(".")[1:])
        )  # fmt: skip
        assert private == [], f"{name} imports private names: {private}"


def test_the_algorithm_lives_in_one_module() -> None:
    # The steps are named once, in _pipeline; the entry points only describe and drive. The
    # one pluggable piece, admission and single-flight, is asked of the coordination backend,
    # whose in-process implementation is the only user of the breaker and the flights (the
    # fleet backend goes through it).
    def holders(*calls: str) -> list[str]:
        return sorted(
            path.name
            for path in (ROOT / "crashoverride").rglob("*.py")
            if any(call in path.read_text() for call in calls)
        )

    assert holders("limits.slots.acquire(") == ["_pipeline.py"]
    assert holders("breaker.admit(", "flights.join(") == ["_coordination.py"]
    assert holders("coordination.join(", "coordination.admit(") == ["_pipeline.py"]
