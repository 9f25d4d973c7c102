"""Where ``Any`` is written in the package's signatures, read from the source (no import).

Run as a script, it prints how much of the package is still typed ``Any`` (issue 21)::

    python -m tests.architecture.annotations [SRC]   # bare-Any parameters / all parameters
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.architecture.graph import PACKAGE, SRC, modules


@dataclass(frozen=True)
class Slot:
    """One parameter (``name``) or return (``name`` is ``"return"``) of one function."""

    module: str
    function: str  # qualified within the module: ``Class.method``, ``outer.inner``
    name: str
    line: int
    annotation: ast.expr | None

    @property
    def bare_any(self) -> bool:
        """Annotated ``Any`` itself (not merely containing it, as ``dict[str, Any]`` does)."""
        return self.annotation is not None and _is_any(_unquoted(self.annotation))

    @property
    def mentions_any(self) -> bool:
        """``Any`` anywhere in the annotation, ``dict[str, Any]`` and ``Callable[..., Any]`` too."""
        if self.annotation is None:
            return False
        return any(map(_is_any, ast.walk(_unquoted(self.annotation))))

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.function}({self.name})"


def _unquoted(node: ast.expr) -> ast.expr:
    """A quoted annotation (``"list[Any]"``) as the expression it spells."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return ast.parse(node.value, mode="eval").body
    return node


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def slots(module: str, source: str) -> Iterator[Slot]:
    """Every parameter (``self`` and ``cls`` left out) and return of every function in it."""

    def visit(node: ast.AST, prefix: str) -> Iterator[Slot]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                a = child.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None and arg.arg not in ("self", "cls"):
                        yield Slot(module, name, arg.arg, arg.lineno, arg.annotation)
                yield Slot(module, name, "return", child.lineno, child.returns)
                yield from visit(child, f"{name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(source), "")


def package_slots(src: Path = SRC) -> list[Slot]:
    """Every slot of the package under ``src`` (this checkout's by default)."""
    found = modules() if src == SRC else _modules(src)
    return [
        slot
        for module, path in found.items()
        for slot in slots(module, path.read_text(encoding="utf-8"))
    ]


def _modules(src: Path) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(src).with_suffix("").parts): path
        for path in sorted((src / PACKAGE).rglob("*.py"))
    }


def main(argv: list[str]) -> None:
    src = Path(argv[0]) if argv else SRC
    every = package_slots(src)
    parameters = [slot for slot in every if slot.name != "return"]
    returns = [slot for slot in every if slot.name == "return"]
    print(f"{PACKAGE} under {src}:")
    for what, found in (("parameters", parameters), ("returns", returns)):
        print(f"  {what} annotated bare Any: {sum(s.bare_any for s in found)} of {len(found)}")


if __name__ == "__main__":
    main(sys.argv[1:])
