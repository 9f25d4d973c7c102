"""Diagnose mode's evaluator where no forked snapshot is available (see ``_diagnose.snapshot``).

It walks the expression's syntax tree itself and never runs code the process supplies: no
function or method of the application, no property, ``__getattr__``, ``__getattribute__``,
``__repr__``, ``__eq__`` or ``__bool__`` of an application type (``_diagnose.static`` reads
objects). What an expression can do:

- names resolve as in ``eval`` (the namespace, the block's locals, module globals, builtins);
- attributes are read statically: an instance's ``__dict__`` entry, a class attribute, a slot
  or a C-level field; a property or other computed attribute is refused, not run;
- indexing, comparison, arithmetic and truth tests on plain data (exact ``int``, ``str``,
  ``list``, ``dict``... of plain data) and lengths and indexing of exact containers;
- calls of ``PURE`` builtins on plain data, with a ``key=`` that is itself one of them; the
  ``STATIC`` inspection builtins on any object, done statically; ``show_source``; the read-only
  methods of exact built-in types (``_METHODS``). The builtins must be the builtins
  themselves: a local that shadows ``len`` is not ``len``.

Everything else raises ``PermissionError``. The work stays bounded too, since it runs in the
process itself: plain data counts only up to 100,000 items (``_diagnose.static``), and what
multiplies sizes (``str * n``, ``format`` widths, ``str.replace``, ``sum`` with a start) is left
out. Residue: looking up a plain key in a dict whose keys are application objects compares it with a
stored key of equal hash (that key's ``__eq__``).
"""

from __future__ import annotations

import ast
import builtins
import datetime
import types
from collections.abc import Callable, Mapping
from typing import Any

from crashoverride._diagnose.static import (
    describe,
    has_attribute,
    instance_dict,
    is_plain,
    is_type,
    one_of,
    plain_classes,
    read_attribute,
    refuse,
    render_static,
    static_dir,
    truth,
)
from crashoverride._placement.frames import CallerLocals

PURE = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset",
    "hash", "int", "list", "max", "min", "range", "reversed", "round", "set", "sorted", "str",
    "sum", "tuple", "zip", "chr", "ord", "bin", "hex", "oct",
})  # fmt: skip
STATIC = frozenset({
    "len", "type", "id", "callable", "isinstance", "issubclass", "hasattr", "getattr", "vars",
    "dir", "repr",
})  # fmt: skip
SAFE_FUNCTIONS = PURE | STATIC | {"show_source"}
_STR_METHODS = """startswith endswith lower upper strip lstrip rstrip split rsplit splitlines
find rfind count index isdigit isalpha isidentifier join partition casefold encode"""
_METHODS: dict[type, frozenset[str]] = {
    dict: frozenset({"keys", "values", "items", "get", "copy"}),
    list: frozenset({"count", "index", "copy"}),
    tuple: frozenset({"count", "index"}),
    str: frozenset(_STR_METHODS.split()),
    bytes: frozenset({"hex", "decode", "startswith", "endswith", "count", "find"}),
    datetime.date: frozenset({"isoformat"}),
    datetime.datetime: frozenset({"isoformat", "timestamp"}),
}
_BY_OBJECT = {id(getattr(builtins, name)): name for name in PURE | STATIC}
_SIZED = (list, tuple, dict, set, frozenset, str, bytes, range)
_SOURCE_KINDS = (types.FunctionType, types.ModuleType, type)  # ``type``: no metaclass
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
}  # fmt: skip
_NUMBERS = (int, float, bool)
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip


def evaluate_plain(expression: str, globals_: Mapping[str, Any], names: Mapping[str, Any]) -> Any:
    """The rendered value of ``expression`` (None if it is None); ``PermissionError`` if refused."""
    tree = ast.parse(expression.strip(), "<inspect_python>", "eval")
    value = _Evaluator(globals_, names).visit(tree.body)
    if value is None or type(value) is str:
        return value  # shown as any tool shows them (``describe_result``)
    return render_static(value)


