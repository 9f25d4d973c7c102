"""Every text that leaves the process is the redactor's output, by construction (issue 21).

Two rules, read from the source (``ast``), so they hold whatever the tests happen to exercise:

- ``Redacted`` / ``RedactedData`` values are made in ``_security/redact.py`` alone: no other
  module calls their constructors or casts to them;
- every sink takes only those types: the parameters (and fields) listed in ``SINKS`` are
  annotated with them, so ``mypy --strict`` rejects a plain ``str`` handed to one. A listed sink
  that disappears or is retyped fails here; a new sink is added to the list.

Each scanner is also run on a planted violation, so this test can fail.
"""

from __future__ import annotations

import ast
import textwrap

from tests.architecture.graph import modules

HOME = "crashoverride._security.redact"
TYPES = frozenset({"Redacted", "RedactedData"})

REPORT_TEXTS = (
    "recovery_id", "handler", "fingerprint", "exc_type", "exception", "traceback", "reason",
    "via", "model", "diagnosis", "mode", "fleet_role", "fix_record",
)  # fmt: skip

# (module, function / method / dataclass, parameter or field) -> its annotation, as written.
# ``return`` is the return annotation; ``**name`` a keyword-arguments parameter; ``=`` a type
# alias (a module-level assignment).
SINKS: dict[tuple[str, str, str], str] = {
    # Model requests: the instructions and the input, and how tool results are redacted.
    ("crashoverride._agent.run", "AgentJob.__init__", "instructions"): "Redacted",
    ("crashoverride._agent.run", "AgentJob.__init__", "input_text"): "Redacted",
    ("crashoverride._agent.run", "AgentJob.__init__", "redact"): "Callable[[str], Redacted]",
    # Tool results the model sees: redacted, then fenced (the fence takes only redacted text).
    ("crashoverride._security.gate", "_shielded", "redact"): "Callable[[str], Redacted]",
    ("crashoverride._security.gate", "_shielded", "fence"): "Callable[[Redacted], str]",
    ("crashoverride._security.gate", "Audited.redact", "return"): "Redacted",
    ("crashoverride._security.gate", "Audited.fence", "text"): "Redacted",
    # structlog events.
    ("crashoverride._observe.events", "emit", "event"): "Redacted",
    ("crashoverride._observe.events", "emit", "**fields"): "Field",
    ("crashoverride._observe.events", "Field", "="): "Redacted | float | None | Sequence[Redacted]",
    # Notes on the user's exception.
    ("crashoverride._security.notes", "add_note", "note"): "Redacted",
    # The report and its parts (what the record, the ledger, Sentry, OpenTelemetry, the
    # transcript, show and follow-ups are built from).
    **{
        ("crashoverride._observe.report", "RecoveryReport", name): "Redacted"
        for name in REPORT_TEXTS
    },
    **{
        ("crashoverride._observe.report", "SourceChange", name): "Redacted"
        for name in ("path", "diff", "file")
    },
    **{
        ("crashoverride._security.audit", "ToolCallRecord", name): "Redacted"
        for name in ("tool", "code", "result", "approved_by", "source")
    },
    # The record, and the ledger that writes it.
    ("crashoverride._observe.record", "to_record", "report"): "RecoveryReport",
    ("crashoverride._observe.record", "to_record", "return"): "RedactedData",
    ("crashoverride._observe.ledger", "_line", "record"): "RedactedData",
    # OpenTelemetry: attributes, metric labels, statuses.
    ("crashoverride._observe.otel", "Attribute", "="): "Redacted | bool | int | float",
    ("crashoverride._observe.otel", "_attributes", "values"): "Attributes",
    ("crashoverride._observe.otel", "_error", "description"): "Redacted",
    ("crashoverride._observe.otel", "skipped", "handler"): "Redacted",
    ("crashoverride._observe.otel", "skipped", "reason"): "Redacted",
    # Sentry: the event crashoverride sends is what the recovery's redactor returns.
    ("crashoverride._observe.sentry", "Redact", "="): "Callable[[Mapping[str, Any]], RedactedData]",
    ("crashoverride._observe.sentry", "SentryWatch.__init__", "redact"): "Redact",
    ("crashoverride._observe.sentry", "_scrubbed", "record"): "RedactedData",
    ("crashoverride._observe.sentry", "skipped", "handler"): "Redacted",
    # Follow-ups: the job, its payload for another process, its result.
    **{
        ("crashoverride._followups.job", "FollowupJob", name): "Redacted"
        for name in ("id", "objective", "origin", "context")
    },
    ("crashoverride._followups.job", "FollowupJob.to_payload", "return"): "RedactedData",
    ("crashoverride._followups.job", "FollowupResult", "summary"): "Redacted",
    # Cassettes.
    ("crashoverride.testing._cassette", "Cassette.record", "request"): "RedactedData",
    ("crashoverride.testing._cassette", "Cassette.record", "response"): "RedactedData",
    # The transcript and ``crashoverride show``: reports only (their texts are typed above).
    ("crashoverride._observe.transcript", "render", "report"): "RecoveryReport",
    ("crashoverride._cli.show_html", "page", "reports"): "Iterable[RecoveryReport]",
}


