"""How the package builds briefs, read from its source: parts fixed at import, values fenced.

A ``Brief``'s positional arguments are its trusted parts, shown to the agent as instructions; its
keyword arguments are values, fenced as data. The rules, checked on the syntax tree:

1. Every part of every ``Brief(...)`` is fixed at import: a string literal, a module constant
   (an UPPER_CASE name bound at module level), an entry of one (``NOTES[key]``,
   ``NOTES.get(key, DEFAULT)``), or a choice between such (``A if cond else B``). Never an
   f-string, ``.format``, ``%``, ``+``, a local variable, a call or an unpacked sequence: that
   is how a request's path or a task's id would get into the instructions.
2. Such a constant is bound only at module level: no function rebinds it (``global``), assigns
   into it or calls a mutating method on it, since it would then no longer be fixed at import.
3. Whatever is passed as a brief (``brief=`` in any call, an assignment to ``.brief``) is a
   ``Brief(...)``, a parameter annotated as one, or the result of a function named ``brief`` /
   ``*_brief``, which must be annotated to return one (4).
5. No function formats, ``%``-formats or extends a ``*_BRIEF`` template.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
MUTATORS = frozenset({
    "append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove",
    "__setitem__", "__delitem__", "__iadd__",
})  # fmt: skip


@dataclass(frozen=True)
class Finding:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


@dataclass
class Scan:
    """What ``scan`` found: the construction sites, and the rules they break."""

    briefs: list[Finding] = field(default_factory=list)  # every Brief(...) call
    blocks: list[Finding] = field(default_factory=list)  # every Block(...) call
    violations: list[Finding] = field(default_factory=list)


def _callee(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _mentions_brief(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "Brief" in annotation.value
    return any(
        (isinstance(n, ast.Name) and n.id == "Brief")
        or (isinstance(n, ast.Attribute) and n.attr == "Brief")
        for n in ast.walk(annotation)
    )


def _fixed(part: ast.expr, constants: list[tuple[str, int]]) -> bool:
    """Whether ``part`` is text fixed at import; the constants it reads go to ``constants``."""
    if isinstance(part, ast.Constant):
        return isinstance(part.value, str)
    if isinstance(part, ast.Name):
        if CONSTANT.match(part.id):
            constants.append((part.id, part.lineno))
            return True
        return False
    if isinstance(part, ast.Subscript):
        return isinstance(part.value, ast.Name) and _fixed(part.value, constants)
    if isinstance(part, ast.Call):  # NOTES.get(key, DEFAULT)
        func = part.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and isinstance(func.value, ast.Name)
            and len(part.args) == 2
            and not part.keywords
            and _fixed(func.value, constants)
            and _fixed(part.args[1], constants)
        )
    if isinstance(part, ast.IfExp):
        return _fixed(part.body, constants) and _fixed(part.orelse, constants)
    return False


def _functions(tree: ast.Module) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """Every node with the functions around it, innermost last."""

    def walk(node: ast.AST, around: list[ast.AST]) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
        yield node, around
        is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        inner = [*around, node] if is_function else around
        for child in ast.iter_child_nodes(node):
            yield from walk(child, inner)

    yield from walk(tree, [])


def _brief_params(around: list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for func in around:
        assert isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        args = func.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if _mentions_brief(arg.annotation):
                names.add(arg.arg)
    return names


def _is_brief(value: ast.expr, params: set[str]) -> bool:
    if isinstance(value, ast.Call):
        name = _callee(value) or ""
        return name == "Brief" or name == "brief" or name.endswith("_brief")
    if isinstance(value, ast.Name):
        return value.id in params
    if isinstance(value, ast.IfExp):
        return _is_brief(value.body, params) and _is_brief(value.orelse, params)
    return False


def _root(target: ast.expr) -> str | None:
    while isinstance(target, ast.Subscript | ast.Attribute):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


class _Module:
    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.tree = ast.parse(source)
        self.bound: set[str] = set()  # names bound at module level
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        for node in self.tree.body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            self.bound.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module, alias.name)

    def changed_in_functions(self, constant: str) -> list[int]:
        """Lines where a function rebinds ``constant`` or changes it in place."""
        lines: list[int] = []
        for node, around in _functions(self.tree):
            if not around:
                continue
            if isinstance(node, ast.Global) and constant in node.names:
                lines.append(node.lineno)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            if any(_root(t) == constant for t in targets):
                lines.append(node.lineno)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
                and _root(node.func.value) == constant
            ):
                lines.append(node.lineno)
        return lines


def scan(sources: Mapping[str, str]) -> Scan:
    """Check ``sources`` (module name -> source text) against the rules in the module docs."""
    modules = {name: _Module(name, text) for name, text in sources.items()}
    found = Scan()

    def flag(module: str, line: int, what: str) -> None:
        found.violations.append(Finding(module, line, what))

    def defining(module: str, name: str, seen: int = 0) -> str | None:
        here = modules[module]
        if name in here.bound:
            return module
        origin = here.imported.get(name)
        if origin is None or origin[0] not in modules or seen > 10:
            return None
        return defining(origin[0], origin[1], seen + 1)

    for name, module in modules.items():
        for node, around in _functions(module.tree):
            if isinstance(node, ast.Call) and _callee(node) == "Brief":
                found.briefs.append(Finding(name, node.lineno, "Brief(...)"))
                constants: list[tuple[str, int]] = []
                for part in node.args:
                    if isinstance(part, ast.Starred):
                        flag(name, node.lineno, "a brief's parts unpacked from a sequence")
                    elif not _fixed(part, constants):
                        flag(name, part.lineno, f"a brief part not fixed at import: "
                                                f"{ast.unparse(part)}")  # fmt: skip
                for constant, line in constants:
                    home = defining(name, constant)
                    if home is None:
                        flag(name, line, f"{constant} is no module constant of the package")
                        continue
                    for changed in modules[home].changed_in_functions(constant):
                        flag(home, changed, f"{constant}, a brief part, is changed at run time")
            if isinstance(node, ast.Call) and _callee(node) == "Block":
                found.blocks.append(Finding(name, node.lineno, "Block(...)"))
            given: list[tuple[ast.expr, int]] = []
            if isinstance(node, ast.Call):
                given += [(k.value, k.value.lineno) for k in node.keywords if k.arg == "brief"]
            if isinstance(node, ast.Assign):
                given += [
                    (node.value, node.lineno)
                    for t in node.targets
                    if isinstance(t, ast.Attribute) and t.attr == "brief"
                ]
            params = _brief_params(around) if given else set()
            for value, line in given:
                if not _is_brief(value, params):
                    flag(name, line, f"a brief that is not a Brief: {ast.unparse(value)}")
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and (node.name == "brief" or node.name.endswith("_brief"))
                and not _mentions_brief(node.returns)
            ):
                flag(name, node.lineno, f"{node.name}() is not annotated to return a Brief")
            if around and _formats_a_template(node):
                flag(name, node.lineno, f"a brief template filled in: {ast.unparse(node)}")
    return found


def _formats_a_template(node: ast.AST) -> bool:
    def template(e: ast.expr) -> bool:
        return isinstance(e, ast.Name) and e.id.endswith("_BRIEF")

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"format", "format_map", "replace"} and template(node.func.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return template(node.left) or template(node.right)
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) and template(v.value) for v in node.values)
    return False