class _Evaluator(ast.NodeVisitor):
    def __init__(self, globals_: Mapping[str, Any], names: Mapping[str, Any]) -> None:
        self.globals = globals_
        self.names = names

    def generic_visit(self, node: ast.AST) -> Any:
        raise refuse(f"{type(node).__name__} is not supported")

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        for scope in (self.names, self.globals):
            try:
                return scope[node.id]
            except KeyError:
                pass
        found = self.globals.get("__builtins__", builtins)
        table = found if type(found) is dict else vars(builtins)
        if node.id in table:
            return table[node.id]
        raise NameError(f"name {node.id!r} is not defined")

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        return read_attribute(self.visit(node.value), node.attr)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        container, key = self.visit(node.value), self.visit(node.slice)
        if type(container) is CallerLocals and type(key) is str:
            return container[key]
        if one_of(type(container), _SIZED) and _plain_key(key):
            return container[key]
        raise refuse(f"indexing a {describe(container)} runs its code")

    def visit_Slice(self, node: ast.Slice) -> slice:
        parts = [None if p is None else self.visit(p) for p in (node.lower, node.upper, node.step)]
        return slice(*parts)

    def visit_Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self.visit(item) for item in node.elts)

    def visit_List(self, node: ast.List) -> list[Any]:
        return [self.visit(item) for item in node.elts]

    def visit_Set(self, node: ast.Set) -> set[Any]:
        return set(self._plain([self.visit(item) for item in node.elts]))

    def visit_Dict(self, node: ast.Dict) -> dict[Any, Any]:
        if any(key is None for key in node.keys):
            raise refuse("** in a dict display is not supported")
        keys = self._plain([self.visit(key) for key in node.keys if key is not None])
        return dict(zip(keys, [self.visit(value) for value in node.values], strict=True))

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        value: Any = None
        for item in node.values:
            value = self.visit(item)
            if truth(value) is isinstance(node.op, ast.Or):
                return value
        return value

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return not truth(value)
        if one_of(type(value), _NUMBERS) and isinstance(node.op, ast.USub | ast.UAdd):
            return -value if isinstance(node.op, ast.USub) else +value
        raise refuse(f"{type(node.op).__name__} on a {describe(value)}")

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        operation = _ARITHMETIC.get(type(node.op))
        numbers = one_of(type(left), _NUMBERS) and one_of(type(right), _NUMBERS)
        joined = isinstance(node.op, ast.Add) and type(left) is type(right) and is_plain(left)
        if operation is None or not (numbers or (joined and is_plain(right))):
            raise refuse(f"{type(node.op).__name__} of {describe(left)} and {describe(right)}")
        return operation(left, right)

    def visit_Compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, item in zip(node.ops, node.comparators, strict=True):
            right = self.visit(item)
            if isinstance(op, ast.Is | ast.IsNot):
                holds = (left is right) is isinstance(op, ast.Is)
            elif isinstance(op, ast.In | ast.NotIn) and one_of(type(right), _SIZED):
                holds = _COMPARE[type(op)](self._plain([left])[0], self._plain_members(right))
            else:
                self._plain([left, right])
                holds = _COMPARE[type(op)](left, right)
            if not holds:
                return False
            left = right
        return True

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body if truth(self.visit(node.test)) else node.orelse)

    def visit_Call(self, node: ast.Call) -> Any:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            raise refuse("* and ** arguments are not supported")
        args = [self.visit(a) for a in node.args]
        kwargs = {str(k.arg): self.visit(k.value) for k in node.keywords}
        if isinstance(node.func, ast.Attribute):
            receiver = self.visit(node.func.value)
            return _method(receiver, node.func.attr, args, kwargs)
        return _function(self.visit(node.func), args, kwargs)

    @staticmethod
    def _plain(values: list[Any]) -> list[Any]:
        for value in values:
            if not is_plain(value):
                raise refuse(f"comparing or hashing a {describe(value)} runs its code")
        return values

    def _plain_members(self, container: Any) -> Any:
        if type(container) is dict:
            return container  # membership hashes the plain key only
        return self._plain([container])[0]