# -- (a) the constructors live in redact.py ---------------------------------------------------


def _mentions_type(node: ast.expr) -> bool:
    """``node`` (a cast's target) names one of the redacted types, quoted or not."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return any(name in node.value for name in TYPES)
    named = (n.id if isinstance(n, ast.Name) else getattr(n, "attr", None) for n in ast.walk(node))
    return any(name in TYPES for name in named)


def constructions(source: str, where: str) -> list[str]:
    """Every place ``source`` makes a redacted value without the redactor: a call of
    ``Redacted``/``RedactedData`` (under any alias) or a ``cast`` to one."""
    tree = ast.parse(source)
    aliases = set(TYPES)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == HOME:
            aliases.update(a.asname for a in node.names if a.name in TYPES and a.asname)
        elif isinstance(node, ast.Assign) and getattr(node.value, "id", None) in aliases:
            # ``R = Redacted``
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        made = (isinstance(func, ast.Name) and func.id in aliases) or (
            isinstance(func, ast.Attribute) and func.attr in TYPES
        )
        cast = name == "cast" and bool(node.args) and _mentions_type(node.args[0])
        if made or cast:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_only_redact_py_makes_redacted_values() -> None:
    found = []
    for name, path in modules().items():
        if name != HOME:
            found += constructions(path.read_text(encoding="utf-8"), name)
    assert found == []


def test_redact_py_is_where_they_are_made() -> None:
    # The scanner finds the real constructors (it is not blind to the module that has them).
    home = modules()[HOME].read_text(encoding="utf-8")
    assert len(constructions(home, HOME)) >= 4


def test_the_construction_scanner_catches_planted_violations() -> None:
    planted = textwrap.dedent(
        """
        from typing import cast
        import typing
        from crashoverride._security.redact import Redacted as Clean, RedactedData
        from crashoverride._security import redact

        a = Clean("hunter2")
        b = RedactedData({"k": "v"})
        c = redact.Redacted("x")
        d = cast("Redacted", "x")
        e = typing.cast(redact.RedactedData, {})
        Alias = Clean
        f = Alias("y")
        ok = redact.scanned("fine")  # the redactor's own output: allowed
        """
    )
    found = constructions(planted, "planted")
    assert [line.split(":")[1] for line in found] == ["7", "8", "9", "10", "11", "13"]


# -- notes: only through the typed helper ---------------------------------------------------

# ``BaseException.add_note`` takes any ``str``: it is called by the typed helpers (``add_note``
# takes ``Redacted``; a notes module in ``_security`` would be another such home), or directly
# on a redactor call (the paths that must import nothing: internal failures).
NOTE_HOMES = frozenset({"crashoverride._core.recovery", "crashoverride._security.notes"})
REDACTORS = frozenset({"scanned", "fixed", "redact"})


def _redactor_call(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name in REDACTORS


def direct_notes(source: str, where: str) -> list[str]:
    """Calls of ``<something>.add_note(text)`` whose text is not a redactor's output."""
    return [
        f"{where}:{node.lineno}: {ast.unparse(node)[:80]}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_note"
        and not (len(node.args) == 1 and _redactor_call(node.args[0]))
    ]


def test_notes_are_added_only_by_the_typed_helpers() -> None:
    found = []
    for name, path in modules().items():
        if name not in NOTE_HOMES:
            found += direct_notes(path.read_text(encoding="utf-8"), name)
    assert found == []


