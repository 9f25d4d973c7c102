"""The settings table is the one spelling of every setting; everything else mirrors it.

``CrashOverride.__init__`` and the ``handler`` signature type checkers see are written out (IDEs
and type checkers cannot read a table), so these tests hold them, and the docstrings, to it.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import crashoverride._app as app_module
from crashoverride import ConfigurationError, CrashOverride
from crashoverride._config.settings import APP, BOTH, FIELDS, HANDLER, UNSET, Settings, override

APP_FIELDS = [field for field in FIELDS if field.scope != HANDLER]
HANDLER_FIELDS = [field for field in FIELDS if field.scope != APP]


def _same(a: object, b: object) -> bool:
    # ``120`` for ``120.0`` or ``[]`` for ``()`` would be drift too.
    return a is b or (type(a) is type(b) and a == b)


def _type_checking_handler() -> inspect.Signature:
    """Compile the ``handler`` that only type checkers see, so its signature can be inspected."""
    tree = ast.parse(Path(app_module.__file__).read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CrashOverride")
    (stub,) = (
        node
        for block in cls.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.FunctionDef) and node.name == "handler"
    )
    module = ast.Module(body=[stub], type_ignores=[])
    namespace = dict(vars(app_module))
    # compile() inherits this module's ``from __future__ import annotations``, as ``_app`` has it:
    # the annotations (names imported only for type checkers) stay unevaluated.
    exec(compile(module, app_module.__file__, "exec"), namespace)
    return inspect.signature(namespace["handler"])


def _documented(doc: str | None) -> dict[str, str]:
    """The ``Args:`` entries of a Google docstring, each joined into one line."""
    lines = inspect.cleandoc(doc or "").splitlines()
    section = []
    for line in lines[lines.index("Args:") + 1 :]:
        if line and not line.startswith(" "):  # the next section
            break
        section.append(line)
    body = textwrap.dedent("\n".join(section)).strip()
    entries = re.split(r"\n(?=\S)", body)
    return {
        entry.split(":", 1)[0]: " ".join(entry.split(":", 1)[1].split())
        for entry in entries
        if entry.strip()
    }


def test_the_table_is_well_formed() -> None:
    names = [field.name for field in FIELDS]
    aliases = [alias for field in FIELDS for alias in field.aliases]
    assert len(set(names + aliases)) == len(names) + len(aliases)
    assert set(vars(Settings)) >= set(names)
    for field in FIELDS:
        assert field.scope in (APP, HANDLER, BOTH), field.name
        assert field.doc and "\n" not in field.doc and field.doc.endswith("."), field.name
        assert not field.aliases or field.scope != APP, field.name
        # Merging is what a handler does: an application-only field has nothing to merge.
        assert field.merge is override or field.scope == BOTH, field.name


def test_construction_and_overrides_are_driven_by_the_table() -> None:
    settings = CrashOverride()._settings
    for field in FIELDS:
        assert _same(getattr(settings, field.name), field.checked_default), field.name
    derived = settings.for_handler({field.name: field.handler_default for field in HANDLER_FIELDS})
    assert vars(derived) == vars(settings)  # "not given" changes nothing


def test_the_constructor_signature_mirrors_the_table() -> None:
    parameters = list(inspect.signature(CrashOverride.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [field.name for field in APP_FIELDS]
    for parameter, field in zip(parameters, APP_FIELDS, strict=True):
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, field.name
        assert _same(parameter.default, field.default), field.name


def test_the_handler_signature_type_checkers_see_mirrors_the_table() -> None:
    parameters = list(_type_checking_handler().parameters.values())[1:]
    expected = [
        (name, field.handler_default if name == field.name else UNSET)
        for field in HANDLER_FIELDS
        for name in (field.name, *field.aliases)
    ]
    assert [p.name for p in parameters] == [name for name, _ in expected]
    assert parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD  # ``handler("...")``
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[1:])
    for parameter, (name, default) in zip(parameters, expected, strict=True):
        assert _same(parameter.default, default), name


def test_the_signatures_annotate_each_argument_with_the_tables_type() -> None:
    # ``_app`` has ``from __future__ import annotations``: each annotation is its source text,
    # compared as written (``Callable[[str], Any]`` for an approver that gets an
    # ``ApprovalRequest`` was such a drift: a correctly typed approver failed mypy --strict).
    init = list(inspect.signature(CrashOverride.__init__).parameters.values())[1:]
    for parameter, field in zip(init, APP_FIELDS, strict=True):
        assert parameter.annotation == field.annotation, field.name
    handler = list(_type_checking_handler().parameters.values())[1:]
    expected = [
        (name, field.annotation if name == field.name else field.aliases[name])
        for field in HANDLER_FIELDS
        for name in (field.name, *field.aliases)
    ]
    assert [(p.name, p.annotation) for p in handler] == expected


def test_the_tables_types_name_what_the_signatures_module_can_see() -> None:
    # Each annotation must resolve where the signatures are written (type checkers resolve it
    # there), imported for type checking only or not.
    tree = ast.parse(Path(app_module.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    builtin = set(vars(builtins))
    for field in FIELDS:
        for annotation in (field.annotation, *field.aliases.values()):
            names = set(re.findall(r"[A-Za-z_]\w*", annotation))
            assert names <= imported | builtin, (field.name, names - imported - builtin)


def test_the_runtime_handler_accepts_exactly_the_handler_arguments() -> None:
    co = CrashOverride()
    for field in HANDLER_FIELDS:
        for name in (field.name, *field.aliases):
            co.handler(**{name: field.default})
    for field in FIELDS:
        if field.scope == APP:
            with pytest.raises(ConfigurationError, match="is not a handler argument") as info:
                co.handler(**{field.name: field.default})
            assert info.value.argument == field.name


@pytest.mark.parametrize("name", [field.name for field in FIELDS if field.scope == HANDLER])
def test_handler_only_fields_are_not_application_arguments(name: str) -> None:
    with pytest.raises(ConfigurationError, match="is not a CrashOverride argument"):
        Settings.for_app(**{name: "x"})


def test_unset_application_arguments_take_the_default() -> None:
    assert Settings.for_app(timeout=UNSET).timeout == Settings.timeout.checked_default


def test_the_docstring_documents_every_application_argument_from_the_table() -> None:
    documented = _documented(CrashOverride.__doc__)
    assert list(documented) == [field.name for field in APP_FIELDS]
    for field in APP_FIELDS:
        assert documented[field.name].startswith(field.doc), field.name


def test_the_handler_docstring_documents_the_handler_only_arguments() -> None:
    documented = _documented(CrashOverride.handler.__doc__)
    for field in HANDLER_FIELDS:
        if field.scope == HANDLER:
            assert documented[field.name].startswith(field.doc), field.name
        for alias in field.aliases:
            assert alias in documented


def test_settings_are_immutable() -> None:
    settings = CrashOverride()._settings
    with pytest.raises(AttributeError):
        settings.timeout = 1.0
    with pytest.raises(AttributeError):
        del settings.timeout
