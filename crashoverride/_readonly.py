"""The expression checker behind diagnose mode's ``inspect_python``.

Diagnose mode promises a recovery that looks but does not touch. An expression passes only if
it contains no statements, assignments, ``await``, ``lambda`` or imports, and calls only
well-known side-effect-free functions and read-only methods. This is best effort, not a sandbox:
attribute access can still run a property's code, and ``repr`` runs an object's ``__repr__``.
"""

from __future__ import annotations

import ast

SAFE_FUNCTIONS = frozenset({
    "abs", "all", "any", "bool", "callable", "dict", "dir", "float", "format", "frozenset",
    "getattr", "hasattr", "hash", "id", "int", "isinstance", "issubclass", "len", "list", "max",
    "min", "repr", "reversed", "round", "set", "show_source", "sorted", "str", "sum", "tuple",
    "type", "vars", "zip", "enumerate", "range",
})  # fmt: skip
SAFE_METHODS = frozenset({
    "keys", "values", "items", "get", "count", "index", "startswith", "endswith", "lower",
    "upper", "strip", "split", "splitlines", "find", "isoformat", "decode", "hex",
})  # fmt: skip
_FORBIDDEN = (ast.NamedExpr, ast.Await, ast.Lambda, ast.Yield, ast.YieldFrom)


def check_read_only(expression: str) -> ast.Expression:
    """Parse ``expression``; raise ``PermissionError`` naming what is not read-only."""
    tree = ast.parse(expression.strip(), "<inspect_python>", "eval")
    for node in ast.walk(tree):
        if isinstance(node, _FORBIDDEN):
            raise PermissionError(f"diagnose mode: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in SAFE_FUNCTIONS:
                continue
            if isinstance(func, ast.Attribute) and func.attr in SAFE_METHODS:
                continue
            shown = ast.unparse(func)
            raise PermissionError(
                f"diagnose mode: calling {shown}() is not allowed (read-only inspection only)"
            )
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in (
            "__name__", "__qualname__", "__module__", "__doc__", "__class__", "__dict__",
        ):  # fmt: skip
            raise PermissionError(f"diagnose mode: attribute {node.attr} is not allowed")
    return tree