def test_the_note_scanner_catches_a_direct_note() -> None:
    planted = textwrap.dedent(
        """
        exc.add_note(f'failed: {problem!r}')
        add_note(exc, scanned('fine'))
        exc.add_note(scanned(f'fine: {problem!r}'))
        exc.add_note(clip(f'not redacted: {problem!r}', 100))
        """
    )
    assert [line.split(":")[1] for line in direct_notes(planted, "planted")] == ["2", "5"]


# -- (b) the sinks take only redacted types ----------------------------------------------------


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level functions, classes, their methods and module-level aliases, by dotted name."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        found[f"{node.name}.{item.name}"] = item
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                found[target.id] = node
    return found


def _annotation(node: ast.AST | None, name: str) -> str | None:
    """The annotation of ``name`` in ``node`` (a parameter, a field, ``return``, ``=``)."""
    if isinstance(node, ast.Assign) and name == "=":
        return ast.unparse(node.value)
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            field = isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            if field and item.target.id == name:
                return ast.unparse(item.annotation)
        return None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    if name == "return":
        return ast.unparse(node.returns) if node.returns is not None else ""
    arguments = node.args
    if name.startswith("**"):
        kwarg = arguments.kwarg
        if kwarg is None or kwarg.arg != name[2:]:
            return None
        return ast.unparse(kwarg.annotation) if kwarg.annotation is not None else ""
    for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        if argument.arg == name:
            return ast.unparse(argument.annotation) if argument.annotation is not None else ""
    return None


def sink_problems(sources: dict[str, str], sinks: dict[tuple[str, str, str], str]) -> list[str]:
    """Where a listed sink is missing or not typed as listed."""
    trees = {name: _definitions(ast.parse(source)) for name, source in sources.items()}
    problems = []
    for (module, where, name), expected in sinks.items():
        definitions = trees.get(module)
        if definitions is None:
            problems.append(f"{module}: no such module")
            continue
        if where not in definitions:
            problems.append(f"{module}.{where}: missing")
            continue
        found = _annotation(definitions[where], name)
        if found is None:
            problems.append(f"{module}.{where}: no {name}")
        elif found != expected:
            problems.append(f"{module}.{where} {name}: {found!r}, expected {expected!r}")
    return problems


def _sources() -> dict[str, str]:
    every = modules()
    return {module: every[module].read_text(encoding="utf-8") for module, _, _ in SINKS}


def test_every_sink_takes_only_redacted_types() -> None:
    assert sink_problems(_sources(), SINKS) == []


def test_the_sink_scanner_catches_a_retyped_or_missing_sink() -> None:
    planted = {
        "m": textwrap.dedent(
            """
            Field = str | int

            def emit(event: str, **fields: Field) -> None: ...

            class Job:
                def __init__(self, *, text: Redacted, data: "dict[str, Any]") -> None: ...
                def payload(self) -> dict[str, Any]: ...

            class Report:
                reason: str
                exception: Redacted
            """
        )
    }
    sinks = {
        ("m", "Field", "="): "Redacted | int",
        ("m", "emit", "event"): "Redacted",
        ("m", "emit", "**fields"): "Field",
        ("m", "Job.__init__", "text"): "Redacted",
        ("m", "Job.__init__", "data"): "RedactedData",
        ("m", "Job.payload", "return"): "RedactedData",
        ("m", "Report", "reason"): "Redacted",
        ("m", "Report", "exception"): "Redacted",
        ("m", "Report", "diagnosis"): "Redacted",
        ("m", "gone", "text"): "Redacted",
        ("n", "emit", "event"): "Redacted",
    }
    problems = sink_problems(planted, sinks)
    assert problems == [
        "m.Field =: 'str | int', expected 'Redacted | int'",
        "m.emit event: 'str', expected 'Redacted'",
        "m.Job.__init__ data: \"'dict[str, Any]'\", expected 'RedactedData'",
        "m.Job.payload return: 'dict[str, Any]', expected 'RedactedData'",
        "m.Report reason: 'str', expected 'Redacted'",
        "m.Report: no diagnosis",
        "m.gone: missing",
        "n: no such module",
    ]
