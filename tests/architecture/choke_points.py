"""The reader behind ``test_choke_points``: where code-running names are used, by AST.

Two questions about a module's source, each answered without importing it:

* ``builtin_uses``: where the ``exec``/``eval``/``compile`` builtins are reached, spelled any
  way a reader can see (a call, a bare name handed on, ``builtins.exec``,
  ``getattr(builtins, "exec")``, ``__builtins__["eval"]``);
* ``uses``: for each use of a watched name (a call or a reference), the function it sits in
  (its qualified name inside the module; ``<module>`` at the top) and the name used.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

BUILTINS = frozenset({"exec", "eval", "compile"})
_HOLDERS = frozenset({"builtins", "__builtins__"})


@dataclass(frozen=True, order=True)
class Use:
    module: str
    function: str  # qualified name of the enclosing function, "<module>" at the top
    name: str  # the watched name used there
    line: int


def builtin_uses(module: str, source: str) -> list[Use]:
    """Every place ``source`` reaches one of ``BUILTINS``."""
    found = []
    for where, node in _walk(ast.parse(source)):
        name = _builtin_reached(node)
        if name is not None:
            found.append(Use(module, where, name, node.lineno))
    return found


def _builtin_reached(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id in BUILTINS:
        return node.id
    if (  # builtins.exec, __builtins__.eval
        isinstance(node, ast.Attribute)
        and node.attr in BUILTINS
        and isinstance(node.value, ast.Name)
        and node.value.id in _HOLDERS
    ):
        return node.attr
    if isinstance(node, ast.Subscript) and _constant(node.slice) in BUILTINS:
        return _constant(node.slice)  # __builtins__["eval"], vars(builtins)["exec"]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and _constant(node.args[1]) in BUILTINS
    ):
        return _constant(node.args[1])
    return None


def _constant(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def uses(
    module: str,
    source: str,
    names: frozenset[str],
    attributes: frozenset[tuple[str | None, str]] = frozenset(),
) -> list[Use]:
    """Every use in ``source`` of a watched name, called or not (handing a function on is a use
    too): a bare name in ``names``, or ``receiver.attribute`` in ``attributes`` (``(None,
    attribute)``: on any receiver). ``Use.name`` is the bare name or ``receiver.attribute``."""
    found = []
    for where, node in _walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in names:
            found.append(Use(module, where, node.id, node.lineno))
        elif isinstance(node, ast.Attribute):
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if (receiver, node.attr) in attributes or (None, node.attr) in attributes:
                text = f"{receiver or '(...)'}.{node.attr}"
                found.append(Use(module, where, text, node.lineno))
    return found


def calls_in(source: str, function: str) -> set[str]:
    """What ``function`` (a qualified name in ``source``) calls, nested functions and lambdas
    included: ``f(...)`` gives ``f``, ``name.f(...)`` gives ``name.f``."""
    called = set()
    for where, node in _walk(ast.parse(source)):
        inside = where == function or where.startswith(function + ".")
        if inside and isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                called.add(func.id)
            elif isinstance(func, ast.Attribute):
                receiver = func.value.id if isinstance(func.value, ast.Name) else "(...)"
                called.add(f"{receiver}.{func.attr}")
    return called


def _walk(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every node with the qualified name of the function (or lambda) it sits in."""
    for child in ast.iter_child_nodes(tree):
        yield from _visit(child, "<module>")


def _visit(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        inner = node.name if where == "<module>" else f"{where}.{node.name}"
        # Decorators, defaults and bases are evaluated where the definition is.
        for outer in (*node.decorator_list, *_defaults(node)):
            yield from _visit(outer, where)
        for statement in node.body:
            yield from _visit(statement, inner)
        return
    if isinstance(node, ast.Lambda):
        for default in _defaults(node):
            yield from _visit(default, where)
        yield from _visit(node.body, f"{where}.<lambda>")
        return
    if isinstance(node, ast.AnnAssign):  # the annotation is never evaluated (PEP 563)
        for part in (node.target, node.value):
            if part is not None:
                yield from _visit(part, where)
        return
    yield where, node
    for child in ast.iter_child_nodes(node):
        yield from _visit(child, where)


def _defaults(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda,
) -> list[ast.expr]:
    if isinstance(node, ast.ClassDef):
        return [*node.bases, *(keyword.value for keyword in node.keywords)]
    args = node.args
    return [*args.defaults, *(default for default in args.kw_defaults if default is not None)]
