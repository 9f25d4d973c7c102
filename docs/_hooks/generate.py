"""Reference pages generated from the code when the site is built (an MkDocs hook).

A page asks for a generated part with a marker on a line of its own:

- ``<!-- generated: crashoverride-arguments -->``: the ``CrashOverride(...)`` arguments,
- ``<!-- generated: handler-arguments -->``: the ``co.handler(...)`` arguments,
- ``<!-- generated: events -->``: every structlog event.

The settings come from the one table, ``crashoverride._config.settings.FIELDS`` (names, order,
defaults, types, scope, the one-line doc); the events from the registry,
``src/crashoverride/_observe/events.py`` (each name and the comment written above it). So the
reference cannot drift from the code: a new setting or event appears at the next build.
``tests/e2e/test_docs.py`` imports this module to check the pages it makes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EVENTS = SRC / "crashoverride" / "_observe" / "events.py"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _fields() -> list[Any]:
    # The checkout's code, not whatever version is installed: the site documents this tree.
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from crashoverride._config.settings import FIELDS

    return list(FIELDS)


def _default(value: object) -> str:
    if isinstance(value, type):
        return f"`{value.__name__}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def _rst_to_md(text: str) -> str:
    """The settings' docs are written for docstrings: ``code`` becomes `code`."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    # Python-Markdown's tables split on a pipe outside backticks only: code spans keep theirs.
    return text.replace("|", "\\|")


def crashoverride_arguments() -> str:
    from crashoverride._config.settings import APP, HANDLER, override

    rows = [
        "| argument | default | type | per handler | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in _fields():
        if field.scope == HANDLER:
            continue
        if field.scope == APP:
            per_handler = "no"
        elif field.merge is override:
            per_handler = "overrides"
        else:
            per_handler = "adds to"
        rows.append(
            f"| `{field.name}` | {_default(field.default)} | `{field.annotation}` "
            f"| {per_handler} | {_cell(_rst_to_md(field.doc))} |"
        )
    return "\n".join(rows) + "\n"


def handler_arguments() -> str:
    from crashoverride._config.settings import APP, HANDLER, override

    rows = [
        "| argument | default | type | with the application's | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in _fields():
        if field.scope == APP:
            continue
        if field.scope == HANDLER:
            relation, default = "its own", _default(field.default)
        elif field.merge is override:
            relation, default = "overrides it", "the application's"
        else:
            relation, default = "added to it, without duplicates", "`()`"
        names = ", ".join(f"`{name}`" for name in (field.name, *field.aliases))
        rows.append(
            f"| {names} | {default} | `{field.annotation}` | {relation} "
            f"| {_cell(_rst_to_md(field.doc))} |"
        )
    return "\n".join(rows) + "\n"


def registry() -> list[tuple[str, str]]:
    """Every event the registry defines, in its order: (name, the comment above it)."""
    source = EVENTS.read_text()
    lines = source.splitlines()
    found: list[tuple[str, str]] = []
    for node in ast.parse(source).body:
        value = getattr(node, "value", None)
        if not (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "fixed"
            and value.args
            and isinstance(value.args[0], ast.Constant)
        ):
            continue
        comment: list[str] = []
        index = node.lineno - 2
        while index >= 0 and lines[index].lstrip().startswith("#"):
            comment.insert(0, lines[index].lstrip("# ").strip())
            index -= 1
        found.append((str(value.args[0].value), " ".join(comment)))
    return found


def events() -> str:
    rows = ["| event | when |", "|---|---|"]
    for name, comment in registry():
        rows.append(f"| `{name}` | {_cell(_rst_to_md(comment))} |")
    return "\n".join(rows) + "\n"


GENERATORS = {
    "crashoverride-arguments": crashoverride_arguments,
    "handler-arguments": handler_arguments,
    "events": events,
}


def expand(markdown: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated part {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)