def _plain_key(key: Any) -> bool:
    if type(key) is slice:
        return all(is_plain(p) for p in (key.start, key.stop, key.step))
    return is_plain(key)


def _method(receiver: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    kind = type(receiver)
    if kind is CallerLocals and name in _METHODS[dict]:
        receiver, kind = {key: receiver[key] for key in receiver}, dict
    allowed = next((names for k, names in _METHODS.items() if kind is k), frozenset())
    if name not in allowed:
        raise refuse(f"calling {name}() on {describe(receiver)} is not allowed")
    if not is_plain(receiver) and (name in ("count", "index") or kind not in _SIZED):
        raise refuse(f"{name}() of a {describe(receiver)} may run its code")
    _require_plain(args, kwargs)
    return getattr(receiver, name)(*args, **kwargs)


def _require_plain(args: list[Any], kwargs: dict[str, Any]) -> None:
    for value in [*args, *kwargs.values()]:
        if not is_plain(value):
            raise refuse(f"a {describe(value)} can be passed only to inspection functions")


def _function(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    from crashoverride._diagnose.source import show_source

    if func is show_source and len(args) == 1 and not kwargs:
        # ``inspect`` asks an object whether it is a class or wraps another (``isinstance``,
        # ``__wrapped__``): only kinds that cannot answer with code of their own go there.
        target = args[0]
        target = target.__func__ if type(target) is types.MethodType else target
        if one_of(type(target), _SOURCE_KINDS) and "__wrapped__" not in (vars(target) or {}):
            return show_source(target)
        raise refuse(f"show_source() of a {describe(target)} (functions, classes, modules)")
    name = _BY_OBJECT.get(id(func))
    if name is None or getattr(builtins, name) is not func:
        raise refuse(f"calling {describe(func)} is not allowed (only inspection functions)")
    if name in STATIC:
        return _inspect(name, args, kwargs)
    if name == "sum" and (len(args) != 1 or kwargs):
        raise refuse("sum() of one iterable of numbers only (a start value makes it quadratic)")
    key = kwargs.get("key")
    if key is not None:
        if _BY_OBJECT.get(id(key)) not in PURE | {"len"}:
            raise refuse("key= must be a builtin such as len or str")
        kwargs = {k: v for k, v in kwargs.items() if k != "key"}
    _require_plain(args, kwargs)
    result = func(*args, **kwargs) if key is None else func(*args, key=key, **kwargs)
    return list(result) if name in ("reversed", "enumerate", "zip") else result


def _inspect(name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if kwargs or not args:
        raise refuse(f"{name}() takes positional arguments here")
    value = args[0]
    if name == "getattr" and len(args) in (2, 3) and type(args[1]) is str:
        return read_attribute(value, args[1], *args[2:])
    if name == "hasattr" and len(args) == 2 and type(args[1]) is str:
        return has_attribute(value, args[1])
    if name in ("isinstance", "issubclass") and len(args) == 2:
        kind = type(value) if name == "isinstance" else value
        if not is_type(kind) or type(kind) is not type:
            raise refuse(f"{name}() of a class with a metaclass")
        return issubclass(kind, plain_classes(args[1]))
    if len(args) != 1:
        raise refuse(f"{name}() with {len(args)} arguments")
    if name == "len" and (one_of(type(value), _SIZED) or type(value) is CallerLocals):
        return len(value)
    simple: dict[str, Callable[[Any], Any]] = {
        "type": type, "id": id, "callable": callable, "dir": static_dir, "repr": render_static,
        "vars": lambda v: instance_dict(v) if instance_dict(v) is not None else _no_vars(v),
    }  # fmt: skip
    if name in simple:
        return simple[name](value)
    raise refuse(f"{name}() of a {describe(value)} runs its code")


def _no_vars(value: Any) -> Any:
    raise TypeError(f"vars() argument has no __dict__ ({describe(value)})")
