"""An approver that holds against a curious model: an AST allow-list of what it may touch.

``approve=`` sees every tool call before it runs (a snippet as its code, any other tool as
``name(arg=value)``, with ``call.tool`` and ``call.arguments``). Matching strings in the code is
easy to evade: ``"os.remove" not in code`` passes

    getattr(__import__('o' + 's'), 'remove')('ledger.db')

``AllowList`` parses each snippet instead and allows only what it can account for:

- names you list (the objects the agent may touch, e.g. ``caller``, ``orders``), names the
  snippet binds itself, and a few builtins that only compute (``len``, ``sorted``...);
  ``getattr``, ``__import__``, ``eval``, ``open``, ``type``, ``vars``, ``globals`` are not among
  them, whatever the spelling, because a name is a node, not a substring;
- attributes that are public (no leading ``_``: no ``__class__``, ``__globals__``...) and not
  a way into frames or code (``f_globals``, ``tb_frame``, ``gi_frame``, ``co_code``...), nor
  ``format`` / ``format_map`` (format strings read attributes by name); optionally only the
  attribute names you list;
- no imports, no ``global`` / ``nonlocal``, no function, class or lambda definitions.

Any other tool call is allowed only by its name (``tools=``). The objects you list are trusted
with their whole public API: listing ``orders`` lets the agent call ``orders.refund``. List
objects whose every public method you would let it call, or pass ``attributes=``.

This is an example, not a proof: a listed object can hand out anything it references. Run
``python examples/approvers.py`` to see it judge a few snippets.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "len", "list", "max", "min", "print", "range", "repr", "reversed", "round",
    "set", "sorted", "str", "sum", "tuple", "zip",
    "Exception", "KeyError", "ValueError",  # for ``except`` clauses
})  # fmt: skip

# Ways from an object into frames, code and globals, and the string methods that read
# attributes by name from their arguments.
_DENIED_PREFIXES = ("_", "f_", "tb_", "gi_", "cr_", "ag_", "co_")
_DENIED_ATTRIBUTES = frozenset({"format", "format_map", "mro"})

_FORBIDDEN = (
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal,
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
)  # fmt: skip
_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


class AllowList:
    """``approve=`` callable: snippets may touch only ``names``; other tools only ``tools``.

    Args:
        names: The objects (by the name the agent's code uses) it may read, call and change.
        tools: Non-code tools it may call by name (``give_up``, your application's tools).
        attributes: If given, the only attribute names a snippet may use.
        builtins: The builtins a snippet may use.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        tools: Iterable[str] = ("give_up",),
        attributes: Iterable[str] | None = None,
        builtins: Iterable[str] = SAFE_BUILTINS,
    ) -> None:
        self.names = frozenset(names) | frozenset(builtins)
        self.tools = frozenset(tools)
        self.attributes = None if attributes is None else frozenset(attributes)

    def __call__(self, call: Any) -> bool | str:
        if not getattr(call, "is_code", True):  # a tool that runs no code: judged by name
            tool = getattr(call, "tool", "?")
            return True if tool in self.tools else f"the tool {tool} is not on the allow-list"
        return self.check(str(call))

    def check(self, code: str) -> bool | str:
        """True, or the reason ``code`` is refused."""
        try:
            tree = compile(code, "<snippet>", "exec", flags=_PARSE_FLAGS)
        except SyntaxError as exc:
            return f"it does not parse: {exc.msg}"
        bound = _bound_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, _FORBIDDEN):
                return f"{type(node).__name__} is not allowed"
            if isinstance(node, ast.Name) and self._unknown(node, bound):
                return f"the name {node.id!r} is not on the allow-list"
            if isinstance(node, ast.Attribute) and not self._attribute_ok(node.attr):
                return f"the attribute {node.attr!r} is not allowed"
        return True

    def _unknown(self, node: ast.Name, bound: set[str]) -> bool:
        return isinstance(node.ctx, ast.Load) and node.id not in self.names and node.id not in bound

    def _attribute_ok(self, name: str) -> bool:
        if name.startswith(_DENIED_PREFIXES) or name in _DENIED_ATTRIBUTES:
            return False
        return self.attributes is None or name in self.attributes


def _bound_names(tree: ast.AST) -> set[str]:
    # Names the snippet assigns (targets, loop and comprehension variables, ``as`` names):
    # their values come from expressions that are checked themselves.
    bound = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name}
    return bound


def _demo() -> None:
    approve = AllowList({"caller", "orders"})
    for code in (
        "caller['total'] = sum(o.amount for o in orders.pending)",
        "getattr(__import__('o' + 's'), 'remove')('ledger.db')",
        "max([1], key=exec)",
        "orders.refund.__func__.__globals__['os']",
        "'{0.__globals__}'.format(orders.refund)",
    ):
        verdict = approve.check(code)
        print(f"{'allowed' if verdict is True else 'denied '}  {code}")
        if verdict is not True:
            print(f"         {verdict}")


if __name__ == "__main__":
    _demo()
